"""`imagegen doctor`: what this machine can build, and what to fix first.

Diagnoses, each with its fix: Python; torch and its CUDA; nvcc and CUDA_HOME, and that nvcc's major
equals torch's CUDA major; the GPUs and their compute capability (what --arch to ask for); the CMake a
native build would run (the venv's first) against the catalogue's CMake builds' requirement; the
Docker engine and buildx, and whether a bake matrix and a local export really work here (a tiny
bake run, no registry needed, said on stderr before it runs; --no-build skips it); how containers can be given the GPUs (toolkit, CDI, or the device
nodes and driver libraries by hand); disk; RAM, cores and the job settings builds would use.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

from imagegen.errors import EngineError
from imagegen.executors import host as host_toolchain
from imagegen.model import jobs
from imagegen.shipped.builder import imagegen_rules as rules

OK, WARN, FAIL = "ok", "warn", "FAIL"


@dataclass
class Diagnosis:
    name: str
    status: str
    detail: str
    fix: str = ""


@dataclass
class Report:
    diagnoses: list[Diagnosis] = field(default_factory=list)

    def add(self, name: str, status: str, detail: str, fix: str = "") -> None:
        self.diagnoses.append(Diagnosis(name, status, detail, fix))

    @property
    def failed(self) -> list[Diagnosis]:
        return [c for c in self.diagnoses if c.status == FAIL]

    def text(self) -> str:
        width = max(len(c.name) for c in self.diagnoses)
        lines = []
        for c in self.diagnoses:
            lines.append(f"{c.status:<4}  {c.name:<{width}}  {c.detail}")
            if c.fix:
                lines.append(f"{'':<4}  {'':<{width}}  fix: {c.fix}")
        return "\n".join(lines)

    def as_json(self) -> str:
        return json.dumps([c.__dict__ for c in self.diagnoses], indent=2)


def _docker(*args: str, timeout: int = 60, cwd: Path | None = None) -> subprocess.CompletedProcess | None:
    """``docker ARGS`` through the engine module; None when it cannot run."""
    from imagegen import engine
    try:
        return engine.docker(*args, timeout=timeout, cwd=cwd)
    except (EngineError, OSError, subprocess.TimeoutExpired):
        return None


def diagnose_toolchain(report: Report, python_exe: str | None) -> str:
    """Python, torch, nvcc and the GPUs; returns the interpreter a native build would run."""
    report.add("python", OK if sys.version_info >= (3, 10) else FAIL, f"imagegen runs on {sys.version.split()[0]}",
               "" if sys.version_info >= (3, 10) else "use Python >= 3.10")
    host = host_toolchain.probe(python_exe)
    if host.torch:
        report.add("torch", OK if host.torch_cuda else WARN,
                   f"{host.torch} (CUDA {host.torch_cuda or 'none: a CPU build'}) in {host.python_exe}",
                   "" if host.torch_cuda else "a native build needs a CUDA build of torch (pip install torch from the cuXXX index)")
    else:
        report.add("torch", WARN, f"not importable by {host.python_exe}",
                   "only native builds need it: install the torch you build for (containers bring their own)")
    if host.nvcc:
        report.add("nvcc", OK, f"{host.nvcc} (CUDA_HOME {host.cuda_home})")
        if host.torch_cuda:
            try:
                tmajor = Version(host.torch_cuda).major
            except InvalidVersion:
                tmajor = None
            if tmajor is not None and tmajor != host.nvcc.major:
                report.add("nvcc vs torch", FAIL, f"nvcc {host.nvcc} but torch is a CUDA {host.torch_cuda} build",
                           f"nvcc's major must equal torch's CUDA major: install CUDA {tmajor}.x (or a torch built for CUDA"
                           f" {host.nvcc.major}.x) and point CUDA_HOME at it")
            else:
                report.add("nvcc vs torch", OK, f"nvcc {host.nvcc.major}.x matches torch's CUDA {host.torch_cuda}")
    else:
        report.add("nvcc", WARN, "not found in CUDA_HOME, on PATH or in /usr/local/cuda",
                   "only native builds need it: install the CUDA toolkit, or pip install 'cuda-toolkit[nvcc,cudart,cccl]'"
                   " matching torch's CUDA, and set CUDA_HOME")
    if host.gpus:
        report.add("gpus", OK, "; ".join(host.gpus), f"build for them with --arch '{';'.join(host.ccs)}'")
    else:
        report.add("gpus", OK, "none visible (fine: wheels build without a GPU; give --arch)")
    return host.python_exe


_CMAKE_VERSION = re.compile(r"cmake version (\d+(?:\.\d+)+)")


def diagnose_build_tools(report: Report, python_exe: str) -> None:
    """The CMake a native build with ``python_exe`` would run (its venv's bin/ first on PATH, as the build puts it)
    against what the catalogue's CMake builds require (natten: cmake>=3.26, for CUDA as C++20 at torch >= 2.12)."""
    from imagegen.model.catalogue import load_catalogue

    needs = []  # (recipe, specifier)
    cat = load_catalogue()
    for recipe in (cat.get(name) for name in cat.names()):
        for text in recipe.build_requires:
            try:
                req = Requirement(text)
            except InvalidRequirement:
                continue
            if req.name.lower() == "cmake":
                needs.append((recipe.name, req.specifier))
    if not needs:
        return
    wanted = ", ".join(f"{name} (cmake{spec})" for name, spec in needs)
    fix = (f"pip install 'cmake{needs[0][1]}' into the venv you build with (--python-exe VENV/bin/python: its bin/"
           " goes first on PATH), or install CMake; only native builds of these need it")
    exe = shutil.which("cmake", path=rules.path_with_venv(os.environ.get("PATH", ""), python_exe))
    if not exe:
        report.add("cmake", WARN, f"none on PATH; {wanted} build with CMake", fix)
        return
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    m = _CMAKE_VERSION.search(out)
    if not m:
        report.add("cmake", WARN, f"{exe} does not say its version", fix)
        return
    have = Version(m.group(1))
    short = [f"{name} needs cmake{spec}" for name, spec in needs if not spec.contains(have, prereleases=True)]
    if short:
        report.add("cmake", WARN, f"{have} ({exe}): " + "; ".join(short), fix)
    else:
        report.add("cmake", OK, f"{have} ({exe}): enough for {wanted}")


PROBE_BAKE_TIMEOUT = 120  # seconds the probe bake may take (a few, where the engine works)
PROBE_SKIPPED = "skipped (--no-build): buildx bake's matrix and local export were not tried"


def diagnose_engine(report: Report, *, build: bool = True,
                    say=lambda m: print(m, file=sys.stderr, flush=True)) -> None:
    """The Docker engine and buildx; with ``build``, a tiny probe bake on the engine (said on stderr
    first, since it builds on the user's engine: --no-build skips it)."""
    if not shutil.which("docker"):
        from imagegen.engine import NO_DOCKER
        what, _, fix = NO_DOCKER.partition(": ")
        report.add("docker", WARN, what, fix)
        return
    server = _docker("version", "--format", "{{.Server.Version}}")
    if server is None or server.returncode != 0:
        last = (server.stderr.strip().splitlines() or ["no answer"])[-1] if server else "no answer"
        report.add("docker engine", FAIL, f"not reachable: {last}", "start the daemon (sudo imagegen setup engine starts it), or build with --native")
    else:
        report.add("docker engine", OK, f"server {server.stdout.strip()}")
    bx = _docker("buildx", "version")
    if bx is None or bx.returncode != 0:
        report.add("buildx", FAIL, "the buildx plugin is missing", "install docker-buildx (sudo imagegen setup engine)")
        return
    words = bx.stdout.split()
    report.add("buildx", OK, " ".join(words[1:2]) if len(words) > 1 else bx.stdout.strip())
    if server is None or server.returncode != 0:
        return
    if not build:
        report.add("bake matrix + local export", WARN, PROBE_SKIPPED, "run imagegen doctor without --no-build to try it")
        return
    # A bake matrix (buildx >= 0.11) and a local export, end to end, with nothing to pull.
    say(f"doctor: building a tiny probe image on the engine (a few seconds, at most {PROBE_BAKE_TIMEOUT} s);"
        " --no-build skips it")
    with tempfile.TemporaryDirectory(prefix="imagegen-doctor-") as tmp:
        bake = {"target": {"probe": {"name": "probe-${n}", "matrix": {"n": ["a", "b"]},
                                     "dockerfile-inline": "FROM scratch\nCOPY <<EOF /ok\nok\nEOF\n",
                                     "output": ["type=local,dest=out/${n}"]}}}
        (Path(tmp) / "probe.json").write_text(json.dumps(bake))
        proc = _docker("buildx", "bake", "-f", "probe.json", "--progress", "plain", "probe", timeout=PROBE_BAKE_TIMEOUT,
                       cwd=Path(tmp))
        exported = sorted(p.relative_to(tmp).as_posix() for p in Path(tmp, "out").rglob("*") if p.is_file()) \
            if Path(tmp, "out").exists() else []
    if proc is not None and proc.returncode == 0 and exported == ["out/a/ok", "out/b/ok"]:
        report.add("bake matrix + local export", OK, "a 2-target matrix exported to local folders")
    else:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1] if proc else "timed out"
        report.add("bake matrix + local export", FAIL, f"did not work here: {last}",
                   "use buildx >= 0.11 (matrix); on older buildx imagegen's generated files still work (no matrix)")


def diagnose_container_gpus(report: Report, *, driver_works: bool | None = None, **probe) -> None:
    """Which of the three ways to give containers the GPUs this host has (imagegen.executors.gpu_access):
    each found is a line with its docker run flags, or with what to fix."""
    from imagegen import engine
    from imagegen.executors import gpu_access

    if driver_works is None:
        driver_works = engine.driver_works()
    if not driver_works:
        report.add("gpus in containers", OK, "no working NVIDIA driver here: builder containers go by --arch")
        return
    if gpu_access.remote_engine():
        report.add("gpus in containers", WARN, f"the engine is on {gpu_access.remote_engine()}: its GPUs are not known here",
                   "run imagegen doctor on that machine; imagegen pull --gpus toolkit|cdi|devices chooses one")
        return
    probe.setdefault("docker", _docker)
    ways = gpu_access.supported(**probe)
    for way in ways:
        report.add(f"gpus in containers: {way.mode}", OK if way.flags else WARN,
                   f"{way.detail}: {' '.join(way.flags)}" if way.flags else way.detail, way.fix)
    if not any(way.flags for way in ways):
        report.add("gpus in containers", WARN, "none of toolkit (--gpus all), CDI or the device nodes with the driver's"
                   " libraries: builder containers cannot see the GPUs and go by --arch", gpu_access.TOOLKIT_FIX)
    else:
        best = next(way for way in ways if way.flags)
        report.add("gpus in containers", OK, f"imagegen pull --gpus auto uses {best.mode}")


def diagnose_build_gpus(report: Report, *, driver_works: bool | None = None, docker=None) -> None:
    """Can a build step be given the GPU here (`--gpu-check-device`, BuildKit CDI)? The engine and
    buildx versions, and the CDI devices the builder lists for build steps."""
    from imagegen import engine
    from imagegen.executors import gpu_access

    docker = docker or _docker
    name = "gpu check in builds"
    server = docker("version", "--format", "{{.Server.Version}}")
    bx = docker("buildx", "version")
    if server is None or server.returncode != 0 or bx is None or bx.returncode != 0:
        return  # diagnose_engine said why
    server_v = gpu_access.version_tuple(server.stdout)
    words = bx.stdout.split()
    bx_v = gpu_access.version_tuple(words[1] if len(words) > 1 else "")
    want = (f"Docker {'.'.join(map(str, gpu_access.BUILD_DEVICE_ENGINE))}+ and buildx"
            f" {'.'.join(map(str, gpu_access.BUILD_DEVICE_BUILDX))}+")
    if server_v < gpu_access.BUILD_DEVICE_ENGINE or bx_v < gpu_access.BUILD_DEVICE_BUILDX:
        report.add(name, WARN, f"not on this engine (server {server.stdout.strip()}, buildx {'.'.join(map(str, bx_v)) or '?'}):"
                   " --gpu-check-device needs " + want, "upgrade Docker and buildx, or run `imagegen check WHEEL`"
                   " on the GPU machine after the build")
        return
    inspect = docker("buildx", "inspect")
    devices = gpu_access.build_devices(inspect.stdout if inspect is not None and inspect.returncode == 0 else "")
    gpus = [d for d in devices if d.name.startswith(gpu_access.CDI_KIND + "=")]
    if not gpus:
        works = engine.driver_works() if driver_works is None else driver_works
        report.add(name, WARN if works else OK, "the builder lists no nvidia.com/gpu CDI device for build steps"
                   + ("" if works else " (no working NVIDIA driver here either)"),
                   "imagegen cdi-spec -o /etc/cdi/imagegen-nvidia.json (CDI on in dockerd: {\"features\": {\"cdi\":"
                   " true}})" if works else "")
        return
    allowed = [d.name for d in gpus if d.auto_allowed]
    if not allowed:
        report.add(name, WARN, f"{', '.join(d.name for d in gpus)} listed, but not automatically allowed: dockerd cannot"
                   " grant BuildKit's device entitlement", "add the annotation org.mobyproject.buildkit.device.autoallow:"
                   " true to the CDI spec (imagegen cdi-spec writes it)")
        return
    report.add(name, OK, f"build steps can be given {', '.join(allowed)}: --gpu-check-device {allowed[0]}")


def diagnose_machine(report: Report, root: Path) -> None:
    h = jobs.host()
    free = shutil.disk_usage(root).free / 1e9
    report.add("disk", OK if free > 30 else WARN, f"{free:.0f} GB free in {root}",
               "" if free > 30 else "a CUDA builder image and its cache take 10-20 GB per CUDA version: free some space")
    report.add("cpu / ram", OK, h.describe())
    from imagegen.model.catalogue import load_catalogue

    catalogue = load_catalogue()
    for name in ("sageattention", "flash-attn"):
        r = catalogue.get(name)
        label = f"jobs ({name}, {r.heaviest_gb_per_thread:g} GB per nvcc thread, one arch)"
        s = jobs.settings_for(r.heaviest_gb_per_thread, r.default_nvcc_threads, h, targets=1)
        report.add(label, OK if s.max_jobs * s.nvcc_threads > 1 else WARN, s.describe(),
                   "" if s.max_jobs * s.nvcc_threads > 1 else "little RAM: builds will be slow but will not be OOM-killed")


def run(python_exe: str | None = None, root: Path | None = None, engine: bool = True, build: bool = True) -> Report:
    report = Report()
    diagnose_build_tools(report, diagnose_toolchain(report, python_exe))
    if engine:
        diagnose_engine(report, build=build)
        diagnose_container_gpus(report)
        diagnose_build_gpus(report)
    diagnose_machine(report, root or Path.cwd())
    return report
