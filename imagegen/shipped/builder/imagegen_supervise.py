#!/usr/bin/env python3
"""imagegen's build supervision: the nvcc guard torch's ninja build runs each nvcc through (it reports a
failing compilation at once, and each finished one), and the supervisor of the package's build (its
output live in the log, a heartbeat, the whole session stopped at the first compiler error or a signal).

Shipped beside imagegen_build.py (its `build` and `audit` steps use it), under the same rules: the standard
library only, Python 3.8+, copied verbatim into every builder image and native build. The guard comes
first and starts on `python -S imagegen_supervise.py nvcc-guard N NVCC...` without importing anything
else: it runs once per compilation.
"""

import os
import sys

# ------------------------------------------------------------------------------------------------
# nvcc guard: first in the file, so that the guard's start (once per compilation) imports nothing else

# A compiler's error line: nvcc/cicc `foo.cu(12): error: ...`, gcc/clang `foo.cpp:3:1: error: ...`,
# ptxas `ptxas /tmp/x.ptx, line 20; error   : ...`, `nvcc fatal   : ...`. Leading blanks allowed
# (pip -v indents a build's output).
_COMPILER_ERROR = (rb"(?m)^[ \t]*(?:\S[^\n]*?(?:\(\d+\): (?:catastrophic )?error\b|:\d+(?::\d+)?: (?:fatal )?error\b"
                   rb"|; error\s*:)|(?:ptxas|nvcc|nvlink|cicc|fatbinary|cc1plus|cc1) (?:fatal|error)\s*:)[^\n]*")
MARKER_ENV = "IMAGEGEN_NVCC_FAILED"  # the file a failing nvcc appends its first error lines to
PROGRESS_ENV = "IMAGEGEN_NVCC_PROGRESS"  # the file each finished nvcc appends one line to
GUARD_VARS = (MARKER_ENV, PROGRESS_ENV)


def _write_all(fd, data):
    while data:
        data = data[os.write(fd, data):]


def _append(path, data):
    """One write() with O_APPEND: lines of guards that finish together do not interleave."""
    if not path:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)
    except OSError:
        pass


def _source_of(args):
    """The file an nvcc command compiles (`-c foo.cu`; torch's flags hold a `-c` of their own), as
    dir/name: enough to say which one."""
    src = next((a for a in reversed(args) if a.endswith((".cu", ".cpp", ".cc", ".cxx", ".c"))), None) \
        or next((args[i + 1] for i in range(len(args) - 2, -1, -1) if args[i] == "-c"), "?")
    return os.path.join(os.path.basename(os.path.dirname(src)), os.path.basename(src))


def nvcc_guard(argv):
    """`nvcc-guard N CMD(N words) ARGS...`: run CMD ARGS (nvcc, or `ccache nvcc`) with its output
    unchanged, and tell the build's supervisor (cmd_build) about it through two files named in the
    environment: a failure appends its first error lines to $IMAGEGEN_NVCC_FAILED (as soon as an
    error line appears, and at a non-zero exit), a success one line to $IMAGEGEN_NVCC_PROGRESS.

    stdout is nvcc's own; stderr (where nvcc, cicc, ptxas and the host compiler write errors) passes
    through a pipe in 64 KiB chunks, forwarded at once and searched by one regex per chunk: nothing
    per line, and nvcc never waits on the guard. Returns nvcc's exit status."""
    import re
    import subprocess
    import time

    if not argv or not argv[0].isdigit() or int(argv[0]) < 1 or len(argv) <= int(argv[0]):
        sys.stderr.write("imagegen nvcc-guard: usage: nvcc-guard N CMD... ARGS...\n")
        return 2
    n = int(argv[0])
    cmd = argv[1:]
    marker = os.environ.get(MARKER_ENV)
    started = time.time()
    try:
        proc = subprocess.Popen(cmd, stderr=subprocess.PIPE)
    except OSError as exc:
        text = ("imagegen nvcc-guard: cannot run %s: %s\n" % (cmd[0], exc)).encode()
        sys.stderr.buffer.write(text)
        _append(marker, text)
        return 127
    error = re.compile(_COMPILER_ERROR)
    fd = proc.stderr.fileno()
    carry = tail = b""  # the start of a line split between chunks; the last lines, for a bare failure
    reported = not marker
    while True:
        chunk = os.read(fd, 65536)
        if chunk:
            try:
                _write_all(2, chunk)
            except OSError:  # the reader (ninja) is gone: keep draining, nvcc must not block
                pass
            if reported:
                continue
            window = carry + chunk
            cut = window.rfind(b"\n") + 1
            lines, carry = window[:cut], window[cut:]
        else:
            lines, carry = carry, b""
        if not reported and (b"rror" in lines or b"fatal" in lines):
            found = error.findall(lines)
            if found:
                reported = True
                _append(marker, b"\n".join(line.strip() for line in found[:5]) + b"\n  (compiling "
                        + _source_of(cmd[n:]).encode() + b")\n")
        tail = (tail + lines)[-2048:]
        if not chunk:
            break
    rc = proc.wait()
    if rc != 0 and not reported:
        last = [ln.strip() for ln in tail.decode("utf-8", "replace").splitlines() if ln.strip()][-3:]
        _append(marker, ("%s exited with status %d compiling %s%s\n" % (
            os.path.basename(cmd[n - 1]), rc, _source_of(cmd[n:]), (": " + " | ".join(last)) if last else "")).encode())
    elif rc == 0:
        _append(os.environ.get(PROGRESS_ENV), ("nvcc %s: %.1f s\n" % (_source_of(cmd[n:]), time.time() - started)).encode())
    return rc if rc >= 0 else 128 - rc


if __name__ == "__main__" and sys.argv[1:2] == ["nvcc-guard"]:
    sys.exit(nvcc_guard(sys.argv[2:]))


import re  # noqa: E402 (after the guard's fast path)
import shutil  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from imagegen_toolchain import log  # noqa: E402

# ------------------------------------------------------------------------------------------------
# build supervision: stop at the first compiler error, keep the log live

HEARTBEAT_S = 30  # a "still compiling" line this often, so a long compile is never silent
POLL_S = 0.2  # how often the supervisor looks at the guard's files and the build
KILL_GRACE_S = 3.0  # between TERM and KILL


def torch_cuda_home(env):
    """CUDA_HOME as torch.utils.cpp_extension finds it: $CUDA_HOME or $CUDA_PATH, else the folder
    above the first nvcc on PATH, else /usr/local/cuda (the build and the audit both ask this)."""
    home = env.get("CUDA_HOME") or env.get("CUDA_PATH")
    if not home:
        found = shutil.which("nvcc", path=env.get("PATH"))
        home = os.path.dirname(os.path.dirname(found)) if found else "/usr/local/cuda"
    return home


def torch_nvcc(env):
    """The nvcc command torch's ninja build would run (shell words): $PYTORCH_NVCC, else
    CUDA_HOME/bin/nvcc found the way torch.utils.cpp_extension finds it, behind ccache/sccache when
    this torch wraps its compilers itself (torch >= 2.13, unless TORCH_NO_COMPILER_WRAPPER)."""
    if env.get("PYTORCH_NVCC"):
        return env["PYTORCH_NVCC"]
    nvcc = os.path.join(torch_cuda_home(env), "bin", "nvcc")
    if not os.path.isfile(nvcc):
        return None
    words = [nvcc]
    if not env.get("TORCH_NO_COMPILER_WRAPPER") and _torch_wraps_compilers():
        wrapper = shutil.which("ccache", path=env.get("PATH")) and "ccache" or shutil.which("sccache", path=env.get("PATH")) and "sccache"
        if wrapper:
            words.insert(0, shutil.which(wrapper, path=env.get("PATH")))
    return " ".join(_shell_quote(w) for w in words)


def _torch_wraps_compilers():
    try:
        import importlib.util
        spec = importlib.util.find_spec("torch")
        with open(os.path.join(os.path.dirname(spec.origin), "utils", "cpp_extension.py"), encoding="utf-8") as fh:
            return "def _wrap_compiler(" in fh.read()
    except (ImportError, AttributeError, TypeError, OSError, ValueError):
        return False


def _shell_quote(word):
    import shlex
    return shlex.quote(word)


def guard_nvcc(env, log_dir, work):
    """Route torch's nvcc (PYTORCH_NVCC, which torch's ninja builds honour; ccache's setting is kept
    inside) through this script's nvcc-guard, which reports a failing compilation at once. Returns
    the guard's files {marker, progress}, or None when there is no nvcc to guard. Neither these
    variables nor PYTORCH_NVCC are in `env`'s printed form (chosen_env): a plain `pip wheel` with
    those repeats the build without the guard."""
    real = torch_nvcc(env)
    if not real:
        return None
    import shlex
    try:
        words = len(shlex.split(real))
    except ValueError:
        return None
    marker = os.path.join(log_dir, "nvcc-errors.txt")
    progress = os.path.join(work, "nvcc-progress.txt")
    for f in (marker, progress):
        if os.path.exists(f):
            os.unlink(f)
    env["PYTORCH_NVCC"] = "%s -S %s nvcc-guard %d %s" % (_shell_quote(sys.executable), _shell_quote(os.path.abspath(__file__)),
                                                         words, real)
    env[MARKER_ENV] = marker
    env[PROGRESS_ENV] = progress
    return {"marker": marker, "progress": progress}


def _first_error(data):
    m = re.search(_COMPILER_ERROR, data)
    return _without_temp_folders(m.group(0).strip().decode("utf-8", "replace")) if m else None


def _without_temp_folders(line):
    """nvcc's temporary files are gone by the time anyone reads an error: their name is enough, and
    the one-line error keeps room for the log's path."""
    return re.sub(r"(?<!\S)/\S*/(tmpxft_)", r"\1", line)


def supervise(cmd, env, log_file, guard, deadline=None):
    """Run the build (``cmd``, pip wheel) in a session of its own, its output to stdout and
    ``log_file`` chunk by chunk as it comes. Stop it, every process of it (pip, setup.py, ninja,
    nvcc, cicc, ptxas, the host compiler), at the first compiler error: the guard's marker file, or
    an error line in the output when pip shows it (IMAGEGEN_BUILD_VERBOSE); or at ``deadline`` (a
    time.time(), the build's budget: then ``budget_spent`` is true). Returns {rc, error (its first
    line, or None), how, error_at, stopped_at, budget_spent}."""
    log("$ " + " ".join(cmd))
    started = time.time()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    lock = threading.Lock()
    stream_error = []
    scan = os.environ.get("IMAGEGEN_BUILD_VERBOSE", "").lower() in ("1", "true", "yes")
    out = getattr(sys.stdout, "buffer", None)

    def emit(data):
        with lock:
            if out is not None:
                try:
                    out.write(data)
                    out.flush()
                except (OSError, ValueError):
                    pass
            log_file.write(data)

    def reader():
        fd = proc.stdout.fileno()
        carry = b""
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                return
            emit(chunk)
            if scan and not stream_error:
                window = carry + chunk
                cut = window.rfind(b"\n") + 1
                lines, carry = window[:cut], window[cut:][-65536:]
                if b"rror" in lines or b"fatal" in lines:
                    found = _first_error(lines)
                    if found:
                        stream_error.append((found, time.time()))

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    marker = guard and guard["marker"]
    progress = guard and guard["progress"]
    offset, compiled, last = 0, 0, ""
    next_beat = started + HEARTBEAT_S
    error = error_at = None
    how = ""
    while True:
        rc = proc.poll()
        if progress:
            offset, lines = _read_new(progress, offset)
            if lines:
                compiled += len(lines)
                last = lines[-1]
                emit(b"".join(b"[imagegen] " + line.encode() + b"\n" for line in lines))
        if marker and os.path.exists(marker) and os.path.getsize(marker) > 0:
            error_at = time.time()
            with open(marker, "rb") as fh:
                text = fh.read()
            error = _without_temp_folders(text.decode("utf-8", "replace").splitlines()[0].strip())
            how = "nvcc failed, so the build was stopped"
        elif stream_error:
            error, error_at = stream_error[0]
            how = "the compiler failed, so the build was stopped"
        if error:
            emit(b"[imagegen] error: " + error.encode() + b"\n")
            if marker and os.path.exists(marker):
                with open(marker, "rb") as fh:
                    emit(b"".join(b"[imagegen] | " + line + b"\n" for line in fh.read().splitlines()))
            stop_session(proc)
            rc = proc.wait()
            break
        if rc is not None:
            break
        now = time.time()
        if deadline is not None and now >= deadline:
            emit(("[imagegen] the build's budget is spent after %d compilation(s): stopping it to keep its state\n"
                  % compiled).encode())
            stop_session(proc)
            rc = proc.wait()
            thread.join(timeout=10)
            return {"rc": rc, "error": None, "how": "", "error_at": None, "stopped_at": time.time(),
                    "budget_spent": True}
        if now >= next_beat:
            elapsed = int(now - started)
            emit(("[imagegen] still compiling: %dm%02ds, %d compilation(s) done%s\n"
                  % (elapsed // 60, elapsed % 60, compiled, ", last: " + last if last else "")).encode())
            next_beat = now + HEARTBEAT_S
        time.sleep(POLL_S)
    thread.join(timeout=10)
    stopped_at = time.time()
    if rc != 0 and not error:
        # pip prints a failed build's output at its end: name the first compiler error in it.
        try:
            with open(log_file.name, "rb") as fh:
                error = _first_error(fh.read())
        except (OSError, AttributeError, TypeError):
            error = None
        error = error or "the build failed (exit %d): %s" % (rc, " ".join(cmd))
        how = "pip wheel exited with %d" % rc
        log_file.write(b"[imagegen] error: " + error.encode() + b"\n")
    if error:
        log_file.write(("[imagegen] build stopped %.1f s after the first error was seen\n"
                        % (stopped_at - (error_at or stopped_at))).encode())
    return {"rc": rc if rc and rc > 0 else (1 if error else rc), "error": error, "how": how,
            "error_at": error_at, "stopped_at": stopped_at, "budget_spent": False}


def _read_new(path, offset):
    """Whole lines appended to ``path`` since ``offset``: (new offset, lines)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except OSError:
        return offset, []
    cut = data.rfind(b"\n") + 1
    return offset + cut, data[:cut].decode("utf-8", "replace").splitlines()


def session_pids(sid):
    """Live processes (not zombies) of session ``sid``, from /proc; None without /proc."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    pids = []
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as fh:
                stat = fh.read()
            fields = stat[stat.rindex(b")") + 2:].split()
            if int(fields[3]) == sid and fields[0] not in (b"Z", b"X"):
                pids.append(int(name))
        except (OSError, ValueError, IndexError):
            continue
    return pids


def stop_session(proc, grace=KILL_GRACE_S):
    """TERM, then after ``grace`` seconds KILL, every process of the session ``proc`` leads. A
    process group is not enough: ninja starts each compiler in a group of its own."""
    sid = proc.pid

    def signal_all(sig):
        pids = session_pids(sid)
        for pid in pids or []:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        try:
            os.killpg(sid, sig)
        except OSError:
            pass
        return pids if pids is not None else ([sid] if proc.poll() is None else [])

    if not signal_all(signal.SIGTERM):
        return
    deadline = time.time() + grace
    while time.time() < deadline:
        proc.poll()  # reap the leader, so that it does not count as alive
        if not session_pids(sid) and proc.poll() is not None:
            return
        time.sleep(0.05)
    for _ in range(100):
        proc.poll()
        if not signal_all(signal.SIGKILL):
            return
        time.sleep(0.05)
