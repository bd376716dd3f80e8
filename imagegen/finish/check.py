"""`imagegen check WHEEL`: run the recipe's numerical GPU check (``smoke.gpu_check``) against a wheel.

The recipe is the one whose ``distribution`` is the wheel's (``--recipe`` names another). The wheel
is unpacked into a temporary folder and its modules imported by :class:`imagegen.executors.import_test.Importer`
(the import test of every build; nothing is installed into the environment), then the check runs
in a fresh interpreter (default: this one) from an empty working directory, with that folder first
on ``sys.path`` and ``torch`` imported before it, under a time limit.

Exit codes (beyond the CLI's usual 2 for bad input, e.g. a missing or unreadable wheel, an unknown
distribution or a recipe without a gpu_check):

- 8 (:class:`NoGpuError`): this interpreter cannot run a GPU check here: torch does not import, or
  ``torch.cuda.is_available()`` is False. Nothing was checked: run it on the GPU machine.
- 6 (:class:`GpuCheckError`, a :class:`~imagegen.finish.verify.VerifyError`): the check ran and failed (an
  assertion, an exception, a module that does not import, a crash, the time limit).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from imagegen import untrusted
from imagegen.errors import BuildError, GpuCheckError, ImagegenError, NoGpuError, RecipeError, Unreadable, UsageError
from imagegen.model.catalogue import Catalogue
from imagegen.model.recipes import Recipe
from imagegen.shipped.builder import imagegen_wheeltools as wheeltools

DEFAULT_TIMEOUT = 600.0


@dataclass(frozen=True)
class GpuInfo:
    python: str
    torch: str | None
    device: str | None  # "NVIDIA H100 80GB HBM3 (9.0)" when a GPU is usable
    error: str | None  # why torch did not import / why CUDA is not available

    @property
    def usable(self) -> bool:
        return self.torch is not None and self.device is not None


@dataclass
class CheckResult:
    wheel: str
    recipe: str
    python: str
    torch: str | None
    device: str | None
    imports: dict
    output: list[str]  # the check's own stdout lines ("sageattn vs sdpa cosine similarity 0.99931")
    seconds: float

    def summary(self) -> str:
        return (f"passed: {self.recipe} gpu_check of {self.wheel} on {self.device}, torch {self.torch},"
                f" in {self.seconds:.1f} s")

    def as_dict(self) -> dict:
        return {"status": "passed", **asdict(self)}


# --------------------------------------------------------------------------------------------
# Inputs


def wheel_distribution(wheel: Path) -> str:
    """The wheel's distribution name (normalised), or a one-line UsageError for a bad file."""
    if not wheel.is_file():
        raise UsageError(f"{wheel}: no such wheel file")
    try:
        dist = parse_wheel_filename(wheel.name)[0]
    except InvalidWheelFilename as exc:
        raise UsageError(f"{wheel.name}: not a valid wheel file name ({exc})") from None
    try:
        with zipfile.ZipFile(wheel) as zf:
            untrusted.validate_zip(zf)  # it is unpacked later: refused now if that would not be bounded
    except (OSError, zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError) as exc:
        raise UsageError(f"{wheel}: not a readable wheel ({exc.__class__.__name__}: {exc})") from None
    except Unreadable as exc:
        raise UsageError(f"{wheel}: {exc}: not unpacked") from None
    return str(dist)


def recipe_for(cat: Catalogue, distribution: str, name: str | None = None, how: str = "--recipe") -> Recipe:
    """The recipe named ``name``, else the one whose ``distribution`` is the wheel's; ``how``: what names
    one (check's --recipe; verify --gpu has none: `imagegen check WHEEL --recipe`)."""
    if name:
        return cat.get(name)
    want = canonicalize_name(distribution)
    found = [r for r in cat.recipes.values() if canonicalize_name(r.distribution) == want]
    if len(found) == 1:
        return found[0]
    if found:
        raise RecipeError(f"several recipes build distribution {distribution}: {', '.join(sorted(r.name for r in found))};"
                          f" name one with {how}")
    raise RecipeError(f"no recipe builds distribution {distribution} (recipes: {', '.join(cat.names())}):"
                      f" name one with {how}, or add yours with --recipe-dir")


def interpreter(python_exe: str | None) -> str:
    """The interpreter to run, as an absolute path; a one-line UsageError when there is none."""
    if not python_exe:
        return sys.executable
    path = shutil.which(python_exe) if os.sep not in python_exe else (python_exe if os.access(python_exe, os.X_OK) else None)
    if not path or not Path(path).is_file():
        raise UsageError(f"--python {python_exe}: no such executable interpreter")
    return os.path.abspath(path)


# --------------------------------------------------------------------------------------------
# The GPU probe and the check's interpreter

# argv: site folder, check file, result file. torch first (the wheel's extensions link against
# libtorch, which only `import torch` loads), then the wheel's folder, then the recipe's check.
# The result file says how it ended, whatever the check prints.
_RUNNER = r"""
import json, sys, time, traceback
site, check_file, result_file = sys.argv[1:4]

def done(**res):
    with open(result_file, "w") as fh:
        json.dump(res, fh)

import torch
sys.path.insert(0, site)
with open(check_file) as fh:
    source = fh.read()
t0 = time.time()
try:
    exec(compile(source, check_file, "exec"), {"__name__": "__main__"})
except BaseException as exc:
    if isinstance(exc, SystemExit) and exc.code in (None, 0):
        done(status="passed", seconds=time.time() - t0)
        sys.exit(0)
    sys.stdout.flush()
    traceback.print_exc()
    line = [f.lineno for f in traceback.extract_tb(exc.__traceback__) if f.filename == check_file]
    done(status="failed", error="".join(traceback.format_exception_only(type(exc), exc)).strip(),
         line=line[-1] if line else None, seconds=time.time() - t0)
    sys.exit(1)
sys.stdout.flush()
done(status="passed", seconds=time.time() - t0)
"""


def _run(argv: list[str], *, cwd: Path, timeout: float) -> tuple[int | None, str, str]:
    """Run ``argv`` in its own process group; on timeout kill the group (a check's workers too).
    Returns (exit code or None on timeout, stdout, stderr)."""
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            errors="replace", start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
        return None, out, err


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def probe_gpu(python_exe: str, *, cwd: Path, timeout: float = 300.0) -> GpuInfo:
    """Does ``python_exe`` import torch, and does torch see a CUDA GPU? (from ``cwd``, an empty folder)"""
    try:
        rc, out, err = _run([python_exe, "-c", wheeltools.GPU_PROBE], cwd=cwd, timeout=timeout)
    except OSError as exc:
        raise UsageError(f"--python {python_exe}: cannot run it ({exc.strerror or exc})") from None
    if rc is None:
        raise NoGpuError(f"{python_exe} did not finish `import torch; torch.cuda.is_available()` within {timeout:.0f} s:"
                         " the numerical check needs a working CUDA GPU; check the driver (nvidia-smi)")
    info = wheeltools.gpu_probe_answer(out)
    if info is None:
        raise UsageError(f"cannot run {python_exe} as Python: {_last_line(err) or f'exit {rc}, no output'}")
    error = info.get("error")
    hint = next((ln.strip() for ln in reversed(err.splitlines()) if re.search(r"CUDA|driver|NVIDIA", ln)), "")
    if error and info.get("torch") and hint:
        error += f"; {hint[:300]}"  # torch's own warning says why (no driver, a driver too old for its CUDA)
    return GpuInfo(python=python_exe, torch=info.get("torch"), device=info.get("device"), error=error)


def require_gpu(info: GpuInfo) -> None:
    if info.torch is None:
        raise NoGpuError(f"torch is not importable by {info.python} ({info.error}): the numerical check needs torch"
                         " with a CUDA GPU; run it on the GPU machine with the Python the wheel was built for (--python)")
    if not info.usable:
        raise NoGpuError(f"no CUDA GPU visible to {info.python} (torch {info.torch}: {info.error}): the numerical"
                         " check needs one; run it on the GPU machine")


def wheel_smoke_modules(r: Recipe, wheel: Path) -> list[str]:
    """The recipe's smoke modules this wheel's build made: a module whose extension the recipe routes
    (SageAttention's _qattn_sm90, built only for a list with 9.0) is imported only where the wheel has
    it, since the list the wheel was built for decided that (its plan did not import it either: Cell.smoke).
    Every other module must import."""
    from imagegen.executors.import_test import wheel_modules

    routed = {m for v in r.versions.values() for m in v.extensions}
    modules = [*r.smoke.imports, *r.smoke.driver_imports]
    if not routed.intersection(modules):
        return modules
    has = set(wheel_modules(wheel))
    return [m for m in modules if m not in routed or m in has]


MAX_TIMEOUT = 7 * 86400.0  # a week: longer is no time limit at all


def check_wheel(wheel: Path, cat: Catalogue, *, recipe: str | None = None, python_exe: str | None = None,
                timeout: float = DEFAULT_TIMEOUT, how: str = "--recipe") -> CheckResult:
    """Run the recipe's ``smoke.gpu_check`` against ``wheel`` with ``python_exe`` (default: this
    interpreter). Raises NoGpuError (exit 8) when that interpreter has no usable CUDA GPU,
    GpuCheckError (exit 6) when the check fails, UsageError/RecipeError (exit 2) for bad input."""
    from imagegen.executors.import_test import Importer, import_test

    if not 0 < timeout <= MAX_TIMEOUT:  # nan and inf too (inf was an OverflowError deep in subprocess: exit 70)
        raise UsageError(f"--timeout must be a positive number of seconds, at most {MAX_TIMEOUT:.0f}")
    dist = wheel_distribution(wheel)
    r = recipe_for(cat, dist, recipe, how)
    code = r.smoke.gpu_check
    if not code.strip():
        raise RecipeError(f"recipe {r.name} has no smoke.gpu_check: nothing to run for {wheel.name}"
                          f" (add one to the recipe, or name another with {how})")
    exe = interpreter(python_exe)
    modules = wheel_smoke_modules(r, wheel)
    try:
        importer = Importer(exe)  # starts now: its `import torch` runs while the probe runs
    except OSError as exc:
        raise UsageError(f"--python {exe}: cannot run it ({exc.strerror or exc})") from None
    with importer:
        work = importer.tmp
        empty = work / "cwd"
        empty.mkdir()
        gpu = probe_gpu(exe, cwd=empty, timeout=min(timeout, 300.0))
        require_gpu(gpu)
        # The wheel is unpacked (into work/site) and its modules imported by the build's import test.
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            importer.proc.kill()

        timer = threading.Timer(timeout, expire)
        timer.start()
        try:
            imports = import_test(wheel, modules, exe, importer=importer)
        except BuildError as exc:
            why = f"the import test did not finish within {timeout:.0f} s" if expired.is_set() else str(exc)
            raise GpuCheckError(f"{r.name} gpu_check of {wheel.name} did not run: {why}") from None
        finally:
            timer.cancel()
        site = work / "site"
        if not site.is_dir():
            raise ImagegenError(f"internal: the unpacked wheel is not where imagegen.executors.import_test.Importer put it ({site})")
        check_file = work / f"{r.name}_gpu_check.py"
        check_file.write_text(code)
        result_file = work / "result.json"
        t0 = time.time()
        rc, out, err = _run([exe, "-c", _RUNNER, str(site), str(check_file), str(result_file)], cwd=empty,
                            timeout=timeout)
        seconds = time.time() - t0
        if rc is None:
            raise GpuCheckError(f"{r.name} gpu_check of {wheel.name} did not finish within {timeout:.0f} s (--timeout)")
        try:
            result = json.loads(result_file.read_text())
        except (OSError, ValueError):
            how = f"killed by signal {-rc}" if rc < 0 else f"exit {rc}"
            raise GpuCheckError(f"{r.name} gpu_check of {wheel.name} died ({how}) before it finished:"
                                f" {_last_line(err) or 'no error output'}") from None
        if result["status"] != "passed":
            where = f" (gpu_check line {result['line']})" if result.get("line") else ""
            raise GpuCheckError(f"{r.name} gpu_check of {wheel.name} failed{where}: {result['error'][:400]}")
    return CheckResult(wheel=wheel.name, recipe=r.name, python=exe, torch=gpu.torch, device=gpu.device,
                       imports=imports, output=[ln for ln in out.splitlines() if ln.strip()],
                       seconds=round(result.get("seconds", seconds), 2))
