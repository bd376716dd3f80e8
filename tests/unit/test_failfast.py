"""Fail fast and live logs, without a compiler: the nvcc guard (imagegen_supervise.py, shipped beside the
in-build script) run around stand-in "nvcc" executables (real subprocesses), its build supervisor
stopping a process tree at the first error, and the bake log splitter's per-cell progress."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from imagegen.executors.bake_log import TargetLogs
from tests.unit.builder_script import SUPERVISE, builder_module

B = builder_module("imagegen_build_failfast")
S = builder_module("imagegen_supervise_failfast", SUPERVISE)


def fake_tool(folder: Path, name: str, body: str) -> Path:
    """An executable Python script standing in for a compiler."""
    path = folder / name
    path.write_text(f"#!{sys.executable}\nimport os, sys, time\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return path


def guard(tmp_path: Path, *cmd: str, words: int = 1, **popen) -> subprocess.Popen:
    env = dict(os.environ, IMAGEGEN_NVCC_FAILED=str(tmp_path / "marker"), IMAGEGEN_NVCC_PROGRESS=str(tmp_path / "progress"))
    return subprocess.Popen([sys.executable, "-S", str(SUPERVISE), "nvcc-guard", str(words), *cmd], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)


# ------------------------------------------------------------------------------------ the guard


def test_guard_passes_output_through_and_reports_the_first_error(tmp_path):
    nvcc = fake_tool(tmp_path, "nvcc", """
        sys.stdout.write("stdout line\\n")
        sys.stderr.write("csrc/foo.cu(3): warning #177-D: unused\\ncsrc/foo.cu(12): error: identifier \\"x\\" is undefined\\n"
                         "1 error detected in the compilation of \\"csrc/foo.cu\\".\\n")
        sys.exit(2)
    """)
    proc = guard(tmp_path, str(nvcc), "-c", "-O3", "-c", "/src/csrc/foo.cu", "-o", "foo.o")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert out == b"stdout line\n"
    assert err == (b"csrc/foo.cu(3): warning #177-D: unused\ncsrc/foo.cu(12): error: identifier \"x\" is undefined\n"
                   b"1 error detected in the compilation of \"csrc/foo.cu\".\n")  # unchanged
    marker = (tmp_path / "marker").read_text().splitlines()
    assert marker[0] == 'csrc/foo.cu(12): error: identifier "x" is undefined'
    assert "csrc/foo.cu" in marker[-1]  # which compilation failed
    assert not (tmp_path / "progress").exists()


def test_guard_reports_an_error_while_the_compiler_still_runs(tmp_path):
    # nvcc with several -gencode targets goes on with the others after one fails: the marker must
    # not wait for it to exit.
    nvcc = fake_tool(tmp_path, "nvcc", """
        sys.stderr.write("ptxas /tmp/x.ptx, line 20; error   : Instruction 'wgmma.fence' not supported on .target 'sm_120'\\n")
        sys.stderr.flush()
        time.sleep(60)
    """)
    proc = guard(tmp_path, str(nvcc), "-c", "a.cu", start_new_session=True)
    try:
        deadline = time.time() + 20
        while not (tmp_path / "marker").exists() and time.time() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, "the stand-in nvcc sleeps for a minute"
        assert (tmp_path / "marker").read_text().startswith("ptxas /tmp/x.ptx, line 20; error   : Instruction 'wgmma.fence'")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the guard and its stand-in nvcc
        proc.communicate()


def test_guard_records_a_bare_failure_and_a_success(tmp_path):
    failing = fake_tool(tmp_path, "nvcc", "sys.stderr.write('Segmentation fault\\n'); sys.exit(139)\n")
    proc = guard(tmp_path, str(failing), "-c", "/x/kernels/k.cu")
    proc.communicate(timeout=60)
    assert proc.returncode == 139
    assert (tmp_path / "marker").read_text() == "nvcc exited with status 139 compiling kernels/k.cu: Segmentation fault\n"
    ok = fake_tool(tmp_path, "nvcc-ok", "print('ptxas info    : Used 32 registers'); sys.exit(0)\n")
    (tmp_path / "marker").unlink()
    proc = guard(tmp_path, str(ok), "-c", "/x/kernels/good.cu")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and out == b"ptxas info    : Used 32 registers\n"
    assert not (tmp_path / "marker").exists()
    assert (tmp_path / "progress").read_text().startswith("nvcc kernels/good.cu: ")


def test_guard_never_blocks_a_chatty_compiler(tmp_path):
    # 8 MB on stderr (SageAttention's ptxas statistics are ~3 MB): forwarded in full, no deadlock.
    chatty = fake_tool(tmp_path, "nvcc", """
        line = b"ptxas info    : Function properties for kernel_with_a_long_name: 0 bytes stack frame\\n"
        for _ in range(8_000_000 // len(line)):
            sys.stderr.buffer.write(line)
        sys.stderr.write("k.cu(1): error: late error\\n")
        sys.exit(1)
    """)
    proc = guard(tmp_path, str(chatty), "-c", "k.cu")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and len(err) > 7_900_000 and err.endswith(b"k.cu(1): error: late error\n")
    assert (tmp_path / "marker").read_text().startswith("k.cu(1): error: late error")


def test_guard_wraps_ccache_as_the_shell_runs_it(tmp_path):
    # torch writes PYTORCH_NVCC into build.ninja as is, and ninja runs it with /bin/sh: the guard
    # must keep ccache (use_ccache's `ccache nvcc`) in front of nvcc.
    fake_tool(tmp_path, "nvcc", "sys.stderr.write('a.cu(1): error: from nvcc\\n'); sys.exit(1)\n")
    ccache = fake_tool(tmp_path, "ccache", """
        open(os.path.join(os.path.dirname(__file__), "ccache-ran"), "w").write(" ".join(sys.argv[1:]))
        os.execv(sys.argv[1], sys.argv[1:])
    """)
    env = {"PYTORCH_NVCC": f"{ccache} {tmp_path / 'nvcc'}", "PATH": os.environ["PATH"]}
    (tmp_path / "logs").mkdir()
    files = S.guard_nvcc(env, str(tmp_path / "logs"), str(tmp_path))
    assert env["PYTORCH_NVCC"].endswith(f"nvcc-guard 2 {ccache} {tmp_path / 'nvcc'}")
    proc = subprocess.run(["/bin/sh", "-c", env["PYTORCH_NVCC"] + " -c a.cu -o a.o"], capture_output=True,
                          env=dict(os.environ, **env), timeout=60)
    assert proc.returncode == 1 and proc.stderr == b"a.cu(1): error: from nvcc\n"
    assert (tmp_path / "ccache-ran").read_text().endswith("nvcc -c a.cu -o a.o")
    assert Path(files["marker"]).read_text().startswith("a.cu(1): error: from nvcc")


def test_print_env_stays_free_of_the_guard():
    # What `env` prints is what a plain `pip wheel` needs: the guard is imagegen's own business.
    plain = {"TORCH_CUDA_ARCH_LIST": "8.0", "MAX_JOBS": "2", "NVCC_THREADS": "1"}
    env = dict(plain, CUDA_HOME="/usr/local/cuda")
    chosen = B.chosen_env(env)
    assert not set(chosen) & {"PYTORCH_NVCC", *S.GUARD_VARS}


# ------------------------------------------------------------------------------- the supervisor


def _tree_script(tmp_path: Path, trigger: str) -> Path:
    """A stand-in `pip wheel`: starts three 'compilers' the way ninja does (each in a process group of
    its own), one of which ignores SIGTERM, writes their pids, then triggers a failure."""
    return fake_tool(tmp_path, "fake-pip", f"""
        import signal, subprocess
        pids = []
        for ignore_term in (False, False, True):
            code = ("import signal, time\\n" + ("signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n" if ignore_term else "")
                    + "time.sleep(300)\\n")
            pids.append(subprocess.Popen([sys.executable, "-c", code], process_group=0).pid
                        if sys.version_info >= (3, 11) else
                        subprocess.Popen([sys.executable, "-c", code], preexec_fn=os.setpgrp).pid)
        open({str(tmp_path / 'pids')!r}, "w").write(" ".join(map(str, pids)))
        print("Building wheel (setup.py): started", flush=True)
        time.sleep(1)
        {trigger}
        time.sleep(300)
    """)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def test_supervisor_stops_the_whole_tree_at_the_guards_marker(tmp_path):
    marker = tmp_path / "nvcc-errors.txt"
    pip = _tree_script(tmp_path, f"open({str(marker)!r}, 'a').write('csrc/q.cu(7): error: boom\\n  (compiling csrc/q.cu)\\n')")
    log = tmp_path / "build.log"
    t0 = time.time()
    with open(log, "wb", buffering=0) as lf:
        result = S.supervise([str(pip)], dict(os.environ), lf, {"marker": str(marker), "progress": str(tmp_path / "p")})
    took = time.time() - t0
    assert result["error"] == "csrc/q.cu(7): error: boom" and result["rc"] != 0
    assert result["stopped_at"] - result["error_at"] < S.KILL_GRACE_S + 3
    assert took < 20
    pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
    assert not [p for p in pids if _alive(p)], "a compiler outlived the build (the TERM-ignoring one needs KILL)"
    text = log.read_text()
    assert "Building wheel (setup.py): started" in text and "[imagegen] error: csrc/q.cu(7): error: boom" in text


def test_supervisor_stops_at_an_error_line_in_a_verbose_stream(tmp_path, monkeypatch):
    monkeypatch.setenv("IMAGEGEN_BUILD_VERBOSE", "1")
    pip = _tree_script(tmp_path, "print('  /src/a.cpp:3:1: error: expected unqualified-id', flush=True)")
    with open(tmp_path / "build.log", "wb", buffering=0) as lf:
        result = S.supervise([str(pip)], dict(os.environ), lf, None)
    assert result["error"] == "/src/a.cpp:3:1: error: expected unqualified-id"
    pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
    assert not [p for p in pids if _alive(p)]


def test_supervisor_streams_progress_and_names_the_error_of_a_failed_build(tmp_path, monkeypatch):
    monkeypatch.setattr(S, "HEARTBEAT_S", 0.5)
    progress = tmp_path / "progress"
    pip = fake_tool(tmp_path, "fake-pip", f"""
        open({str(progress)!r}, "a").write("nvcc csrc/a.cu: 1.0 s\\n")
        time.sleep(1.5)
        print("x.cpp:9:2: error: pip printed this at its end")
        sys.exit(1)
    """)
    log = tmp_path / "build.log"
    with open(log, "wb", buffering=0) as lf:
        result = S.supervise([str(pip)], dict(os.environ), lf, {"marker": str(tmp_path / "m"), "progress": str(progress)})
    text = log.read_text()
    assert result["rc"] == 1 and result["error"] == "x.cpp:9:2: error: pip printed this at its end"
    assert "[imagegen] nvcc csrc/a.cu: 1.0 s" in text
    assert "[imagegen] still compiling: 0m01s, 1 compilation(s) done, last: nvcc csrc/a.cu: 1.0 s" in text


def test_supervisor_leaves_a_good_build_alone(tmp_path):
    pip = fake_tool(tmp_path, "fake-pip", "print('ok'); sys.exit(0)\n")
    with open(tmp_path / "build.log", "wb", buffering=0) as lf:
        result = S.supervise([str(pip)], dict(os.environ), lf, {"marker": str(tmp_path / "m"), "progress": str(tmp_path / "p")})
    assert result["rc"] == 0 and result["error"] is None


# ----------------------------------------------------------------------------- bake progress


def test_target_logs_grow_live_and_report_per_cell_progress(tmp_path):
    now = [0.0]
    said: list[str] = []
    logs = TargetLogs(tmp_path, ["a-1", "b-2"], say=said.append, clock=lambda: now[0])
    feed = [
        (0, "#7 [a-1 compile 1/1] RUN --mount=type=cache python /imagegen/imagegen_build.py build --out /imagegen/wheelhouse"),
        (1, "#7 0.51 [imagegen] $ python -m pip wheel ..."),
        (20, "#7 20.1 [imagegen] nvcc slow/slow_00.cu: 19.0 s"),
        (30, "#7 30.0 [imagegen] still compiling: 0m30s, 1 compilation(s) done, last: nvcc slow/slow_00.cu: 19.0 s"),
        (50, "#7 50.0 [imagegen] nvcc slow/slow_01.cu: 25.0 s"),
        (60, "#9 [b-2 compile 1/1] RUN python /imagegen/imagegen_build.py build --out /imagegen/wheelhouse"),
        (61, "#9 1.0 [imagegen] $ python -m pip wheel ..."),
        (62, "#9 2.0 [imagegen] error: ptxas /tmp/x.ptx, line 21; error   : Instruction 'wgmma.fence' not supported"),
        (63, "#9 ERROR: process \"python /imagegen/imagegen_build.py build\" did not complete successfully: exit code: 1"),
        (200, "#7 DONE 200.0s"),
    ]
    for t, line in feed:
        now[0] = t
        logs.feed(line)
        if t == 20:  # line-buffered: the log on disk already holds what came so far
            assert "slow_00.cu" in (tmp_path / "a-1.log").read_text()
    logs.close()
    progress = [s for s in said if "compil" in s]
    assert progress == [
        "[a-1] compiling",
        "[a-1] compiling, 0m50s, last: [imagegen] nvcc slow/slow_01.cu: 25.0 s",
        "[b-2] compiling",
        "[b-2] compile failed after 0m03s: ptxas /tmp/x.ptx, line 21; error   : Instruction 'wgmma.fence' not supported",
        "[a-1] compiled in 3m20s",
    ]
    assert logs.errors == {"b-2": "ptxas /tmp/x.ptx, line 21; error   : Instruction 'wgmma.fence' not supported"}
    assert logs.failed == {"b-2"}


def test_cached_compile_step_says_nothing(tmp_path):
    said: list[str] = []
    logs = TargetLogs(tmp_path, ["a-1"], say=said.append)
    logs.feed("#7 [a-1 compile 1/1] RUN python /imagegen/imagegen_build.py build --out /imagegen/wheelhouse")
    logs.feed("#7 CACHED")
    logs.close()
    assert not [s for s in said if "compil" in s]


@pytest.mark.parametrize("line,expected", [
    (b"broken.cu(4): error: expected a declaration", True),
    (b"ptxas /tmp/x.ptx, line 21; error   : Instruction 'wgmma.fence' not supported on .target 'sm_80'", True),
    (b"nvcc fatal   : Unsupported gpu architecture 'compute_999'", True),
    (b"  a.cpp:3:10: fatal error: foo.h: No such file or directory", True),
    (b"x.cu(1): catastrophic error: cannot open source file", True),
    (b"ptxas info    : Used 32 registers, 0 bytes cmem[0]", False),
    (b"c++ -Werror=format -c a.cpp", False),
    (b"ERROR: Failed building wheel for sageattention", False),
    (b"error: subprocess-exited-with-error", False),
])
def test_compiler_error_pattern(line, expected):
    assert (S._first_error(line + b"\n") is not None) == expected


def test_the_first_error_names_nvccs_temporary_file_without_its_folder():
    # The folder is the build's work folder, removed once the build failed; the one-line error needs
    # the room for the log's path.
    line = (b"ptxas /tmp/t/imagegen-work-x1/tmp/tmpxft_0000a1b2_00000000-6_k.ptx, line 20; error   : Instruction"
            b" 'wgmma.fence' not supported on .target 'sm_80'\n")
    assert S._first_error(line) == ("ptxas tmpxft_0000a1b2_00000000-6_k.ptx, line 20; error   : Instruction"
                                    " 'wgmma.fence' not supported on .target 'sm_80'")
    assert S._first_error(b"/src/csrc/a.cu(4): error: expected a declaration\n") == \
        "/src/csrc/a.cu(4): error: expected a declaration"
