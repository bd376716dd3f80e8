"""Stop what imagegen started when imagegen itself is stopped.

A CI runner or a supervisor sends SIGTERM (or SIGINT, SIGHUP) to imagegen's process alone, not to
its process group: without help, `docker buildx bake` and `docker run` go on compiling after
imagegen is gone (measured: ~40 s for a bake, the whole build for a container). Inside
``stopping_children()`` such a signal ends imagegen's whole process tree: every descendant gets
SIGTERM (buildx cancels its solve, which stops the RUN in the daemon), then SIGKILL after a grace
period, and the registered cleanups run (`docker rm -f` of a named container whose client is gone).
Nothing half-written is left: outputs are published by rename only after they are complete.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

from imagegen.errors import Stopped

GRACE_S = 10.0  # buildx needs a moment to cancel its solve before it exits
_cleanups: list[Callable[[], None]] = []
_lock = threading.Lock()


def descendants(pid: int | None = None) -> list[int]:
    """Every process below ``pid`` (default: this one), read from /proc; parents before children."""
    root = os.getpid() if pid is None else pid
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read(4096).decode("ascii", "replace")
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ')'.
        try:
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        except (ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out: list[int] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.append(child)
                todo.append(child)
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read(512).decode("ascii", "replace")
        return stat[stat.rindex(")") + 2] != "Z"  # a zombie has ended; its parent reaps it
    except (OSError, ValueError, IndexError):
        return False


def stop_tree(grace: float = GRACE_S) -> int:
    """SIGTERM every descendant, SIGKILL what is left after ``grace`` seconds, run the cleanups.
    Returns how many processes were asked to stop."""
    pids = descendants()
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    for pid in descendants() + pids:
        if _alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    with _lock:
        cleanups = list(reversed(_cleanups))
    for cleanup in cleanups:
        try:
            cleanup()
        except Exception:  # best effort: the signal's exit matters more than one cleanup
            pass
    return len(pids)


@contextmanager
def cleanup(action: Callable[[], None]) -> Iterator[None]:
    """Run ``action`` if imagegen is stopped while inside this block (e.g. remove a named container)."""
    with _lock:
        _cleanups.append(action)
    try:
        yield
    finally:
        with _lock:
            _cleanups.remove(action)


SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _stop(signum: int, frame: object) -> None:
    # The tree is stopped here, in the handler, while it is still whole: once the exception unwinds,
    # subprocess.run kills its direct child and that child's own children would be orphaned (no
    # longer imagegen's descendants, still compiling).
    for sig in SIGNALS:  # a second signal while stopping must not cut the cleanup short
        signal.signal(sig, signal.SIG_IGN)
    stop_tree()
    raise Stopped(signal.Signals(signum).name)


@contextmanager
def stopping_children() -> Iterator[None]:
    """Inside this block, SIGINT/SIGTERM/SIGHUP end imagegen's whole process tree, then propagate as
    KeyboardInterrupt. Outside the main thread (signals go to the main thread only) it does nothing.
    A signal that was ignored when imagegen started stays ignored: `nohup imagegen build ...` must
    survive the logout's SIGHUP (and a shell's background job its SIGINT), as any POSIX tool does."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in SIGNALS}
    for sig in SIGNALS:
        if previous[sig] is not signal.SIG_IGN:
            signal.signal(sig, _stop)
    try:
        yield
    except KeyboardInterrupt as exc:
        if not isinstance(exc, Stopped):  # raised some other way: the tree still has to go
            stop_tree()
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


__all__ = ["cleanup", "descendants", "stop_tree", "stopping_children", "Stopped"]
