"""Tests for imagegen.interrupt: descendants() read from /proc (any root, odd process names), stop_tree()
(SIGTERM, then SIGKILL after the grace, then the registered cleanups, newest first), cleanup()'s scope,
and stopping_children()'s handlers: installed and restored, a signal raised as Stopped, a KeyboardInterrupt
stopping the tree, nothing done outside the main thread.

Every process started here is a Python sleeper with a unique marker in its command line; each test ends
the ones it started (by pid) whatever happens. stop_tree() ends *every* descendant of the calling
process, so it only ever runs inside a separate Python process, never in pytest's own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import uuid
from pathlib import Path

import pytest

from imagegen import interrupt
from imagegen.errors import Stopped

ROOT = Path(__file__).resolve().parents[2]

# Prints "ready" once it is running (and, with "stubborn", ignoring SIGTERM), then sleeps; argv[1] is the
# marker that lets the test find it. With a third argument it first starts a sleeper child of its own
# (and renames itself, so that its /proc/PID/stat name holds parentheses and spaces).
SLEEPER = textwrap.dedent("""
    import signal, subprocess, sys, time
    marker, mode = sys.argv[1], sys.argv[2]
    if mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if mode == "parent":
        with open("/proc/self/comm", "w") as fh:
            fh.write("a) 1 2 (b")
        child = subprocess.Popen([sys.executable, "-c", sys.argv[3], marker, "plain", sys.argv[3]],
                                 stdout=subprocess.PIPE, text=True)
        print(child.stdout.readline().strip() + " " + str(child.pid), flush=True)
    else:
        print("ready", flush=True)
    time.sleep(600)
""")


def _marked(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
            except OSError:
                continue
    return found


@pytest.fixture
def marker():
    """A unique marker; every process still carrying it is killed (by pid) at the end of the test."""
    value = f"imagegen-test-{uuid.uuid4().hex}"
    yield value
    for pid in _marked(value):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _sleeper(marker: str, mode: str = "plain") -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", SLEEPER, marker, mode, SLEEPER], stdout=subprocess.PIPE, text=True)
    return proc


def _end(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait(timeout=30)
    proc.stdout.close()


def _run_script(body: str, marker: str, ignored: tuple[signal.Signals, ...] = ()) -> dict:
    """Run ``body`` in a fresh Python (SLEEPER and MARKER defined); its last stdout line is JSON. The
    script starts with imagegen's signals at their defaults, ``ignored`` ignored, whatever the suite
    itself was started with (under `nohup` SIGHUP is ignored and children inherit that)."""
    script = f"SLEEPER = {SLEEPER!r}\nMARKER = {marker!r}\n" + textwrap.dedent(body)

    def dispositions():
        for sig in interrupt.SIGNALS:
            signal.signal(sig, signal.SIG_IGN if sig in ignored else signal.SIG_DFL)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          preexec_fn=dispositions)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------- descendants


def test_descendants_of_a_given_pid_lists_children_before_grandchildren(marker):
    parent = _sleeper(marker, "parent")
    try:
        ready, child = parent.stdout.readline().split()
        assert ready == "ready"
        child = int(child)
        assert interrupt.descendants(parent.pid) == [child]
        assert interrupt.descendants(child) == []
        mine = interrupt.descendants()
        assert mine.index(parent.pid) < mine.index(child)
    finally:
        _end(parent)


def test_a_process_name_with_parentheses_and_spaces_does_not_hide_its_children(marker):
    parent = _sleeper(marker, "parent")
    try:
        child = int(parent.stdout.readline().split()[1])
        stat = Path(f"/proc/{parent.pid}/stat").read_text()
        assert "(a) 1 2 (b)" in stat  # the name a naive split(" ") would misread
        assert interrupt.descendants(parent.pid) == [child]
    finally:
        _end(parent)


def test_descendants_of_a_process_that_is_gone_is_empty():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=30)
    assert interrupt.descendants(proc.pid) == []


# -------------------------------------------------------------------------------------- stop_tree


def test_stop_tree_terms_then_kills_then_runs_the_cleanups_newest_first(marker):
    result = _run_script("""
        import json, subprocess, sys
        from imagegen import interrupt

        polite = subprocess.Popen([sys.executable, "-c", SLEEPER, MARKER, "plain"], stdout=subprocess.PIPE, text=True)
        stubborn = subprocess.Popen([sys.executable, "-c", SLEEPER, MARKER, "stubborn"], stdout=subprocess.PIPE,
                                    text=True)
        assert polite.stdout.readline().strip() == stubborn.stdout.readline().strip() == "ready"
        order = []

        def failing():
            order.append("inner")
            raise RuntimeError("a cleanup that fails must not stop the others")

        with interrupt.cleanup(lambda: order.append("outer")):
            with interrupt.cleanup(failing):
                asked = interrupt.stop_tree(grace=0.5)
        codes = [polite.wait(timeout=30), stubborn.wait(timeout=30)]
        again = interrupt.stop_tree(grace=0.5)  # outside the blocks: no cleanup left, no process left
        print(json.dumps({"asked": asked, "codes": codes, "order": order, "again": again}))
    """, marker)
    assert result == {"asked": 2, "codes": [-signal.SIGTERM, -signal.SIGKILL], "order": ["inner", "outer"], "again": 0}
    assert _marked(marker) == []


def test_cleanup_unregisters_its_action_even_when_the_block_raises():
    before = list(interrupt._cleanups)

    def action():
        pass

    with pytest.raises(ValueError):
        with interrupt.cleanup(action):
            assert interrupt._cleanups[-1] is action
            raise ValueError("boom")
    assert interrupt._cleanups == before


# ------------------------------------------------------------------------------ stopping_children


def test_stopping_children_installs_its_handlers_and_restores_the_previous_ones():
    def mine(signum, frame):
        pass

    previous = {sig: signal.getsignal(sig) for sig in interrupt.SIGNALS}
    # Known dispositions, however the suite was started (a script's background job has SIGINT ignored,
    # and an ignored signal stays ignored: the test below).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, mine)
    try:
        with interrupt.stopping_children():
            inside = {sig: signal.getsignal(sig) for sig in interrupt.SIGNALS}
        assert len(set(inside.values())) == 1 and inside[signal.SIGHUP] not in (mine, signal.SIG_DFL, signal.SIG_IGN)
        assert signal.getsignal(signal.SIGHUP) is mine
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def test_outside_the_main_thread_stopping_children_does_nothing():
    before = {sig: signal.getsignal(sig) for sig in interrupt.SIGNALS}
    seen = {}

    def worker():
        with interrupt.stopping_children():
            seen.update({sig: signal.getsignal(sig) for sig in interrupt.SIGNALS})
        seen["done"] = True

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join(timeout=30)
    assert seen.pop("done") is True and seen == before


def test_a_signal_becomes_stopped_after_the_cleanups_and_a_second_signal_cannot_cut_them_short(marker):
    result = _run_script("""
        import json, os, signal, subprocess, sys
        from imagegen import interrupt
        from imagegen.errors import Stopped

        child = subprocess.Popen([sys.executable, "-c", SLEEPER, MARKER, "plain"], stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline().strip() == "ready"
        ran = []

        def cleanup():
            os.kill(os.getpid(), signal.SIGTERM)  # a second signal while stopping: ignored
            ran.append("cleanup finished")

        try:
            with interrupt.stopping_children():
                with interrupt.cleanup(cleanup):
                    os.kill(os.getpid(), signal.SIGHUP)
                    for _ in range(10 ** 8):  # the handler runs at the next bytecode; this is never finished
                        pass
            caught = None
        except Stopped as exc:
            caught = [type(exc).__name__, str(exc), isinstance(exc, KeyboardInterrupt)]
        restored = [signal.getsignal(s) == signal.SIG_DFL for s in (signal.SIGHUP, signal.SIGTERM)]
        print(json.dumps({"caught": caught, "ran": ran, "child": child.wait(timeout=30), "restored": restored}))
    """, marker)
    assert result == {"caught": ["Stopped", "SIGHUP", True], "ran": ["cleanup finished"], "child": -signal.SIGTERM,
                      "restored": [True, True]}


def test_a_signal_ignored_at_start_stays_ignored_as_under_nohup(marker):
    result = _run_script("""
        import json, os, signal, time
        from imagegen import interrupt
        from imagegen.errors import Stopped

        seen = []
        try:
            with interrupt.stopping_children():
                seen.append(signal.getsignal(signal.SIGHUP) == signal.SIG_IGN)
                os.kill(os.getpid(), signal.SIGHUP)  # the logout of `nohup imagegen build ...`: survived
                time.sleep(0.2)
                seen.append("survived SIGHUP")
                os.kill(os.getpid(), signal.SIGTERM)  # still stops imagegen
                for _ in range(10 ** 8):
                    pass
            caught = None
        except Stopped as exc:
            caught = str(exc)
        print(json.dumps({"seen": seen, "caught": caught,
                          "still_ignored": signal.getsignal(signal.SIGHUP) == signal.SIG_IGN}))
    """, marker, ignored=(signal.SIGHUP,))
    assert result == {"seen": [True, "survived SIGHUP"], "caught": "SIGTERM", "still_ignored": True}


def test_a_keyboard_interrupt_raised_inside_stops_the_tree_but_an_ordinary_error_does_not(marker):
    result = _run_script("""
        import json, subprocess, sys
        from imagegen import interrupt

        def sleeper():
            proc = subprocess.Popen([sys.executable, "-c", SLEEPER, MARKER, "plain"], stdout=subprocess.PIPE, text=True)
            assert proc.stdout.readline().strip() == "ready"
            return proc

        survivor = sleeper()
        try:
            with interrupt.stopping_children():
                raise ValueError("an ordinary failure: the caller decides")
        except ValueError:
            pass
        alive_after_error = survivor.poll() is None
        survivor.kill()
        survivor.wait(timeout=30)

        victim = sleeper()
        try:
            with interrupt.stopping_children():
                raise KeyboardInterrupt  # Ctrl-C as Python raises it, not through the handler
        except KeyboardInterrupt:
            pass
        print(json.dumps({"alive_after_error": alive_after_error, "victim": victim.wait(timeout=30)}))
    """, marker)
    assert result == {"alive_after_error": True, "victim": -signal.SIGTERM}


def test_stopped_is_exported_for_callers():
    assert interrupt.Stopped is Stopped and "Stopped" in interrupt.__all__
