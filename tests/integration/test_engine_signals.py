"""A signal to imagegen alone (as a CI runner or a supervisor sends it, not to the process group)
ends everything imagegen started on the engine: `docker buildx bake` and the RUN compiling in the
daemon. tests/fixtures/sleepy_kernel's compile step is a `sleep 987.654` that never ends by itself.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
BASE_IMAGE = os.environ.get("IMAGEGEN_TEST_BASE_IMAGE", "imagegen-test/python:3.11-bookworm")
IMAGEGEN = str(Path(sys.executable).parent / "imagegen")
MARKER = b"987.654"

pytestmark = pytest.mark.integration


def sleepers() -> list[int]:
    """The fixture's `sleep 987.654` processes, wherever they run (container processes are visible here)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv[:2] == [b"sleep", MARKER]:
                found.append(int(entry))
    return found


def bakes_of(run_dir: Path) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if b"bake" in cmdline and str(run_dir).encode() in cmdline:
                found.append(int(entry))
    return found


@pytest.mark.parametrize("sig", [signal.SIGTERM])
def test_a_signal_to_imagegen_alone_stops_bake_and_the_compile_in_the_daemon(tmp_path, sig):
    if subprocess.run(["docker", "image", "inspect", BASE_IMAGE], capture_output=True).returncode != 0:
        pytest.fail(f"a running engine and {BASE_IMAGE} are required: run scripts/test.sh as root")
    assert not sleepers(), "a sleepy_kernel compile from an earlier run is still going"
    cmd = [IMAGEGEN, "build", "--source", str(FIXTURES / "sleepy_kernel"), "--torch", "2.11", "--cuda", "13.0",
           "--python", "3.11", "--arch", "9.0", "--flavor", "pypi", "--base-image", BASE_IMAGE, "--no-audit",
           "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work")]
    log = (tmp_path / "imagegen.log").open("w")
    # Its own session: the signal reaches imagegen only, never a process group it shares with bake.
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path, start_new_session=True)
    try:
        deadline = time.monotonic() + 1800  # the first time, the builder image's layers are made
        while not sleepers() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(1)
        assert sleepers(), f"the compile never started: {(tmp_path / 'imagegen.log').read_text()[-3000:]}"
        t0 = time.monotonic()
        os.kill(proc.pid, sig)
        proc.wait(timeout=60)
        stopped_in = time.monotonic() - t0
        text = (tmp_path / "imagegen.log").read_text()
        assert proc.returncode == 130, text[-3000:]
        assert text.strip().splitlines()[-1] == "imagegen: interrupted"
        end = time.monotonic() + 15
        while (sleepers() or bakes_of(tmp_path / "work")) and time.monotonic() < end:
            time.sleep(0.5)
        assert not sleepers(), "the compile goes on in the daemon after imagegen was stopped"
        assert not bakes_of(tmp_path / "work"), "docker buildx bake outlived imagegen"
        assert stopped_in < 30, f"imagegen took {stopped_in:.0f} s to stop"
        assert not list((tmp_path / "out").rglob("*.whl")) and not list((tmp_path / "out").rglob("*.partial"))
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in sleepers():
            os.kill(pid, signal.SIGKILL)
