"""The Windows machine the helper (imagegen_windows.py) runs on, as a cell needs it: whether its
interpreter's torch and its nvcc are the cell's (the check step), and what the smoke step's fresh
venv sees (the cell's site-packages, the GPU driver).

Written beside the helper by a rendered build.ps1/build.cmd. Standard library only, Python 3.8+, ASCII
only (cmd and PowerShell write it out)."""

import os
import re
import sys

TORCH_PROBE = "import json, sys, torch; print(json.dumps([torch.__version__, torch.version.cuda]))"
_NVCC_RELEASE = re.compile(r"release (\d+)\.(\d+)")


def nvcc_release(text):
    """(major, minor) from `nvcc --version`'s output, or None."""
    m = _NVCC_RELEASE.search(text or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def torch_problems(cell, got_version, got_cuda):
    """Why the torch found is not the cell's (empty: it is). A local label (+cu128) is allowed."""
    if got_version is None:
        return ["torch is not installed in %s" % sys.executable]
    if got_version.split("+")[0] != cell["torch"]:
        return ["torch %s is installed, the cell asks for torch %s" % (got_version, cell["torch"])]
    if (got_cuda or "") != cell["cuda_dotted"]:
        return ["torch %s is built for CUDA %s, the cell asks for CUDA %s (%s): install it from %s"
                % (got_version, got_cuda or "none (a CPU-only build)", cell["cuda_dotted"], cell["cuda"],
                   cell["torch_index_url"])]
    return []


def nvcc_problems(cell, release, torch_cuda):
    """The Linux pre-flight's rule (imagegen.cell_rules.base_problems: nvcc's major must equal torch's
    CUDA major), and the toolkit the plan chose for the cell (its arch checks assumed that nvcc)."""
    if release is None:
        return ["nvcc not found on PATH (CUDA_PATH\\bin): install CUDA Toolkit %s" % cell["toolkit"]]
    found = "%d.%d" % release
    out = []
    major = int(str(torch_cuda or cell["cuda_dotted"]).split(".")[0])
    if release[0] != major:
        out.append("nvcc %s cannot build for torch's CUDA %s (nvcc's major must equal torch's CUDA major)"
                   % (found, torch_cuda or cell["cuda_dotted"]))
    elif found != cell["toolkit"]:
        out.append("nvcc on PATH is %s, the cell was planned with CUDA %s: point %s at the %s toolkit"
                   % (found, cell["toolkit"], cell["cuda_path_var"], cell["toolkit"]))
    return out


def venv_python(venv):
    if os.name == "nt":
        return os.path.join(venv, "Scripts", "python.exe")
    return os.path.join(venv, "bin", "python")


def site_dirs():
    """The running interpreter's site-packages folders (the cell's environment, where torch is)."""
    import site
    import sysconfig
    out = []
    for path in [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]] + list(site.getsitepackages()):
        # site.getsitepackages() also names a venv's own folder on Windows: only the package folders
        if os.path.basename(path.rstrip("\\/")).lower() in ("site-packages", "dist-packages") \
                and os.path.isdir(path) and path not in out:
            out.append(path)
    return out


def driver_present():
    """Whether this machine has a GPU driver (nvcuda.dll on Windows, libcuda elsewhere)."""
    if os.name == "nt":
        return os.path.isfile(os.path.join(os.environ.get("SystemRoot", r"C:\Windows"), "System32", "nvcuda.dll"))
    import ctypes.util
    return ctypes.util.find_library("cuda") is not None
