"""How a container gets this host's GPUs: the three ways Docker can be given them, found on the host.

1. **toolkit**: the NVIDIA Container Toolkit is installed (its hook or CLI), so ``--gpus all`` works.
2. **cdi**: a Container Device Interface spec for ``nvidia.com/gpu`` exists (/etc/cdi, /var/run/cdi:
   ``nvidia-ctk cdi generate`` writes one) and the engine has CDI on, so ``--device nvidia.com/gpu=all``
   works, with no runtime hook.
3. **devices**: neither, but the driver is there: the device nodes (/dev/nvidiactl, /dev/nvidia0..,
   /dev/nvidia-uvm, ...) are passed with ``--device`` and the driver's user-space libraries (found
   through the loader's cache and library path, never a fixed list of paths) are mounted read-only,
   file by file (never a folder: nothing else of the host comes with them), under /usr/local/nvidia,
   where CUDA images look for them (``LD_LIBRARY_PATH`` says so for the others). This is what the toolkit itself does, by hand; it works on a GPU host without the toolkit
   (shared/reference/gpu-containers.md; docs/records/verification.md "GPU in containers").

``imagegen doctor`` reports which of them this host supports; ``imagegen pull --gpus MODE`` uses one
(``auto``: the first that works, in the order above). Only the local engine's host is looked at: with
``DOCKER_HOST`` pointing elsewhere the GPUs of that machine are not known here.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import yaml

from imagegen.yamlio import load_untrusted

TOOLKIT_BINARIES = ("nvidia-container-runtime-hook", "nvidia-ctk", "nvidia-container-cli")
TOOLKIT_FIX = ("install the NVIDIA Container Toolkit on the Docker host (then `nvidia-ctk runtime configure"
               " --runtime=docker` and restart dockerd), or use --gpus none and name the archs with --arch")
CDI_DIRS = ("etc/cdi", "var/run/cdi")
MAX_CDI_SPEC_BYTES = 1 << 20
MAX_CDI_SPECS = 64
# Where a container finds the driver: CUDA images put /usr/local/nvidia/lib64 on LD_LIBRARY_PATH.
CONTAINER_DRIVER_DIR = "/usr/local/nvidia"
# The driver's user-space libraries CUDA programs load (compute only: no GL, video or display ones).
COMPUTE_LIBRARIES = ("libcuda", "libcudadebugger", "libnvidia-ml", "libnvidia-ptxjitcompiler", "libnvidia-nvvm",
                     "libnvidia-gpucomp", "libnvidia-cfg")
_GPU_NODE = re.compile(r"nvidia\d+")
_LDCONFIG_LINE = re.compile(r"^\s*libcuda\.so\.1 \(([^)]*)\) => (/\S+)$")

MODES = ("toolkit", "cdi", "devices")


@dataclass(frozen=True)
class GpuAccess:
    """One way of giving containers the GPUs: the ``docker run`` flags, and what was found."""

    mode: str  # toolkit | cdi | devices | none
    flags: tuple[str, ...] = ()
    detail: str = ""
    fix: str = ""


NONE = GpuAccess("none", (), "the container sees no GPU")


# ------------------------------------------------------------------------------------------------
# 1. the NVIDIA Container Toolkit


def toolkit(which: Callable[[str], str | None] = shutil.which) -> GpuAccess | None:
    found = next((path for b in TOOLKIT_BINARIES if (path := which(b))), None)
    if not found:
        return None
    return GpuAccess("toolkit", ("--gpus", "all"), f"NVIDIA Container Toolkit ({found})")


# ------------------------------------------------------------------------------------------------
# 2. CDI


def cdi_specs(root: Path = Path("/")) -> dict[str, list[str]]:
    """CDI spec file -> the ``nvidia.com/gpu`` device names it declares, from the spec folders under
    ``root`` (bounded: at most MAX_CDI_SPECS files of MAX_CDI_SPEC_BYTES; unreadable ones are skipped)."""
    found: dict[str, list[str]] = {}
    files = []
    for folder in CDI_DIRS:
        try:
            files += sorted(p for p in (root / folder).iterdir() if p.suffix in (".yaml", ".yml", ".json"))
        except OSError:
            continue
    for path in files[:MAX_CDI_SPECS]:
        try:
            if path.is_symlink() or not path.is_file() or path.stat().st_size > MAX_CDI_SPEC_BYTES:
                continue
            doc = load_untrusted(path.read_text(errors="replace"))  # JSON is YAML too
        except (OSError, yaml.YAMLError):
            continue
        if not isinstance(doc, dict) or doc.get("kind") != "nvidia.com/gpu" or not isinstance(doc.get("devices"), list):
            continue
        names = [d["name"] for d in doc["devices"] if isinstance(d, dict) and isinstance(d.get("name"), str)]
        found[str(path)] = names
    return found


def engine_cdi_dirs(docker: Callable[..., subprocess.CompletedProcess | None]) -> list[str] | None:
    """The CDI spec folders the engine reads (``docker info``'s CDISpecDirs: Docker 25+ with CDI on);
    an empty list when CDI is off, None when the engine cannot be asked."""
    proc = docker("info", "--format", "{{json .CDISpecDirs}}")
    if proc is None or proc.returncode != 0:
        return None
    try:
        dirs = json.loads(proc.stdout.strip() or "null")
    except ValueError:
        return None
    return [d for d in dirs if isinstance(d, str)] if isinstance(dirs, list) else []


def cdi(root: Path = Path("/"), engine_dirs: list[str] | None = None) -> GpuAccess | None:
    specs = cdi_specs(root)
    with_all = [path for path, names in specs.items() if "all" in names]
    if not with_all:
        return None
    where = ", ".join(with_all)
    if engine_dirs is not None and not engine_dirs:
        return GpuAccess("cdi", (), f"a CDI spec for nvidia.com/gpu ({where}), but the engine has CDI off",
                         'turn CDI on in /etc/docker/daemon.json ({"features": {"cdi": true}}) and restart dockerd'
                         " (Docker 25+)")
    return GpuAccess("cdi", ("--device", "nvidia.com/gpu=all"), f"CDI spec for nvidia.com/gpu ({where})")


# ------------------------------------------------------------------------------------------------
# 3. device nodes and driver libraries, passed by hand


def _char_device(path: Path) -> bool:
    try:
        return stat.S_ISCHR(path.stat().st_mode)
    except OSError:
        return False


def device_nodes(root: Path = Path("/")) -> list[str]:
    """The NVIDIA device nodes a CUDA program opens, as container paths: the control and UVM nodes and
    every GPU's; [] unless the control node, the UVM node and at least one GPU node are there."""
    dev = root / "dev"
    try:
        gpus = sorted((p.name for p in dev.iterdir() if _GPU_NODE.fullmatch(p.name) and _char_device(p)),
                      key=lambda n: int(n[6:]))
    except OSError:
        return []
    if not gpus or not _char_device(dev / "nvidiactl") or not _char_device(dev / "nvidia-uvm"):
        return []
    optional = [n for n in ("nvidia-uvm-tools", "nvidia-modeset") if _char_device(dev / n)]
    return [f"/dev/{n}" for n in ["nvidiactl", "nvidia-uvm", *optional, *gpus]]


def find_libcuda(root: Path = Path("/"), ldconfig: Callable[[], str] | None = None,
                 library_path: str | None = None) -> Path | None:
    """Where this host's libcuda.so.1 is (a path under ``root``): the loader's cache first (what a
    program on this host would load), then LD_LIBRARY_PATH's folders."""
    listing = ldconfig() if ldconfig else _ldconfig_listing()
    for line in listing.splitlines():
        m = _LDCONFIG_LINE.match(line)
        if m and ("x86-64" in m.group(1) or "AArch64" in m.group(1)):
            candidate = root / m.group(2).lstrip("/")
            if candidate.exists():
                return candidate
    for folder in (library_path if library_path is not None else os.environ.get("LD_LIBRARY_PATH", "")).split(":"):
        if folder.startswith("/") and (root / folder.lstrip("/") / "libcuda.so.1").exists():
            return root / folder.lstrip("/") / "libcuda.so.1"
    return None


def _ldconfig_listing() -> str:
    exe = shutil.which("ldconfig") or ("/sbin/ldconfig" if os.path.exists("/sbin/ldconfig") else None)
    if not exe:
        return ""
    try:
        return subprocess.run([exe, "-p"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def driver_files(libcuda: Path) -> tuple[str, list[tuple[Path, str]]]:
    """The driver version (libcuda's real file's suffix) and each compute library of that version in
    libcuda's folder, with every name it is loaded by (its SONAME links there): (file, name) pairs."""
    real = libcuda.resolve()
    version = real.name.split(".so.", 1)[1] if ".so." in real.name else ""
    folder = libcuda.parent
    pairs: list[tuple[Path, str]] = []
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        return version, pairs
    for entry in entries:
        stem = entry.name.split(".so", 1)[0]
        if stem not in COMPUTE_LIBRARIES or ".so" not in entry.name:
            continue
        target = entry.resolve()
        # The file mounted is that library of the running driver (libnvidia-ml.so.1 -> libnvidia-ml.so.580.x),
        # never another file a link of that name points at.
        if not target.is_file() or not version or target.name != f"{stem}.so.{version}":
            continue
        if entry.name.endswith(".so"):  # the linker's name: programs load the SONAME
            continue
        pairs.append((target, entry.name))
    return version, pairs


@dataclass(frozen=True)
class DriverEdits:
    """What a container needs to use this host's GPUs without the toolkit: the device nodes, the
    driver's files mounted read-only, the environment; (host path, container path) pairs. The
    ``devices`` mode passes them as ``docker run`` flags, :func:`cdi_spec` writes them as a CDI spec
    (which BuildKit's ``RUN --device`` reads)."""

    nodes: tuple[tuple[str, str], ...]
    mounts: tuple[tuple[str, str], ...]
    env: tuple[str, ...]
    detail: str


def driver_edits(root: Path = Path("/"), ldconfig: Callable[[], str] | None = None,
                 library_path: str | None = None) -> DriverEdits | GpuAccess | None:
    """This host's DriverEdits; a GpuAccess without flags saying what is missing when the device nodes
    are there but the driver's libraries are not; None without the device nodes."""
    nodes = device_nodes(root)
    if not nodes:
        return None
    libcuda = find_libcuda(root, ldconfig, library_path)
    if libcuda is None:
        return GpuAccess("devices", (), f"device nodes {', '.join(nodes)} but no libcuda.so.1 (not in the loader's"
                         " cache or LD_LIBRARY_PATH)", "install the NVIDIA driver's libraries, or add their folder"
                         " to LD_LIBRARY_PATH")
    pairs_nodes = tuple((str(root / node.lstrip("/")), node) for node in nodes)
    # File by file, wherever the driver is: a folder is never mounted, so nothing beside the driver's
    # files (a home folder's ~/.ssh when libcuda.so.1 is found in ~/lib) reaches the build steps given
    # the device, which run the package's own build code.
    folder = libcuda.parent
    version, pairs = driver_files(libcuda)
    mounts = [(str(target), f"{CONTAINER_DRIVER_DIR}/lib64/{name}") for target, name in pairs]
    smi = driver_binary(folder.parent / "bin" / "nvidia-smi") or driver_binary(root / "usr/bin/nvidia-smi")
    if smi is not None:
        mounts.append((str(smi), f"{CONTAINER_DRIVER_DIR}/bin/nvidia-smi"))
    how = f"{len({t for t, _ in pairs})} driver {version} libraries from {folder}"
    return DriverEdits(nodes=pairs_nodes, mounts=tuple(mounts), env=(f"LD_LIBRARY_PATH={CONTAINER_DRIVER_DIR}/lib64",),
                       detail=f"{len(nodes)} device nodes and {how}")


def driver_binary(path: Path) -> Path | None:
    """The regular file ``path`` is (its link followed) when that file has the driver binary's name
    (``nvidia-smi``, ``nvidia-smi.<version>``); None otherwise."""
    try:
        real = path.resolve()
        ok = real.is_file() and (real.name == path.name or real.name.startswith(path.name + "."))
    except OSError:
        return None
    return real if ok else None


def devices(root: Path = Path("/"), ldconfig: Callable[[], str] | None = None,
            library_path: str | None = None) -> GpuAccess | None:
    edits = driver_edits(root, ldconfig, library_path)
    if not isinstance(edits, DriverEdits):
        return edits
    flags: list[str] = []
    for host, container in edits.nodes:
        flags += ["--device", container if host == container else f"{host}:{container}"]
    for host, container in edits.mounts:
        flags += ["-v", f"{host}:{container}:ro"]
    for env in edits.env:
        flags += ["-e", env]
    return GpuAccess("devices", tuple(flags), f"{edits.detail}, passed by hand (no toolkit or CDI needed)")


# The CDI device a build step asks for (`RUN --device=nvidia.com/gpu=all`) and the annotation that
# lets BuildKit hand it to builds without the `device` entitlement (which dockerd cannot grant).
CDI_KIND = "nvidia.com/gpu"
CDI_BUILDKIT_AUTOALLOW = "org.mobyproject.buildkit.device.autoallow"


def cdi_spec(edits: DriverEdits, *, name: str = "all") -> dict:
    """A CDI spec (cdiVersion 0.6.0) declaring ``nvidia.com/gpu=<name>`` with ``edits``: what
    ``nvidia-ctk cdi generate`` writes on a host with the toolkit, for a host without it. BuildKit
    reads it for ``RUN --device`` and Docker (CDI on) for ``docker run --device nvidia.com/gpu=all``."""
    return {
        "cdiVersion": "0.6.0",
        "kind": CDI_KIND,
        "annotations": {CDI_BUILDKIT_AUTOALLOW: "true"},
        "devices": [{
            "name": name,
            "containerEdits": {
                "deviceNodes": [{"path": container, "hostPath": host} for host, container in edits.nodes],
            },
        }],
        "containerEdits": {
            "env": list(edits.env),
            "mounts": [{"hostPath": host, "containerPath": container, "options": ["ro", "nosuid", "nodev", "bind"]}
                       for host, container in edits.mounts],
        },
    }


# What `--gpu-check-device` needs of the engine (docs.docker.com/build/building/cdi): BuildKit's CDI
# devices in build steps come with Docker 27 and buildx 0.22.
BUILD_DEVICE_ENGINE = (27, 0)
BUILD_DEVICE_BUILDX = (0, 22)


@dataclass(frozen=True)
class BuildDevice:
    """A CDI device the builder offers build steps (`docker buildx inspect`'s "Devices:")."""

    name: str  # nvidia.com/gpu=all
    auto_allowed: bool  # handed to builds without the `device` entitlement (dockerd cannot grant it)


def build_devices(inspect_text: str) -> list[BuildDevice]:
    """The CDI devices in ``docker buildx inspect``'s output (buildx 0.22+ lists them under
    "Devices:", each a "Name:" line with an "Automatically allowed:" line below it)."""
    devices: list[BuildDevice] = []
    inside = False
    for line in inspect_text.splitlines()[:4096]:
        key, _, value = line.strip().partition(":")
        if not line.startswith(" ") and line.strip():
            inside = key == "Devices"
            continue
        if not inside:
            continue
        if key == "Name" and value.strip():
            devices.append(BuildDevice(value.strip(), False))
        elif key == "Automatically allowed" and devices:
            devices[-1] = BuildDevice(devices[-1].name, value.strip() == "true")
    return devices


def version_tuple(text: str) -> tuple[int, ...]:
    """"28.5.2+dfsg4" -> (28, 5, 2); "v0.29.1" -> (0, 29, 1); () when there is no number."""
    m = re.match(r"v?(\d+)(?:\.(\d+))?(?:\.(\d+))?", text.strip())
    return tuple(int(g) for g in m.groups() if g is not None) if m else ()


# ------------------------------------------------------------------------------------------------


def remote_engine() -> str | None:
    """The engine's host when it is not this one (DOCKER_HOST over tcp/ssh): its GPUs are unknown here."""
    host = os.environ.get("DOCKER_HOST", "")
    return host if host and not host.startswith("unix://") else None


def supported(root: Path = Path("/"), *, which: Callable[[str], str | None] = shutil.which,
              docker: Callable[..., subprocess.CompletedProcess | None] | None = None,
              ldconfig: Callable[[], str] | None = None, library_path: str | None = None) -> list[GpuAccess]:
    """Each way this host can give containers its GPUs, best first; a way found but not usable has no
    flags and says what to fix."""
    found = [toolkit(which),
             cdi(root, engine_cdi_dirs(docker) if docker else None),
             devices(root, ldconfig, library_path)]
    return [a for a in found if a is not None]


def choose(request: str, *, driver_works: Callable[[], bool], say: Callable[[str], None] | None = None,
           **probe) -> GpuAccess:
    """The access ``request`` (auto | all | toolkit | cdi | devices | none) gives on this host.
    ``all`` is ``--gpus all`` as asked (the toolkit's), a named mode is that one or an error line from
    the caller, ``auto`` the first usable one when the driver works, else none."""
    if request == "none":
        return NONE
    if request == "all":
        return GpuAccess("toolkit", ("--gpus", "all"), "--gpus all as asked")
    if request == "auto" and remote_engine():
        if say:
            say(f"the engine is on {remote_engine()}: its GPUs are not known here; the builder runs without them"
                " (--gpus toolkit|cdi|devices to choose)")
        return NONE
    if request == "auto" and not driver_works():
        return NONE
    ways = supported(**probe)
    if request in MODES:
        way = next((a for a in ways if a.mode == request), None)
        if way is None:
            return GpuAccess(request, (), f"--gpus {request}: this host has no {request} way to give containers the GPUs",
                             fix=_fix(request))
        return way
    usable = next((a for a in ways if a.flags), None)
    if usable is None:
        if say:
            say("this host has NVIDIA GPUs, but Docker cannot be given them here (no NVIDIA Container Toolkit, no CDI spec,"
                " no device nodes with the driver's libraries): the builder runs without them and builds for --arch")
        return NONE
    return usable


def _fix(mode: str) -> str:
    return {"toolkit": TOOLKIT_FIX,
            "cdi": "generate a spec: `nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`, and turn CDI on in dockerd",
            "devices": "needs /dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidiaN and libcuda.so.1 on this host"}[mode]
