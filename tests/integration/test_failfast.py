"""A native build stops at the first compiler error (the issue "The plan tells the truth"):
tests/fixtures/failfast_kernel builds two CUDA extensions side by side (like SageAttention's
EXT_PARALLEL), one that ptxas refuses for sm_80 within a second and one that takes minutes. The
build must end within seconds of the error, leave no compiler behind, and lead its message with
the compiler's error. Compiled with the host's nvcc (/usr/local/cuda) against torch 2.11 in a venv,
as tests/integration/test_native.py does."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "failfast_kernel"
IMAGEGEN = str(Path(sys.executable).parent / "imagegen")
COMPILERS = ("nvcc", "cicc", "ptxas", "cudafe++", "cc1plus", "gcc", "g++", "c++", "ninja", "fatbinary", "nvlink")

pytestmark = pytest.mark.integration


def cuda_home() -> str:
    for cand in ("/usr/local/cuda", "/usr/local/cuda-13.0"):
        if Path(cand, "bin", "nvcc").exists():
            return cand
    pytest.fail("the host's CUDA 13 toolkit (nvcc) is required")


def build_processes(needle: str) -> dict[int, str]:
    """Live (non-zombie) processes whose command line mentions ``needle``: pid -> command line."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    continue
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if needle in cmd:
            found[int(name)] = cmd
    return found


def test_native_build_stops_at_the_first_compiler_error(torch_venv, tmp_path):
    tmp = tmp_path / "tmp"  # the build's work dir and nvcc's temporary files: every compiler names it
    tmp.mkdir()
    work = tmp_path / "work"
    marker = work / "logs" / "nvcc-errors.txt"
    env = {**os.environ, "CUDA_HOME": cuda_home(), "TMPDIR": str(tmp), "EXT_PARALLEL": "2"}
    t0 = time.time()
    proc = subprocess.Popen([IMAGEGEN, "build", "--native", "--source", str(FIXTURE), "--arch", "8.0", "--python-exe",
                             str(torch_venv / "bin" / "python"), "--out", str(tmp_path / "o"), "--work", str(work),
                             "--max-jobs", "1"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    error_seen = None
    slow_compiling = False
    while proc.poll() is None:
        if error_seen is None and marker.exists():
            error_seen = time.time()
        if not slow_compiling:
            slow_compiling = any("slow_" in cmd and ".cu" in cmd and (" -c " in cmd or "cicc" in cmd)
                                 for cmd in build_processes(str(tmp)).values())
        if time.time() - t0 > 600:
            proc.kill()
            pytest.fail("the build ran for 10 minutes: it did not stop at the error")
        time.sleep(0.05)
    ended = time.time()
    out, err = proc.communicate()
    total = ended - t0
    print(f"error marker -> exit: {ended - error_seen:.2f} s; whole command: {total:.1f} s")

    assert proc.returncode == 5, err[-3000:]
    assert error_seen is not None, "the guard wrote no marker: " + err[-2000:]
    assert slow_compiling, "the slow extension never compiled beside the broken one: nothing was stopped"
    assert ended - error_seen < 30
    left = {pid: cmd for pid, cmd in build_processes(str(tmp)).items()
            if os.path.basename(cmd.split(" ", 1)[0]) in COMPILERS or " nvcc-guard " in cmd}
    assert not left, f"compilers of the build still running: {left}"

    message = err.strip().splitlines()[-1]
    expected = "error   : Instruction 'wgmma.fence' not supported on .target 'sm_80'".replace("   ", " ")
    assert message.startswith("imagegen: error: ptxas ") and " ".join(message.split()).find(expected) > 0, message
    assert "build.log" in message
    log = (work / "logs" / "build.log").read_text()
    assert "Instruction 'wgmma.fence' not supported on .target 'sm_80'" in log
    assert "[imagegen] error: ptxas " in log

    # Far below what finishing the slow extension would have cost: 40 files, each timed here.
    t1 = time.time()
    one = subprocess.run([f"{cuda_home()}/bin/nvcc", "-c", str(FIXTURE / "csrc" / "slow" / "slow_00.cu"), "-o",
                          str(tmp_path / "slow_00.o"), "-gencode=arch=compute_80,code=sm_80"], capture_output=True, text=True)
    per_file = time.time() - t1
    assert one.returncode == 0, one.stderr[-2000:]
    files = len(list((FIXTURE / "csrc" / "slow").glob("*.cu")))
    print(f"slow extension: {files} files x {per_file:.1f} s = {files * per_file:.0f} s with MAX_JOBS=1")
    assert total < files * per_file / 3
    compiled = log.count("[imagegen] nvcc slow/")
    assert compiled < files // 3, f"{compiled} of the slow files were compiled before the build stopped"
