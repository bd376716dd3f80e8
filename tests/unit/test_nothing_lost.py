"""Nothing lost, nothing left behind (issue 16, item 9): a wheel of other archs is never replaced
silently, concurrent runs get their own folders, the manifest is readable by others and points at
the kept log, and a signal to imagegen alone ends every process it started."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

from imagegen.wheelhouse import manifest as wheelhouse
from imagegen.wheelhouse import collect
from imagegen.executors import bake_run, results
from imagegen.executors import buildx as execute
from imagegen.finish.finisher import finish
from imagegen.interrupt import SIGNALS, descendants
from imagegen.model.arch_parse import parse_arch_list
from imagegen.model.catalogue import load_catalogue
from imagegen.model.cell import Plan
from imagegen.plan.matrix import make_cell

WHEEL = next((Path(__file__).parent.parent / "fixtures" / "wheels").glob("tiny_kernel-*.whl"))


def _cell(archs: str):
    r = load_catalogue().get("sage")
    return make_cell(r, r.version(None), "2.8", "12.8", "3.12", parse_arch_list(archs), "cuda")


def test_a_wheel_of_other_archs_is_not_replaced_without_force(tmp_path):
    out = tmp_path / "out"
    first = _cell("8.0")
    collect.place(out, first, WHEEL, inputs="a", record={})
    assert wheelhouse.replaced(out, first) is None  # same archs: a rebuild of the same thing
    second = _cell("9.0")
    other = wheelhouse.replaced(out, second)
    assert other is not None and WHEEL.name in other and "archs 8.0" in other
    said: list[str] = []
    # Refused before anything is rendered or baked: no engine is touched (none is needed here).
    (result,) = execute.build(Plan(cells=[second]), out=out, work=tmp_path / "work", finish=finish, say=said.append)
    assert result.status == "refused" and result.log is None  # a refusal, not a failed build (issue 32, item 16)
    assert "would be replaced by the wheel for archs 9.0" in result.error and "--force" in result.error
    assert not any("would be replaced" in line for line in said)  # said once, when the results are reported
    assert not (tmp_path / "work" / "runs").exists()
    summary = results.summary([result])
    assert "full log: None" not in summary and "--force to replace it" in summary
    # The first wheel is still there, recorded for its archs.
    manifest = wheelhouse.read_manifest(wheelhouse.cell_dir(out, first))
    assert manifest["cells"][first.name]["archs"] == "8.0"
    assert (wheelhouse.cell_dir(out, first) / WHEEL.name).is_file()


def test_manifest_and_wheel_get_the_umask_mode_and_no_temp_file_is_left(tmp_path):
    old = os.umask(0o022)
    try:
        dest = collect.place(tmp_path / "out", _cell("9.0"), WHEEL, inputs="a", record={})
    finally:
        os.umask(old)
    assert stat.S_IMODE((dest.parent / "manifest.json").stat().st_mode) == 0o644
    assert stat.S_IMODE(dest.stat().st_mode) == 0o644
    assert not list((tmp_path / "out").rglob("*.partial"))


def test_the_kept_log_is_a_copy_in_out(tmp_path):
    log = tmp_path / "work" / "build.log"
    log.parent.mkdir()
    log.write_text("compiled\n")
    kept = collect.keep_log(tmp_path / "out", _cell("9.0"), log)
    assert kept == tmp_path / "out" / "logs" / f"{_cell('9.0').name}.log" and kept.read_text() == "compiled\n"
    log.unlink()  # the work folder is temporary
    assert kept.is_file()


def test_runs_started_in_the_same_second_get_their_own_folders(tmp_path):
    cell = _cell("9.0")
    os.chdir(tmp_path)
    runs = [bake_run.prepare_run([cell], tmp_path / "work") for _ in range(3)]
    assert len({r.dir for r in runs}) == 3
    assert len({r.bake_file.read_text() for r in runs}) == 3  # each points at its own staging folder


# ------------------------------------------------------------------------------- signals

CHILD = textwrap.dedent("""
    import subprocess, sys
    from imagegen.interrupt import stopping_children
    try:
        with stopping_children():
            # a child that starts its own child, like `docker buildx bake` or `docker run`
            subprocess.run(["bash", "-c", "sleep {marker} & sleep {marker}; wait"])
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        sys.exit(130)
""")


def _sleepers(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in cmdline and b"sleep" in cmdline and b"bash" not in cmdline:
                found.append(int(entry))
    return found


def _wait_for(predicate, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def _signal_ends_the_tree(sig: int, tmp_path: Path) -> None:
    marker = f"{3000 + uuid.uuid4().int % 1000}.{uuid.uuid4().int % 1000:03d}"
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(marker=marker))
    # The child starts with the signal at its default, however the suite was started (a background job
    # of a script inherits SIGINT ignored, and imagegen keeps an ignored signal ignored, as Python does).
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[2],
                            preexec_fn=lambda: [signal.signal(s, signal.SIG_DFL) for s in SIGNALS])
    try:
        assert _wait_for(lambda: len(_sleepers(marker)) == 2, 20), "the grandchildren did not start"
        os.kill(proc.pid, sig)  # to imagegen alone, as a CI runner or supervisor sends it
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 130 and "interrupted" in out
        assert _wait_for(lambda: not _sleepers(marker), 5), "a grandchild outlived the signal"
    finally:
        proc.kill()
        for pid in _sleepers(marker):
            os.kill(pid, signal.SIGKILL)


def test_sigterm_to_imagegen_alone_ends_its_whole_tree(tmp_path):
    _signal_ends_the_tree(signal.SIGTERM, tmp_path)


def test_sigint_to_imagegen_alone_ends_its_whole_tree(tmp_path):
    _signal_ends_the_tree(signal.SIGINT, tmp_path)


def test_descendants_are_found_through_the_proc_tree():
    proc = subprocess.Popen(["bash", "-c", "sleep 30 & wait"])
    try:
        # Wait for bash's own child: other children of this test process (a server an earlier
        # test left running) may be in the tree too, so a count of two proves nothing.
        assert _wait_for(lambda: bool(descendants(proc.pid)), 10)
        grandchildren = descendants(proc.pid)
        tree = descendants()
        assert proc.pid in tree and all(g in tree for g in grandchildren)
        assert all(tree.index(proc.pid) < tree.index(g) for g in grandchildren)  # parents before children
    finally:
        proc.kill()
        proc.wait()
        subprocess.run(["pkill", "-f", "^sleep 30$"])
    json.dumps(tree)
