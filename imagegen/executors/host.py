"""This host's toolchain for a native build: the Python (and its torch), nvcc and the GPUs, probed
once (the plan step's preflight, imagegen.plan.matrix.preflight, turns it and a recipe into a cell)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

from packaging.version import Version

from imagegen.errors import EngineError
from imagegen.model.cell import HostToolchain
from imagegen.outputs import shown
from imagegen.safety import os_reason


# Reads torch's version and CUDA from its metadata and torch/version.py without importing torch
# (importing it costs seconds, which the overhead budget of a native build does not have).
_PROBE = r"""
import importlib.util, json, os, shutil, sys
out = {"python": "%d.%d" % sys.version_info[:2]}
try:
    from importlib.metadata import version
    out["torch"] = version("torch").split("+")[0]
    spec = importlib.util.find_spec("torch")
    ns = {}
    with open(os.path.join(os.path.dirname(spec.origin), "version.py")) as fh:
        exec(fh.read(), ns)
    out["torch_cuda"] = ns.get("cuda")
except Exception as exc:
    out["torch_error"] = "%s: %s" % (type(exc).__name__, exc)
# CUDA_HOME candidates in torch.utils.cpp_extension's order, plus what a wrapper script on PATH
# execs and /usr/local/cuda; the first that has nvcc and the runtime headers wins.
cands = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
nvcc = shutil.which("nvcc")
if nvcc:
    cands.append(os.path.dirname(os.path.dirname(nvcc)))
    cands.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    try:
        import re
        with open(nvcc, "rb") as fh:
            head = fh.read(4096)
        m = re.search(rb"(/[^\s\"']+)/bin/nvcc", head) if head.startswith(b"#!") else None
        if m:
            cands.append(m.group(1).decode())
    except OSError:
        pass
cands.append("/usr/local/cuda")
out["cuda_home_candidates"] = [c for c in cands if c]
out["cuda_home"] = next((c for c in cands if c and os.path.isfile(os.path.join(c, "bin", "nvcc"))
                         and os.path.isfile(os.path.join(c, "include", "cuda_runtime.h"))), None)
print(json.dumps(out))
"""


def gpus() -> tuple[str, ...]:
    """'NAME (X.Y)' for each GPU nvidia-smi sees; empty without a driver."""
    from imagegen import engine
    return engine.gpus()


PROBE_TIMEOUT = 120  # seconds: the probe reads files only (no torch import), but a cold venv starts slowly


def probe_python(exe: str, timeout: float = PROBE_TIMEOUT) -> dict:
    """What the interpreter ``exe`` is, read once by running it with _PROBE (torch's version and CUDA from
    its metadata, without importing it): {"python": "3.12", "torch": "2.8.0" or absent, "torch_cuda":
    "12.9" or None, ...}. EngineError, one line, when it cannot be run as Python within ``timeout``."""
    try:
        raw = subprocess.run([exe, "-c", _PROBE], capture_output=True, text=True, timeout=timeout,
                             stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise EngineError(f"Python interpreter {shown(exe)} not found") from None
    except OSError as exc:  # not executable, a directory, a symlink loop, a name too long
        raise EngineError(f"cannot run Python interpreter {shown(exe)}: {os_reason(exc)}") from None
    except subprocess.TimeoutExpired:
        raise EngineError(f"Python interpreter {shown(exe)} did not answer within {timeout:.0f} s") from None
    try:
        info = json.loads(raw.stdout.strip().splitlines()[-1])
        if not isinstance(info, dict) or not isinstance(info.get("python"), str):
            raise ValueError(info)
    except (ValueError, IndexError):
        last = raw.stderr.strip().splitlines()[-1] if raw.stderr.strip() else "no output"
        raise EngineError(f"cannot run {shown(exe)} as Python: {shown(last, 160)}") from None
    return info


def probe(python_exe: str | None = None) -> HostToolchain:
    exe = python_exe or sys.executable
    info = probe_python(exe)
    cuda_home = info.get("cuda_home")
    nvcc = nvcc_version(cuda_home)
    return HostToolchain(python_exe=exe, python=info["python"], torch=info.get("torch"), torch_cuda=info.get("torch_cuda"),
                         cuda_home=cuda_home, nvcc=nvcc, gpus=gpus())


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
