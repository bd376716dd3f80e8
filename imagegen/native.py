"""Native builds: the same recipe logic as the Dockerfile, run on this host (Colab, bare metal).

The in-build script that every Dockerfile embeds (resources/builder/imagegen_build.py) runs here
directly with the host's Python: fetch (git clone with submodules, or a local tree), patches, the
recipe's environment (arch knob, force-build, local version, MAX_JOBS/NVCC_THREADS),
`pip wheel --no-build-isolation`, retag. Before anything compiles, the host's torch, its CUDA and
nvcc are checked against each other and against the requested archs, with the same one-line
reasons as `imagegen plan`. The wheel is verified like a bake build's (SASS/PTX per arch, install +
import in a throwaway venv that sees the host's torch) and copied atomically into the output folder.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from packaging.version import Version

from imagegen import collect, compat, jobs
from imagegen.arch import ArchList
from imagegen.compat import BaseImage
from imagegen.errors import BuildError, CompatError, EngineError
from imagegen.plan import Cell, native_cell
from imagegen.recipes import Recipe, RecipeVersion
from imagegen.render import builder_script, cell_document, inputs_hash
from imagegen.verify import verify_wheel


@dataclass(frozen=True)
class HostToolchain:
    python_exe: str
    python: str  # "3.12"
    torch: str | None  # "2.11.0"
    torch_cuda: str | None  # "13.0"
    cuda_home: str | None
    nvcc: Version | None
    gpus: tuple[str, ...]  # "NVIDIA H100 80GB HBM3 (9.0)"

    def describe(self) -> str:
        return (f"Python {self.python}, torch {self.torch or 'missing'} (CUDA {self.torch_cuda or '-'}),"
                f" nvcc {self.nvcc or 'missing'}" + (f", GPUs: {', '.join(self.gpus)}" if self.gpus else ", no GPU"))


_PROBE = r"""
import json, sys
out = {"python": "%d.%d" % sys.version_info[:2]}
try:
    import torch
    out["torch"] = torch.__version__.split("+")[0]
    out["torch_cuda"] = torch.version.cuda
    from torch.utils import cpp_extension
    out["cuda_home"] = cpp_extension.CUDA_HOME
    gpus = []
    try:
        if torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
                cap = torch.cuda.get_device_capability(i)
                gpus.append("%s (%d.%d)" % (torch.cuda.get_device_name(i), cap[0], cap[1]))
    except Exception:
        pass
    out["gpus"] = gpus
except Exception as exc:
    out["torch_error"] = "%s: %s" % (type(exc).__name__, exc)
print(json.dumps(out))
"""


def probe(python_exe: str | None = None) -> HostToolchain:
    exe = python_exe or sys.executable
    try:
        raw = subprocess.run([exe, "-c", _PROBE], capture_output=True, text=True, timeout=300)
    except FileNotFoundError:
        raise EngineError(f"Python interpreter {exe} not found") from None
    try:
        info = json.loads(raw.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise EngineError(f"cannot run {exe}: {raw.stderr.strip().splitlines()[-1] if raw.stderr.strip() else 'no output'}") from None
    cuda_home = info.get("cuda_home") or os.environ.get("CUDA_HOME")
    nvcc = nvcc_version(cuda_home)
    return HostToolchain(python_exe=exe, python=info["python"], torch=info.get("torch"), torch_cuda=info.get("torch_cuda"),
                         cuda_home=cuda_home, nvcc=nvcc, gpus=tuple(info.get("gpus") or ()))


def nvcc_version(cuda_home: str | None) -> Version | None:
    candidates = [str(Path(cuda_home) / "bin" / "nvcc")] if cuda_home else []
    which = shutil.which("nvcc")
    if which:
        candidates.append(which)
    for exe in candidates:
        try:
            out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60).stdout
        except OSError:
            continue
        m = re.search(r"release (\d+\.\d+)", out)
        if m:
            return Version(m.group(1))
    return None


def preflight(recipe: Recipe, version: RecipeVersion, archs: ArchList, host: HostToolchain) -> Cell:
    """The cell this host would build, or a one-line CompatError saying what to fix."""
    if host.torch is None:
        raise CompatError(f"torch is not importable by {host.python_exe}: install the torch you build for first")
    if host.nvcc is None:
        raise CompatError("nvcc not found (looked in CUDA_HOME/bin and PATH): install the CUDA toolkit"
                          " (or `pip install cuda-toolkit[nvcc,cudart,cccl]` matching torch's CUDA) and set CUDA_HOME")
    base = BaseImage(ref="native", flavor=compat.flavor("native"), python=host.python_exe, toolkit="host",
                     nvcc=host.nvcc, image_torch_cuda=None)
    cell = native_cell(recipe, version, archs, base, host.torch, host.torch_cuda, host.python)
    if cell.problems:
        raise CompatError(f"cannot build {cell.describe()} here: " + "; ".join(cell.problems))
    return cell


def build_native(cell: Cell, host: HostToolchain, *, out: Path, work: Path, flat: bool = False,
                 max_jobs: int | None = None, nvcc_threads: int | None = None, src_dir: Path | None = None,
                 say: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True)) -> Path:
    work = work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    doc = cell_document(cell)
    doc["venv"] = None  # build with the host's Python and its torch
    doc["base_python"] = host.python_exe
    doc["log_dir"] = str(work / "logs")
    doc["cuda_home"] = host.cuda_home
    if cell.recipe.source_kind == "local":
        doc["src_dir"] = str(cell.recipe.source_path)
    else:
        doc["src_dir"] = str((src_dir or work / "src").resolve())
    cell_file = work / "cell.json"
    cell_file.write_text(json.dumps(doc, indent=2))
    script = work / "imagegen_build.py"
    script.write_text(builder_script())
    settings = jobs.settings_for(cell.recipe.memory_per_thread_gb, cell.recipe.default_nvcc_threads, jobs.host(),
                                 max_jobs=max_jobs, nvcc_threads=nvcc_threads)
    say(f"building {cell.describe()} natively: {host.describe()}")
    say(f"jobs: {settings.describe()} on {jobs.host().describe()} (override with --max-jobs / --nvcc-threads)")
    env = dict(os.environ, TORCH_CUDA_ARCH_LIST=str(cell.archs), MAX_JOBS=str(settings.max_jobs),
               NVCC_THREADS=str(settings.nvcc_threads), PYTHONUNBUFFERED="1")
    started = time.time()
    dist = work / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    for step in (["fetch"], ["build", "--out", str(dist)]):
        if step == ["fetch"] and cell.recipe.source_kind == "local":
            continue
        rc = subprocess.call([host.python_exe, str(script), "--cell", str(cell_file), *step], env=env)
        if rc != 0:
            raise BuildError(f"{cell.describe()}: the {step[0]} step failed (exit {rc}); log: {work / 'logs' / 'build.log'}")
    wheels = sorted(dist.glob("*.whl"))
    if len(wheels) != 1:
        raise BuildError(f"expected one wheel in {dist}, found {[w.name for w in wheels]}")
    seconds = time.time() - started
    report = verify_wheel(wheels[0], cell.expected_archs)
    if not report.ok:
        raise BuildError(f"{wheels[0].name} failed verification: {'; '.join(report.problems)}")
    smoke = smoke_test(wheels[0], cell, host)
    say(f"smoke: {smoke}")
    if flat:
        out.mkdir(parents=True, exist_ok=True)
        dest = out / wheels[0].name
        tmp = out / f".{wheels[0].name}.partial"
        shutil.copyfile(wheels[0], tmp)
        os.replace(tmp, dest)
    else:
        dest = collect.publish(out, cell, wheels[0], inputs=inputs_hash(cell, doc), record={
            "duration_s": round(seconds, 1), "log": str(work / "logs" / "build.log"), "verify": report.as_dict(),
            "smoke": smoke, "native": True, "nvcc": str(host.nvcc)})
    say(f"built {dest} in {seconds:.0f} s; archs: {', '.join(str(e) for s in report.extensions for e in s.entries)}")
    return dest


def smoke_test(wheel: Path, cell: Cell, host: HostToolchain) -> dict:
    """Install the wheel into a throwaway venv that sees the host's packages (torch) and import the
    recipe's modules from outside the source tree. A module that needs the GPU driver on a machine
    without one is reported as skipped."""
    with tempfile.TemporaryDirectory(prefix="imagegen-smoke-") as tmp:
        venv = Path(tmp) / "venv"
        subprocess.run([host.python_exe, "-m", "venv", "--system-site-packages", str(venv)], check=True,
                       capture_output=True)
        py = str(venv / "bin" / "python")
        subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True,
                       capture_output=True)
        results = {}
        for module in (*cell.recipe.smoke.imports, *cell.recipe.smoke.driver_imports):
            proc = subprocess.run([py, "-c", f"import {module}"], capture_output=True, text=True, cwd=tmp)
            err = (proc.stderr.strip().splitlines() or [""])[-1]
            if proc.returncode == 0:
                results[module] = "ok"
            elif re.search(r"libcuda\.so|CUDA driver|NVIDIA driver", err):
                results[module] = f"skipped: needs a GPU driver ({err[:160]})"
            else:
                raise BuildError(f"{wheel.name}: `import {module}` failed: {err[:300]}")
        return results
