"""`imagegen reuse WHEEL --torch X.Y.Z`: can a wheel built for one torch be used, as it is, with another?
Asked before rebuilding: a torch release often keeps every symbol an extension needs (a team's
flash-attn, causal-conv1d and mamba-ssm wheels for torch 2.10 kept working on 2.11 and 2.12), and
sometimes drops one (``c10::impl::cow::materialize_cow_storage``, gone in 2.13: `undefined symbol` at
import). Nothing is built; three checks, the later ones where they can run:

1. symbols: each extension's strong undefined dynamic symbols (imagegen.finish.symbols) against what
   the target torch's libraries export (libc10*.so, libtorch*.so, libshm.so, libcaffe2*.so: those the
   extension needs and those they need in turn). Not torch's business, and not judged: a symbol the
   wheel's own libraries define, one whose symbol version names another library (libc, libstdc++,
   libcudart ...), the interpreter's own (``Py*``), a weak one, or one a library on the extension's
   DT_NEEDED list that is not torch's exports (looked for beside the target torch, in its
   environment's nvidia/ packages and in the system's library folders). Judged: a symbol the torch
   the wheel was built for exports (``source``, when given), one of torch's namespaces (``c10``,
   ``at``, ``torch``, ``caffe2``, anywhere in its mangled name), and one that no library the
   extension needs provides while it needs a torch library. Each missing one is said demangled, with
   the library it was expected from. A torch library the extension needs and the target lacks
   (libtorch_cuda.so in a CPU build) is a failure too; so is a wheel whose ``Requires-Dist`` pins
   another torch (pip would replace the torch it is meant for), or one for another Python.
2. import: with ``--python-exe`` (an environment with the target torch), the wheel is unpacked into a
   temporary folder and its modules imported there by a fresh interpreter, under a time limit
   (imagegen.executors.import_test, the build's own import test; nothing installed, no network).
3. gpu_check: the recipe's numerical check (imagegen.finish.check) where that interpreter sees a CUDA
   GPU; otherwise "skipped: no GPU here", never a pass.

The verdict: reusable (exit 0), or not reusable (NotReusableError, exit 11) with the missing symbols,
the failed import or check. ``--into WHEELHOUSE``: a reusable wheel is placed in the target torch's
cell folder (imagegen.wheelhouse.collect.place_reused) with ``reused_from`` in its manifest entry.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from imagegen import untrusted
from imagegen.errors import (BuildError, GpuCheckError, NoGpuError, NotReusableError, RecipeError, Unreadable,
                             UsageError)
from imagegen.finish.symbols import ElfLinks, demangle, read_links
from imagegen.model.catalogue import Catalogue
from imagegen.outputs import shown
from imagegen.untrusted import Deadline

DEFAULT_TIMEOUT = 600.0
MAX_TIMEOUT = 7 * 86400.0
MAX_WHEEL_MEMBERS = 100_000  # torch's own wheel has about 16,000
MAX_EXTENSIONS = 200  # shared objects of a wheel read at most
MAX_METADATA_BYTES = 4 << 20
MAX_SHOWN_MISSING = 20  # missing symbols listed per extension in the text (--json lists every one)

# A torch library: what a torch install's lib/ folder holds of torch's own (not the libgomp it bundles).
TORCH_LIBRARY = re.compile(r"lib(?:torch|c10|shm|caffe2)[A-Za-z0-9_]*\.so(?:\.[0-9]+)*")
# A shared object in a wheel (an extension, a bundled library).
SHARED_OBJECT = re.compile(r"[^/]+\.so(?:\.[0-9]+)*")
# torch's namespaces as a mangled name spells them (a length, then the name): c10, at, torch, caffe2.
TORCH_NAMESPACE = re.compile(r"(?<![0-9])(?:3c10|2at|5torch|6caffe2)(?=[0-9A-Z_a-z])")
# The interpreter's own C API: what the python executable (or libpython) provides.
PYTHON_API = re.compile(r"_?_?Py[A-Za-z0-9_]*")
# imagegen's local version of a wheel: 0.1.0+cu130torch2.11 (CUDA 13.0, torch 2.11).
LOCAL_TORCH = re.compile(r"torch([0-9]+(?:\.[0-9]+){1,2})")
LOCAL_CUDA = re.compile(r"(?:^|[.])(cu[0-9]{2,4})")
# The system's library folders, after the loader's cache.
SYSTEM_DIRS = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu",
               "/usr/lib/aarch64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib", "/usr/local/cuda/lib64")


# --------------------------------------------------------------------------------------------
# A torch install's libraries


@dataclass
class TorchLibs:
    """The libraries of one torch install: torch's own (by file name) and where it lies."""

    version: str | None  # 2.14.1+cu130
    where: str  # what the user gave, for messages
    lib_dir: Path  # its torch/lib
    site: Path | None  # the site-packages it is in, where nvidia/*/lib may hold the CUDA libraries
    python: str | None = None  # 3.11: the interpreter's (--python-exe), or the torch wheel's tag
    _read: dict[str, ElfLinks | None] = field(default_factory=dict)

    @property
    def public(self) -> str | None:
        """The version without its local part (2.14.1)."""
        return public_version(self.version)

    def libraries(self) -> list[str]:
        try:
            return sorted(p.name for p in self.lib_dir.iterdir()
                          if TORCH_LIBRARY.fullmatch(p.name) and p.is_file())
        except OSError:
            return []

    def links(self, name: str, deadline: Deadline, reader: str) -> ElfLinks | None:
        """torch's library ``name`` read (None when this torch has none of that name); read once."""
        if name not in self._read:
            path = self.lib_dir / name
            if not TORCH_LIBRARY.fullmatch(name) or not path.is_file():
                self._read[name] = None
            else:
                try:
                    self._read[name] = read_links(path, deadline=deadline, reader=reader)
                except Unreadable as exc:
                    raise UsageError(f"{shown(path, 200)} (torch {self.version or '?'}): {exc}") from None
        return self._read[name]

    def closure(self, names: list[str], deadline: Deadline, reader: str) -> tuple[dict[str, ElfLinks], list[str]]:
        """The torch libraries among ``names`` and those they need in turn (the loader's scope of an
        extension that needs them), read; and the ones among ``names`` this torch does not have."""
        found: dict[str, ElfLinks] = {}
        lacking = []
        todo = [n for n in names if TORCH_LIBRARY.fullmatch(n)]
        first = set(todo)
        while todo:
            name = todo.pop(0)
            if name in found:
                continue
            links = self.links(name, deadline, reader)
            if links is None:
                if name in first:
                    lacking.append(name)
                continue
            found[name] = links
            todo += [n for n in links.needed if TORCH_LIBRARY.fullmatch(n) and n not in found]
        return found, lacking


def public_version(version: str | None) -> str | None:
    return None if version is None else version.split("+", 1)[0]


_PROBE = r"""
import importlib.util, json, sys, os, sysconfig
out = {"python": "%d.%d" % sys.version_info[:2]}
spec = importlib.util.find_spec("torch")
if spec is not None and spec.submodule_search_locations:
    out["torch_dir"] = list(spec.submodule_search_locations)[0]
    try:
        from importlib.metadata import version
        out["version"] = version("torch")
    except Exception as exc:
        out["version_error"] = str(exc)
print("IMAGEGEN-TORCH " + json.dumps(out))
"""


def torch_of_python(exe: str, *, deadline: Deadline) -> TorchLibs:
    """The torch that interpreter ``exe`` has, found without importing it (no GPU, no seconds of
    ``import torch``). UsageError when it cannot be run or has none."""
    try:
        proc = subprocess.run([exe, "-I", "-c", _PROBE], capture_output=True, text=True, errors="replace",
                              timeout=max(1.0, min(deadline.left(), 120.0)), cwd=tempfile.gettempdir())
    except subprocess.TimeoutExpired:
        raise UsageError(f"--python-exe {shown(exe, 200)} did not say where its torch is within 120 s") from None
    except OSError as exc:
        raise UsageError(f"--python-exe {shown(exe, 200)}: cannot run it ({exc.strerror or exc})") from None
    line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("IMAGEGEN-TORCH ")), None)
    try:
        answer = json.loads(line[len("IMAGEGEN-TORCH "):]) if line else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        last = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}, no output"])[-1]
        raise UsageError(f"--python-exe {shown(exe, 200)}: not a Python that runs here ({last[:200]})")
    if not isinstance(answer.get("torch_dir"), str):
        raise UsageError(f"--python-exe {shown(exe, 200)} has no torch: give the interpreter of an environment with"
                         " the torch to check against (or --torch-wheel, a torch wheel file)")
    torch_dir = Path(answer["torch_dir"])
    lib = torch_dir / "lib"
    if not lib.is_dir():
        raise UsageError(f"--python-exe {shown(exe, 200)}: its torch ({shown(torch_dir, 200)}) has no lib/ folder")
    return TorchLibs(version=answer.get("version") if isinstance(answer.get("version"), str) else None,
                     where=f"--python-exe {exe}", lib_dir=lib, site=torch_dir.parent,
                     python=answer.get("python") if isinstance(answer.get("python"), str) else None)


def torch_of_path(path: Path, work: Path, *, flag: str, deadline: Deadline) -> TorchLibs:
    """A torch wheel file (its torch/lib/ libraries unpacked into ``work``, nothing else), or a folder
    holding an unpacked one (a site-packages, a torch/ folder, or its lib/ folder). UsageError for
    anything else."""
    try:
        is_file, is_dir = path.is_file(), path.is_dir()
    except OSError as exc:
        raise UsageError(f"{flag} {shown(path, 200)}: {exc.strerror or 'not a usable path'}") from None
    if is_file:
        return _torch_wheel(path, work, flag=flag, deadline=deadline)
    if not is_dir:
        raise UsageError(f"{flag} {shown(path, 200)}: no such file or folder (a torch wheel, or a folder of one unpacked)")
    for lib in (path / "torch" / "lib", path / "lib", path):
        if (lib / "libc10.so").is_file():
            torch_dir = lib.parent
            return TorchLibs(version=_unpacked_version(torch_dir), where=f"{flag} {path}", lib_dir=lib,
                             site=torch_dir.parent, python=None)
    raise UsageError(f"{flag} {shown(path, 200)}: no torch/lib/libc10.so in that folder: give a torch wheel file or"
                     " the folder it was unpacked into")


def _unpacked_version(torch_dir: Path) -> str | None:
    """The version of an unpacked torch: its torch/version.py (``__version__ = '2.11.0+cu130'``), else
    the name of its dist-info folder beside it."""
    try:
        text = (torch_dir / "version.py").read_bytes()[:65536].decode("utf-8", "replace")
        found = re.search(r"""^__version__\s*=\s*['"]([0-9][0-9A-Za-z.+_-]{0,60})['"]""", text, re.M)
        if found:
            return found.group(1)
    except OSError:
        pass
    try:
        for entry in torch_dir.parent.iterdir():
            found = re.fullmatch(r"torch-([0-9][0-9A-Za-z.+_]{0,60})\.dist-info", entry.name)
            if found:
                return found.group(1)
    except OSError:
        pass
    return None


def _torch_wheel(wheel: Path, work: Path, *, flag: str, deadline: Deadline) -> TorchLibs:
    try:
        dist, version, _, tags = parse_wheel_filename(wheel.name)
    except InvalidWheelFilename as exc:
        raise UsageError(f"{flag} {shown(wheel.name, 200)}: not a wheel file name ({exc})") from None
    if canonicalize_name(dist) != "torch":
        raise UsageError(f"{flag} {shown(wheel.name, 200)}: a wheel of {dist}, not of torch")
    pythons = sorted({t.interpreter for t in tags if re.fullmatch(r"cp3[0-9]+", t.interpreter)})
    dest = work / f"torch-{version}" / "torch" / "lib"
    dest.mkdir(parents=True, exist_ok=True)
    try:
        with zipfile.ZipFile(wheel) as zf:
            infos = zf.infolist()
            if len(infos) > MAX_WHEEL_MEMBERS:
                raise UsageError(f"{flag} {shown(wheel.name, 200)}: {len(infos)} members, more than the"
                                 f" {MAX_WHEEL_MEMBERS} a torch wheel has: not read")
            wanted = [i for i in infos if re.fullmatch(r"torch/lib/[^/]+\.so(?:\.[0-9]+)*", i.filename)
                      and TORCH_LIBRARY.fullmatch(i.filename.rsplit("/", 1)[1])]
            if not wanted:
                raise UsageError(f"{flag} {shown(wheel.name, 200)}: no torch/lib/libc10.so in it: not a torch wheel"
                                 " for Linux")
            free = shutil.disk_usage(dest).free
            need = sum(i.file_size for i in wanted)
            if need + (64 << 20) > free:
                raise UsageError(f"{flag} {shown(wheel.name, 200)}: its libraries unpack to {need >> 20} MiB and"
                                 f" {shown(work, 200)} has {free >> 20} MiB free")
            for info in wanted:
                if deadline.left() <= 0:
                    raise UsageError(f"{flag} {shown(wheel.name, 200)}: not unpacked within the {deadline.seconds:.0f} s"
                                     " the check may take (--timeout)")
                with open(dest / info.filename.rsplit("/", 1)[1], "wb") as out:
                    untrusted.copy_member(zf, info, out)
    except Unreadable as exc:
        raise UsageError(f"{flag} {shown(wheel.name, 200)}: {exc}") from None
    except (OSError, zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError) as exc:
        raise UsageError(f"{flag} {shown(wheel, 200)}: not a readable wheel ({exc.__class__.__name__})") from None
    python = f"{pythons[0][2]}.{pythons[0][3:]}" if len(pythons) == 1 else None
    return TorchLibs(version=str(version), where=f"{flag} {wheel}", lib_dir=dest, site=None, python=python)


# --------------------------------------------------------------------------------------------
# The wheel to reuse


@dataclass(frozen=True)
class WheelFacts:
    path: Path
    distribution: str
    version: str
    built_for: str | None  # the torch it was built for: its local version's torchX.Y, else its torch pin
    cuda: str | None  # cu130, from its local version
    pythons: tuple[str, ...]  # cp311, or cp39 with abi3 (abi3: any later one), py3
    abi3: bool
    torch_requirement: str | None  # its Requires-Dist on torch, as written (torch (==2.11.0))


def wheel_facts(wheel: Path) -> WheelFacts:
    """What the wheel's name and METADATA say; UsageError for a file that is not a readable wheel."""
    try:
        if not wheel.is_file():
            raise UsageError(f"{shown(wheel, 200)}: no such wheel file")
    except OSError as exc:
        raise UsageError(f"{shown(wheel, 200)}: {exc.strerror or 'not a usable path'}") from None
    try:
        dist, version, _, tags = parse_wheel_filename(wheel.name)
    except InvalidWheelFilename as exc:
        raise UsageError(f"{shown(wheel.name, 200)}: not a valid wheel file name ({exc})") from None
    requirement = None
    try:
        with zipfile.ZipFile(wheel) as zf:
            infos = zf.infolist()
            if len(infos) > MAX_WHEEL_MEMBERS:
                raise UsageError(f"{shown(wheel.name, 200)}: {len(infos)} members, more than the {MAX_WHEEL_MEMBERS}"
                                 " read here")
            untrusted.validate_zip(zf)
            meta = [i for i in infos if re.fullmatch(r"[^/]+\.dist-info/METADATA", i.filename)]
            if len(meta) == 1:
                text = untrusted.read_member(zf, meta[0], limit=MAX_METADATA_BYTES).decode("utf-8", "replace")
                for line in text.splitlines():
                    if not line.strip():
                        break  # the headers end at the first empty line
                    if line.lower().startswith("requires-dist:"):
                        value = line.split(":", 1)[1].strip()
                        try:
                            req = Requirement(value)
                        except InvalidRequirement:
                            continue
                        if canonicalize_name(req.name) == "torch" and not (req.marker and "extra" in str(req.marker)):
                            requirement = value
    except Unreadable as exc:
        raise UsageError(f"{shown(wheel.name, 200)}: {exc}: not read") from None
    except (OSError, zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError) as exc:
        raise UsageError(f"{shown(wheel, 200)}: not a readable wheel ({exc.__class__.__name__}: {str(exc)[:100]})") from None
    local = version.local or ""
    found = LOCAL_TORCH.search(local)
    built_for = found.group(1) if found else None
    if built_for is None and requirement:
        pin = re.search(r"==\s*([0-9][0-9A-Za-z.+]*)", requirement)
        built_for = pin.group(1) if pin else None
    cuda = LOCAL_CUDA.search(local)
    return WheelFacts(path=wheel, distribution=str(dist), version=str(version), built_for=built_for,
                      cuda=cuda.group(1) if cuda else None,
                      pythons=tuple(sorted({t.interpreter for t in tags})), abi3=any(t.abi == "abi3" for t in tags),
                      torch_requirement=requirement)


def python_fits(facts: WheelFacts, python: str | None) -> bool:
    """Whether an interpreter of version ``python`` (3.11) can load the wheel's extensions (unknown: yes)."""
    if python is None:
        return True
    want = "cp" + python.replace(".", "")
    minor = int(python.split(".")[1]) if "." in python else 0
    for interp in facts.pythons:
        if interp == want or interp in ("py3", f"py{python.split('.')[0]}") or interp == "py" + python.replace(".", ""):
            return True
        if facts.abi3 and re.fullmatch(r"cp3[0-9]+", interp) and int(interp[3:]) <= minor:
            return True
    return False


# --------------------------------------------------------------------------------------------
# The symbol check


@dataclass
class Missing:
    symbol: str  # as linked (mangled)
    demangled: str
    expected_from: str  # libc10.so (torch 2.11.0), or the torch libraries the extension needs

    def as_dict(self) -> dict:
        return {"symbol": self.symbol, "demangled": self.demangled, "expected_from": self.expected_from}


@dataclass
class ExtensionReport:
    name: str  # its path in the wheel
    needs: list[str]  # the torch libraries it needs (DT_NEEDED)
    judged: int = 0  # symbols that torch's libraries had to provide
    missing: list[Missing] = field(default_factory=list)
    lacking_libraries: list[str] = field(default_factory=list)  # torch libraries it needs that the target has not
    unknown: list[str] = field(default_factory=list)  # libraries it needs that were not found here (not judged)
    unreadable: str | None = None  # why it could not be read as an ELF shared object

    @property
    def ok(self) -> bool:
        return not self.missing and not self.lacking_libraries and self.unreadable is None

    def as_dict(self) -> dict:
        return {"name": self.name, "ok": self.ok, "torch_libraries": self.needs, "judged": self.judged,
                "missing": [m.as_dict() for m in self.missing], "lacking_libraries": self.lacking_libraries,
                "not_found_here": self.unknown, "unreadable": self.unreadable}


class SystemLibs:
    """The libraries that are not torch's, found as the loader would find them for the target: the
    wheel's own, the target torch's lib/ folder (libgomp it bundles), its environment's nvidia/*/lib,
    the loader's cache, the system's library folders; each read once."""

    def __init__(self, target: TorchLibs, own: dict[str, Path], deadline: Deadline, reader: str) -> None:
        self.target, self.own, self.deadline, self.reader = target, own, deadline, reader
        self._read: dict[str, ElfLinks | None] = {}
        self._cache: dict[str, str] | None = None

    def _ldconfig(self) -> dict[str, str]:
        if self._cache is None:
            self._cache = {}
            exe = shutil.which("ldconfig") or ("/sbin/ldconfig" if os.path.exists("/sbin/ldconfig") else None)
            if exe:
                try:
                    out = subprocess.run([exe, "-p"], capture_output=True, text=True, errors="replace",
                                         timeout=max(1.0, min(self.deadline.left(), 30.0))).stdout
                except (OSError, subprocess.TimeoutExpired):
                    out = ""
                machine = "x86-64" if os.uname().machine == "x86_64" else "AArch64"
                for line in out.splitlines()[:100_000]:
                    found = re.match(r"\s+(\S+) \(([^)]*)\) => (\S+)", line)
                    if found and machine in found.group(2) and found.group(1) not in self._cache:
                        self._cache[found.group(1)] = found.group(3)
        return self._cache

    def find(self, name: str) -> Path | None:
        if "/" in name:
            return None
        if name in self.own:
            return self.own[name]
        places = [self.target.lib_dir / name]
        if self.target.site is not None:
            try:
                places += sorted(self.target.site.glob(f"nvidia/*/lib/{name}"))
            except OSError:
                pass
        cached = self._ldconfig().get(name)
        if cached:
            places.append(Path(cached))
        places += [Path(d) / name for d in SYSTEM_DIRS]
        return next((p for p in places if p.is_file()), None)

    def links(self, name: str) -> ElfLinks | None:
        """Library ``name`` read, or None when it is not found here (or cannot be read)."""
        if name not in self._read:
            path = self.find(name)
            try:
                self._read[name] = read_links(path, deadline=self.deadline, reader=self.reader) if path else None
            except Unreadable:
                self._read[name] = None
        return self._read[name]


def _own_libraries(site: Path) -> dict[str, Path]:
    """The wheel's shared objects by file name (auditwheel's libcudart-<hash>.so.13 as its extensions name it)."""
    found = {}
    for path in sorted(site.rglob("*")):
        if SHARED_OBJECT.fullmatch(path.name) and path.is_file() and not path.is_symlink():
            found.setdefault(path.name, path)
    return found


# Without the torch it was built with: the library a missing symbol most likely came from, by its namespace.
_NAMESPACE_LIBRARY = (("c10::cuda::", "libc10_cuda.so"), ("c10::", "libc10.so"), ("at::cuda::", "libtorch_cuda.so"),
                      ("THP", "libtorch_python.so"), ("torch::autograd::python", "libtorch_python.so"),
                      ("torch::python::", "libtorch_python.so"), ("pybind11::", "libtorch_python.so"),
                      ("torch::", "libtorch_cpu.so"), ("at::", "libtorch_cpu.so"))


def _by_namespace(demangled: str, needed: list[str]) -> str:
    """``libc10_cuda.so, by its namespace`` where the extension needs that library; else the torch
    libraries it needs."""
    name = re.sub(r"^(?:typeinfo for |typeinfo name for |vtable for |TLS init function for |TLS wrapper function for"
                  r" |guard variable for |non-virtual thunk to )", "", demangled)
    name = re.sub(r"^(?:[A-Za-z_][\w:<>, *&]*? )?(?=[A-Za-z_][\w]*::)", "", name, count=1)  # a return type
    for prefix, library in _NAMESPACE_LIBRARY:
        if name.startswith(prefix) and (library in needed or not needed):
            return f"{library}, by its namespace"
    return ", ".join(needed) or "torch"


def check_symbols(site: Path, extensions: list[Path], target: TorchLibs, source: TorchLibs | None, *,
                  deadline: Deadline, reader: str = "auto") -> list[ExtensionReport]:
    """Each extension under ``site`` (the unpacked wheel) judged against ``target``'s libraries; see
    the module's docstring for what is judged."""
    own_paths = _own_libraries(site)
    own_links: dict[Path, ElfLinks] = {}
    unread: list[ExtensionReport] = []
    for path in own_paths.values():
        try:
            own_links[path] = read_links(path, deadline=deadline, reader=reader)
        except Unreadable as exc:
            if "not read within" in str(exc):
                raise
            unread.append(ExtensionReport(name=path.relative_to(site).as_posix(), needs=[], unreadable=str(exc)[:200]))
    own_exports = set().union(*(links.exports for links in own_links.values())) if own_links else set()
    system = SystemLibs(target, own_paths, deadline, reader)
    reports = list(unread)
    for ext in extensions:
        links = own_links.get(ext)
        if links is None:
            continue
        torch_needed = [n for n in links.needed if TORCH_LIBRARY.fullmatch(n)]
        report = ExtensionReport(name=ext.relative_to(site).as_posix(), needs=torch_needed)
        provided, lacking = target.closure(torch_needed, deadline, reader)
        report.lacking_libraries = lacking
        target_exports = set().union(*(lib.exports for lib in provided.values())) if provided else set()
        source_libs: dict[str, ElfLinks] = {}
        if source is not None:
            source_libs, _ = source.closure(torch_needed, deadline, reader)
        # What the libraries it needs that are not torch's provide (read only for a symbol that needs them).
        others = [n for n in links.needed if not TORCH_LIBRARY.fullmatch(n) and n not in own_paths]
        other_exports: set[str] | None = None
        candidates = []
        for symbol, version in sorted(links.undefined.items()):
            if symbol in own_exports or PYTHON_API.fullmatch(symbol):
                continue
            if version is not None and not TORCH_LIBRARY.fullmatch(version):
                continue  # versioned: libc, libstdc++, libcudart ... name their own versions; torch's do not
            candidates.append(symbol)
        if any(not TORCH_NAMESPACE.search(c) for c in candidates):
            other_exports = set()
            for name in others:
                lib = system.links(name)
                if lib is None:
                    report.unknown.append(name)
                else:
                    other_exports |= lib.exports
        judged: list[str] = []
        for symbol in candidates:
            if TORCH_NAMESPACE.search(symbol):
                judged.append(symbol)  # c10::, at::, torch::, caffe2:: anywhere in it: only torch provides that
            elif other_exports is not None and symbol in other_exports:
                continue  # libstdc++'s std::string, which torch 2.11's libraries happened to export too
            elif source is not None and any(symbol in lib.exports for lib in source_libs.values()):
                judged.append(symbol)
            elif symbol in target_exports:
                judged.append(symbol)
            elif torch_needed and not report.unknown:
                judged.append(symbol)  # nothing it needs provides it, and it needs torch
        report.judged = len(judged)
        missing = [s for s in judged if s not in target_exports]
        names = demangle(missing, deadline=deadline) if missing else {}
        for symbol in missing:
            origin = next((f"{name} (torch {source.public or '?'})" for name, lib in source_libs.items()
                           if symbol in lib.exports), None) if source is not None else None
            demangled = names.get(symbol, symbol)
            report.missing.append(Missing(symbol=symbol, demangled=demangled,
                                          expected_from=origin or _by_namespace(demangled, torch_needed)))
        reports.append(report)
    return reports


# --------------------------------------------------------------------------------------------
# The verdict


@dataclass
class ReuseResult:
    wheel: str
    distribution: str
    built_for: str | None
    target: str | None  # the target torch's version (2.14.1+cu130)
    target_where: str
    source: str | None  # the built-for torch the symbols were judged by, when given
    extensions: list[ExtensionReport]
    problems: list[str]  # why it is not reusable, one line each
    symbols: str = "ok"  # ok | failed
    imports: dict | None = None  # module -> ok / skipped: ...
    import_status: str = "skipped"  # ok | skipped | failed
    import_note: str = "no --python-exe: nothing imported"
    gpu_check: str = "skipped"  # ok | skipped | failed
    gpu_note: str = "no --python-exe: no GPU check"
    gpu_output: list[str] = field(default_factory=list)
    placed: str | None = None  # --into: where the wheel went

    @property
    def reusable(self) -> bool:
        return not self.problems

    def reused_from(self) -> dict:
        """The manifest entry's record of it (--into)."""
        return {"torch": self.built_for, "checked_against": public_version(self.target), "symbols": self.symbols,
                "import": self.import_status, "gpu_check": self.gpu_check}

    def as_dict(self) -> dict:
        return {"wheel": self.wheel, "distribution": self.distribution, "reusable": self.reusable,
                "built_for": self.built_for, "target": self.target, "target_from": self.target_where,
                "source": self.source, "symbols": self.symbols,
                "extensions": [e.as_dict() for e in self.extensions],
                "import": {"status": self.import_status, "note": self.import_note, "modules": self.imports},
                "gpu_check": {"status": self.gpu_check, "note": self.gpu_note, "output": self.gpu_output},
                "problems": self.problems, "placed": self.placed}

    def lines(self) -> list[str]:
        """The report as text, a line each."""
        against = f"torch {self.target or '?'}"
        out = [f"{self.wheel}: built for torch {self.built_for or '(unknown)'}, checked against {against}"
               f" ({self.target_where})"]
        for ext in self.extensions:
            head = f"  symbols {ext.name}: "
            if ext.unreadable:
                out.append(head + f"not read ({ext.unreadable})")
                continue
            if ext.ok:
                out.append(head + f"ok ({ext.judged} symbols torch's libraries provide"
                           + (f"; {', '.join(ext.unknown)} not found here" if ext.unknown else "") + ")")
                continue
            out.append(head + f"{len(ext.missing)} missing of {ext.judged}"
                       + (f"; needs {', '.join(ext.lacking_libraries)}, which this torch does not have"
                          if ext.lacking_libraries else ""))
            for m in ext.missing[:MAX_SHOWN_MISSING]:
                out.append(f"    missing {m.demangled} (expected from {m.expected_from})")
            if len(ext.missing) > MAX_SHOWN_MISSING:
                out.append(f"    ... and {len(ext.missing) - MAX_SHOWN_MISSING} more (--json lists every one)")
        if not self.extensions:
            out.append("  symbols: the wheel has no extension that needs torch's libraries")
        out.append(f"  import: {self.import_status}" + (f" ({self.import_note})" if self.import_note else ""))
        for module, got in (self.imports or {}).items():
            out.append(f"    import {module}: {got}")
        for line in self.gpu_output:
            out.append(f"    gpu_check: {line}")
        out.append(f"  gpu_check: {self.gpu_check}" + (f" ({self.gpu_note})" if self.gpu_note else ""))
        for p in self.problems:
            out.append(f"  problem: {p}")
        verdict = "reusable" if self.reusable else "NOT reusable"
        out.append(f"{verdict}: {self.wheel} with torch {public_version(self.target) or '?'}"
                   + (f"; placed in {self.placed}" if self.placed else ""))
        return out


def _short(name: str, limit: int = 100) -> str:
    """A demangled name for a one-line message: its argument list cut where it is long."""
    return name if len(name) <= limit else name[: limit - 3] + "..."


def _extensions(site: Path) -> list[Path]:
    """The wheel's shared objects that need a torch library (its extensions, and a library of its own
    linked against torch); the others (a bundled libjpeg) are read only for what they export."""
    return [p for p in _own_libraries(site).values()]


def check_reuse(wheel: Path, *, torch: str | None, python_exe: str | None = None, torch_wheel: Path | None = None,
                source_torch: Path | None = None, catalogue: Catalogue | None = None, recipe: str | None = None,
                timeout: float = DEFAULT_TIMEOUT, reader: str = "auto", gpu: bool = True) -> ReuseResult:
    """Can ``wheel`` be used with the torch of ``python_exe`` (an environment) or ``torch_wheel`` (a torch
    wheel, or a folder of one unpacked)? ``torch``: the version that torch must be (X.Y or X.Y.Z; None:
    whatever it is). ``source_torch``: the torch the wheel was built with (a wheel or folder), whose
    exports say which symbols torch must provide. The result says reusable or why not; bad input is a
    UsageError (exit 2)."""
    if not 0 < timeout <= MAX_TIMEOUT:
        raise UsageError(f"--timeout must be a positive number of seconds, at most {MAX_TIMEOUT:.0f}")
    if python_exe is None and torch_wheel is None:
        raise UsageError("give the torch to check against: --python-exe (an environment's interpreter with that torch)"
                         " or --torch-wheel (a torch wheel file, or a folder of one unpacked)")
    if python_exe is not None and torch_wheel is not None:
        raise UsageError("give --python-exe or --torch-wheel, not both: one torch to check against")
    if torch is not None and not re.fullmatch(r"[0-9]+\.[0-9]+(?:\.[0-9]+)?", torch):
        raise UsageError(f"--torch {shown(torch, 60)}: a torch release, X.Y or X.Y.Z (2.14.1)")
    facts = wheel_facts(wheel)
    deadline = Deadline(timeout)
    with tempfile.TemporaryDirectory(prefix="imagegen-reuse-") as tmp:
        work = Path(tmp)
        target = torch_of_python(python_exe, deadline=deadline) if python_exe else \
            torch_of_path(torch_wheel, work / "target", flag="--torch-wheel", deadline=deadline)
        if torch is not None and not _same_release(torch, target.public):
            raise UsageError(f"--torch {torch}, but {target.where} has torch {target.version or '(unknown version)'}:"
                             " give the torch of that release")
        source = torch_of_path(source_torch, work / "source", flag="--built-with", deadline=deadline) \
            if source_torch is not None else None
        built_for = facts.built_for or (source.public if source else None)
        site = work / "wheel"
        try:
            untrusted.extract_zip(wheel, site)
        except Unreadable as exc:
            raise UsageError(f"{shown(wheel.name, 200)}: not unpacked: {exc}") from None
        shared = _extensions(site)
        if len(shared) > MAX_EXTENSIONS:
            raise UsageError(f"{shown(wheel.name, 200)}: {len(shared)} shared objects, more than the {MAX_EXTENSIONS}"
                             " read here")
        try:
            reports = check_symbols(site, shared, target, source, deadline=deadline, reader=reader)
        except Unreadable as exc:
            raise UsageError(f"{shown(wheel.name, 200)}: {exc}") from None
        reports = [r for r in reports if r.needs or r.missing or r.unreadable]
        result = ReuseResult(wheel=wheel.name, distribution=facts.distribution, built_for=built_for,
                             target=target.version, target_where=target.where,
                             source=source.version if source else None, extensions=reports, problems=[])
        _requirements(facts, target, result)
        for ext in reports:
            if ext.unreadable:
                result.problems.append(f"{ext.name} cannot be read: {ext.unreadable}")
            if ext.lacking_libraries:
                result.problems.append(f"{ext.name} needs {', '.join(ext.lacking_libraries)}, which torch"
                                       f" {target.version or '?'} does not have")
            if ext.missing:
                result.problems.append(f"{ext.name}: {len(ext.missing)} symbol(s) torch {target.public or '?'} does"
                                       f" not export: {', '.join(_short(m.demangled) for m in ext.missing[:3])}"
                                       + (" ..." if len(ext.missing) > 3 else ""))
        if any(not e.ok for e in reports):
            result.symbols = "failed"
        if python_exe is not None:
            _import_and_gpu(wheel, python_exe, result, python_ok=python_fits(facts, target.python),
                            catalogue=catalogue, recipe=recipe, deadline=deadline, gpu=gpu)
    return result


def _same_release(asked: str, found: str | None) -> bool:
    """--torch 2.14 or 2.14.1 against the install's 2.14.1."""
    if found is None:
        return False
    try:
        a, f = Version(asked).release, Version(found).release
    except InvalidVersion:
        return False
    return f[:len(a)] == a


def _requirements(facts: WheelFacts, target: TorchLibs, result: ReuseResult) -> None:
    """What pip would say: a Requires-Dist on torch the target's version does not satisfy, a Python tag
    the target's interpreter cannot load."""
    if facts.torch_requirement and target.public:
        try:
            req = Requirement(facts.torch_requirement)
            fits = req.specifier.contains(Version(target.public), prereleases=True)
        except (InvalidRequirement, InvalidVersion):
            fits = True
        if not fits:
            result.problems.append(f"its METADATA requires {facts.torch_requirement}: pip would replace torch"
                                   f" {target.public} to install it (pip install --no-deps would not)")
    if not python_fits(facts, target.python):
        result.problems.append(f"it is a wheel for {', '.join(facts.pythons)}, and the torch checked against is for"
                               f" Python {target.python}")


def _import_and_gpu(wheel: Path, exe: str, result: ReuseResult, *, python_ok: bool, catalogue: Catalogue | None,
                    recipe: str | None, deadline: Deadline, gpu: bool) -> None:
    """The import (and, where a GPU is here, the recipe's gpu_check) with ``exe``'s torch."""
    from imagegen.executors.import_test import Importer, wheel_modules
    from imagegen.finish import check

    if not python_ok:
        result.import_note = "the wheel is for another Python: not imported"
        result.gpu_note = "not run: the wheel is for another Python"
        return
    modules = wheel_modules(wheel)
    with tempfile.TemporaryDirectory(prefix="imagegen-reuse-cwd-") as empty:
        try:
            probe = check.probe_gpu(exe, cwd=Path(empty), timeout=max(1.0, min(deadline.left(), 300.0)))
        except NoGpuError as exc:
            probe = check.GpuInfo(python=exe, torch=None, device=None, error=str(exc))
    if probe.torch is None:
        raise UsageError(f"--python-exe {shown(exe, 200)}: its torch does not import ({(probe.error or '')[:200]}):"
                         " nothing can be imported with it")
    try:
        importer = Importer(exe)
    except OSError as exc:
        raise UsageError(f"--python-exe {shown(exe, 200)}: cannot run it ({exc.strerror or exc})") from None
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        importer.proc.kill()

    timer = threading.Timer(max(deadline.left(), 1.0), expire)
    timer.start()
    try:
        with importer:
            raw = importer.run(wheel, modules)
            # A library that torch.ops.load_library loads (torchvision's _C.so) is no Python module: it is
            # loaded as torch loads it, every symbol bound now, with the same torch imported first.
            libraries = {m: _module_file(importer.tmp / "site", m) for m, got in raw.items() if NOT_A_MODULE in got}
            loaded = _load_libraries(exe, {m: p for m, p in libraries.items() if p}, cwd=importer.tmp,
                                     deadline=deadline) if libraries else {}
    except BuildError as exc:
        why = f"not finished within the {deadline.seconds:.0f} s the check may take" if expired.is_set() else str(exc)
        result.import_status, result.import_note = "failed", why[:500]
        result.problems.append(f"import with torch {probe.torch}: {why[:400]}")
        raw = None
    finally:
        timer.cancel()
    if raw is not None:
        result.imports, failed = {}, []
        for module, got in raw.items():
            if module in libraries:
                got = loaded.get(module, "not found in the unpacked wheel")
                shown_as = "ok (a library torch loads, not a Python module: loaded as torch.ops.load_library does)" \
                    if got == "ok" else got
            else:
                shown_as = got
            if got == "ok":
                result.imports[module] = shown_as
            elif re.search(r"libcuda\.so|CUDA driver|NVIDIA driver", got):
                result.imports[module] = f"skipped: needs a GPU driver ({got[:160]})"
            else:
                result.imports[module] = shown_as[:300]
                failed.append(module)
        skipped = [m for m, got in result.imports.items() if got.startswith("skipped")]
        if failed:
            first = failed[0]
            result.import_status = "failed"
            result.import_note = f"`import {first}` failed: {result.imports[first][:400]}"
            result.problems.append(f"import with torch {probe.torch}: {result.import_note}")
        else:
            result.import_status = "skipped" if skipped else "ok"
            result.import_note = (f"{len(skipped)} of {len(modules)} modules need a GPU driver" if skipped
                                  else f"{len(modules)} modules imported with torch {probe.torch}")
    if not gpu:
        result.gpu_note = "not asked (--no-gpu-check)"
        return
    if result.import_status == "failed":
        result.gpu_note = "not run: the import failed"
        return
    if not probe.usable:
        result.gpu_note = f"no GPU here ({(probe.error or 'torch sees no CUDA GPU')[:160]}): run it on the GPU machine"
        return
    if catalogue is None:
        result.gpu_note = "no recipes to read a gpu_check from"
        return
    try:
        got = check.check_wheel(wheel, catalogue, recipe=recipe, python_exe=exe,
                                timeout=max(1.0, min(deadline.left(), MAX_TIMEOUT)), how="--recipe")
    except RecipeError as exc:
        result.gpu_note = f"no gpu_check to run ({str(exc)[:200]})"
        return
    except NoGpuError as exc:
        result.gpu_note = f"no GPU here ({str(exc)[:200]})"
        return
    except GpuCheckError as exc:
        result.gpu_check, result.gpu_note = "failed", str(exc)[:400]
        result.problems.append(f"gpu_check: {str(exc)[:400]}")
        return
    result.gpu_check, result.gpu_note = "ok", f"passed on {got.device} in {got.seconds:.1f} s"
    result.gpu_output = got.output[:20]


# What Python says of a shared object that is no extension module (a library torch.ops.load_library loads).
NOT_A_MODULE = "dynamic module does not define module export function"

_LOADER = r"""
import ctypes, json, sys
try:
    import torch
except ImportError:
    pass
out = {}
for module, path in json.loads(sys.argv[1]).items():
    try:
        ctypes.CDLL(path)
        out[module] = "ok"
    except OSError as exc:
        out[module] = "OSError: %s" % exc
print("IMAGEGEN-LOADED " + json.dumps(out))
"""


def _module_file(site: Path, module: str) -> str | None:
    """The shared object of extension module ``module`` in the unpacked wheel (torchvision._C -> .../_C.so)."""
    *parts, name = module.split(".")
    folder = site.joinpath(*parts)
    found = sorted(folder.glob(f"{name}.so")) + sorted(folder.glob(f"{name}.*.so"))
    return str(found[0]) if found else None


def _load_libraries(exe: str, paths: dict[str, str], *, cwd: Path, deadline: Deadline) -> dict[str, str]:
    """Each library loaded by ``exe`` after its torch, as torch.ops.load_library loads one (ctypes: every
    symbol bound at once): module -> "ok" or the loader's error."""
    from imagegen.finish import check

    if not paths:
        return {}
    rc, out, err = check._run([exe, "-c", _LOADER, json.dumps(paths)], cwd=cwd,
                              timeout=max(1.0, min(deadline.left(), 300.0)))
    line = next((ln for ln in reversed(out.splitlines()) if ln.startswith("IMAGEGEN-LOADED ")), None)
    try:
        return json.loads(line[len("IMAGEGEN-LOADED "):]) if line else {}
    except ValueError:
        return {}


def require_reusable(result: ReuseResult) -> None:
    if not result.reusable:
        raise NotReusableError(f"{result.wheel} is not reusable with torch {public_version(result.target) or '?'}: "
                               + "; ".join(result.problems))


# --------------------------------------------------------------------------------------------
# Into a wheelhouse


def place_reused(result: ReuseResult, wheel: Path, out: Path, *, catalogue: Catalogue | None,
                 layout: str | None = None) -> Path:
    """Put the reusable ``wheel`` into the wheelhouse ``out``, in the cell folder of the torch it was
    checked against, its manifest entry marked ``reused_from`` (imagegen.wheelhouse.collect.place_reused).
    The entry starts from the one its own folder's manifest has for it (recipe, source, archs, verify),
    where there is one with its sha256; else from what its name says."""
    from imagegen.model.layout import DEFAULT_LAYOUT
    from imagegen.wheelhouse import collect
    from imagegen.wheelhouse.manifest import sha256

    if not result.reusable:
        raise NotReusableError(f"{result.wheel} is not reusable: not placed in {shown(out, 200)}")
    facts = wheel_facts(wheel)
    digest = sha256(wheel)
    base = _own_entry(wheel, digest)
    recipe_name, short = facts.distribution, facts.distribution
    if catalogue is not None:
        want = canonicalize_name(facts.distribution)
        found = [r for r in catalogue.recipes.values() if canonicalize_name(r.distribution) == want]
        if len(found) == 1:
            recipe_name = found[0].name
            short = min((found[0].name, *found[0].aliases), key=len)
    recipe_name = base.get("recipe") if isinstance(base.get("recipe"), str) else recipe_name
    cuda = require_placeable(wheel, facts, base)
    python = base.get("python") if isinstance(base.get("python"), str) else _python_of(facts)
    version = base.get("version") if isinstance(base.get("version"), str) else public_version(facts.version)
    target = public_version(result.target) or "?"
    series = ".".join(target.split(".")[:2])
    fields = {"package": recipe_name, "short": short, "version": version, "torch": series, "cuda": cuda,
              "python": python or "any", "py": (python or "any").replace(".", "")}
    folder = out / (layout or DEFAULT_LAYOUT).format(**fields)
    ver = "".join(c if c.isalnum() else "_" for c in str(version))
    cell = re.sub(r"[^A-Za-z0-9_-]", "_", f"{short}-{ver}-torch{series.replace('.', '_')}-{cuda}"
                  f"-py{(python or 'any').replace('.', '')}")[:200]
    if not base:
        from imagegen.finish.verify import verify_wheel
        base = {"recipe": recipe_name, "version": version, "cuda": cuda, "python": python,
                "verify": verify_wheel(wheel, None).as_dict()}
    entry = {**{k: v for k, v in base.items() if k not in ("log", "inputs", "gpu_check", "smoke")},
             "inputs": f"reused:{digest}", "torch": target, "reused_from": result.reused_from()}
    dest = collect.place_reused(folder, wheel, cell, entry)
    result.placed = str(dest)
    return dest


def _own_entry(wheel: Path, digest: str) -> dict:
    """The manifest entry of ``wheel`` in its own folder (a wheelhouse's cell folder), with its sha256; else {}."""
    from imagegen.wheelhouse.manifest import read_manifest

    for entry in read_manifest(wheel.parent)["cells"].values():
        if isinstance(entry, dict) and entry.get("wheel") == wheel.name and entry.get("sha256") == digest:
            return dict(entry)
    return {}


def require_placeable(wheel: Path, facts: WheelFacts | None = None, base: dict | None = None) -> str:
    """The CUDA of the wheelhouse folder ``wheel`` would go to (--into), or a UsageError saying why it
    cannot be told: asked before the check runs."""
    from imagegen.wheelhouse.manifest import sha256

    facts = facts or wheel_facts(wheel)
    base = _own_entry(wheel, sha256(wheel)) if base is None else base
    cuda = base.get("cuda") if isinstance(base.get("cuda"), str) else facts.cuda
    if cuda is None or not re.fullmatch(r"cu[0-9]{2,4}", cuda):
        raise UsageError(f"--into: {shown(wheel.name, 200)} does not say its CUDA (no cuXYZ in its local version, no"
                         " manifest entry beside it): cannot tell which wheelhouse folder it goes to")
    return cuda


def _python_of(facts: WheelFacts) -> str | None:
    cp = [p for p in facts.pythons if re.fullmatch(r"cp3[0-9]+", p)]
    return f"3.{cp[0][3:]}" if len(cp) == 1 else None


__all__ = ["ReuseResult", "check_reuse", "check_symbols", "place_reused", "require_reusable", "wheel_facts"]
