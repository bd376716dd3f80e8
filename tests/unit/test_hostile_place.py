"""Issue 32, items 15 and 16: placing a wheel in the wheelhouse is atomic with its check, and a refusal
is not a failed build.

- 15: two builds of one cell for different archs, started together, both passed the "would be
  replaced" check made before building, and the second to place its wheel silently replaced the
  first's (both exited 0). Placement now re-checks under the cell folder's lock (imagegen.wheelhouse.collect.
  placing): one wins, the other is refused and says so. The manifest's read-modify-write is under the
  same lock, so two cells placed into one folder at once both keep their entries. Tested with real
  processes (and threads) calling the real placement, started together.
- 16: "would be replaced" and "this builder cannot run arm64" exited 5 ("a build failed"), said three
  times, ending "(log: None)". A refusal is now a RefusedError: exit 10, one line.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from imagegen import cli, engine
from imagegen.wheelhouse import manifest as wheelhouse
from imagegen.wheelhouse import collect
from imagegen.errors import BuildError, RefusedError
from imagegen.executors import results as report
from imagegen.finish.finisher import finish
from imagegen.model.arch_parse import parse_arch_list
from imagegen.model.catalogue import load_catalogue
from imagegen.plan.matrix import make_cell
from imagegen.model.cell import CellResult
from tests.unit.executor_fixtures import WHEEL, temp_files_under, tiny_cell

ROOT = Path(__file__).resolve().parents[2]
NAME = "sageattention-2.2.0+cu128torch2.8-cp312-cp312-linux_x86_64.whl"


def _sage(archs: str, python: str = "3.12"):
    r = load_catalogue().get("sage")
    return make_cell(r, r.version(None), "2.8", "12.8", python, parse_arch_list(archs), "cuda")


def _big_wheel(folder: Path, name: str, fill: bytes, mib: int = 24) -> Path:
    """A stand-in wheel of ``mib`` MiB (placement copies and hashes it: time enough for two placers
    started together to overlap, as two real builds finishing together do)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    with path.open("wb") as fh:
        for _ in range(mib):
            fh.write(fill * (1 << 20))
    return path


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# One placer: the cell's archs and Python, its wheel, then the real placement once told to go.
PLACER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from imagegen.wheelhouse import collect
    from imagegen.errors import ImagegenError
    from imagegen.model.arch_parse import parse_arch_list
    from imagegen.model.catalogue import load_catalogue
    from imagegen.plan.matrix import make_cell

    out, archs, python, wheel, ready, go = sys.argv[1:]
    r = load_catalogue().get("sage")
    cell = make_cell(r, r.version(None), "2.8", "12.8", python, parse_arch_list(archs), "cuda")
    Path(ready).touch()
    while not Path(go).exists():
        time.sleep(0.0005)
    try:
        collect.place(Path(out), cell, Path(wheel), inputs=archs + python, record={})
    except ImagegenError as exc:
        print("imagegen: error: " + str(exc), file=sys.stderr)
        sys.exit(exc.exit_code)
""")


def _place_at_once(tmp_path: Path, out: Path, jobs: list[tuple[str, str, Path]]) -> list[subprocess.CompletedProcess]:
    """Start one process per (archs, python, wheel), let them all place at the same moment (a barrier:
    each says it is ready, then all are told to go together) and return how each ended."""
    sync = tmp_path / f"sync-{time.monotonic_ns()}"
    sync.mkdir()
    go = sync / "go"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", PLACER, str(out), archs, python, str(wheel), str(sync / f"ready{i}"),
                               str(go)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for i, (archs, python, wheel) in enumerate(jobs)]
    deadline = time.monotonic() + 60
    while not all((sync / f"ready{i}").exists() for i in range(len(jobs))):
        assert time.monotonic() < deadline, "the placers did not start"
        time.sleep(0.01)
    go.touch()
    done = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=120)
        done.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    return done


# --------------------------------------------------------------------------------------------
# 15: concurrent placement


@pytest.mark.parametrize("round_", range(2))
def test_two_processes_placing_one_cell_for_two_archs_at_once_lose_no_wheel_silently(tmp_path, round_):
    out = tmp_path / "out"
    wheels = {"8.6": _big_wheel(tmp_path / "a", NAME, b"6"), "8.9": _big_wheel(tmp_path / "b", NAME, b"9")}
    ended = dict(zip(wheels, _place_at_once(tmp_path, out, [(a, "3.12", w) for a, w in wheels.items()])))
    won = [a for a, p in ended.items() if p.returncode == 0]
    lost = [a for a, p in ended.items() if p.returncode != 0]
    # One places its wheel; the other is refused and says so, in one line, with the refusal's exit code.
    assert len(won) == 1 and len(lost) == 1, {a: (p.returncode, p.stderr) for a, p in ended.items()}
    refusal = ended[lost[0]]
    assert refusal.returncode == RefusedError.exit_code == 10
    assert refusal.stderr.count("\n") == 1 and refusal.stderr.startswith("imagegen: error: ")
    assert f"would be replaced by the wheel for archs {lost[0]}" in refusal.stderr and "--force" in refusal.stderr
    assert "Traceback" not in refusal.stderr
    # What the wheelhouse holds is the winner's wheel, and its manifest says so.
    folder = wheelhouse.cell_dir(out, _sage("8.6"))
    entry = wheelhouse.read_manifest(folder)["cells"][_sage("8.6").name]
    assert entry["archs"] == won[0] and entry["sha256"] == _digest(folder / NAME) == _digest(wheels[won[0]])
    assert sorted(p.name for p in folder.iterdir()) == ["manifest.json", NAME]  # no lock or temp file left
    assert wheels[lost[0]].is_file()  # the refused build's wheel is where its message says


@pytest.mark.parametrize("round_", range(2))
def test_two_cells_placed_into_one_folder_at_once_both_keep_their_manifest_entry(tmp_path, round_):
    out = tmp_path / "out"
    jobs = [("9.0", py, _big_wheel(tmp_path / py, NAME.replace("cp312", "cp" + py.replace(".", "")), fill))
            for py, fill in (("3.11", b"1"), ("3.12", b"2"))]
    ended = _place_at_once(tmp_path, out, jobs)
    assert [p.returncode for p in ended] == [0, 0], [p.stderr for p in ended]
    folder = wheelhouse.cell_dir(out, _sage("9.0"))
    cells = wheelhouse.read_manifest(folder)["cells"]
    assert sorted(cells) == sorted(_sage("9.0", py).name for py, _, _ in [(j[1], 0, 0) for j in jobs])
    for _, py, wheel in jobs:
        assert cells[_sage("9.0", py).name]["sha256"] == _digest(folder / wheel.name) == _digest(wheel)
    assert len(wheelhouse.verified_wheels(out)) == 2


def test_two_threads_finishing_one_cell_for_two_archs_at_once_one_wins_and_the_other_is_refused(tmp_path, monkeypatch):
    """The build's own finish step (verify, then place with the log), from two threads at once, as a
    build split over two builders runs it."""
    temp_files_under(tmp_path, monkeypatch)
    out = tmp_path / "out"
    cells = {"8.0": tiny_cell("8.0"), "9.0": tiny_cell("9.0")}  # one cell, two archs; the fixture has both
    barrier = threading.Barrier(2)
    ended: dict[str, CellResult] = {}

    def build(archs: str) -> None:
        stage = tmp_path / "stage" / archs
        stage.mkdir(parents=True)
        shutil.copy(WHEEL, stage / WHEEL.name)
        (stage / "build.log").write_text(f"compiled for {archs}\n")
        barrier.wait()
        ended[archs] = finish(cells[archs], [stage / WHEEL.name], out=out, inputs=archs, log=stage / "build.log",
                              seconds=1.0)

    threads = [threading.Thread(target=build, args=(a,)) for a in cells]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    statuses = sorted(r.status for r in ended.values())
    assert statuses == ["built", "refused"], {a: (r.status, r.error) for a, r in ended.items()}
    won = next(a for a, r in ended.items() if r.status == "built")
    lost = next(a for a, r in ended.items() if r.status == "refused")
    assert f"would be replaced by the wheel for archs {lost}" in ended[lost].error and ended[lost].wheel is None
    entry = wheelhouse.read_manifest(wheelhouse.cell_dir(out, cells[won]))["cells"][cells[won].name]
    assert entry["archs"] == won
    # The kept log is the winner's: the refused build's log did not replace it.
    assert Path(entry["log"]).read_text() == f"compiled for {won}\n"


def test_force_replaces_at_placement_and_a_rebuild_of_the_same_archs_is_no_conflict(tmp_path):
    out = tmp_path / "out"
    first = _big_wheel(tmp_path / "a", NAME, b"a", mib=1)
    second = _big_wheel(tmp_path / "b", NAME, b"b", mib=1)
    collect.place(out, _sage("8.6"), first, inputs="a", record={})
    with pytest.raises(RefusedError, match="would be replaced by the wheel for archs 8.6;8.9"):
        collect.place(out, _sage("8.6;8.9"), second, inputs="b", record={})
    folder = wheelhouse.cell_dir(out, _sage("8.6"))
    assert _digest(folder / NAME) == _digest(first)  # nothing replaced
    collect.place(out, _sage("8.6"), second, inputs="b", record={})  # the same archs: a rebuild replaces
    assert _digest(folder / NAME) == _digest(second)
    collect.place(out, _sage("8.9"), first, inputs="c", record={}, force=True)
    assert wheelhouse.read_manifest(folder)["cells"][_sage("8.9").name]["archs"] == "8.9"


def test_an_abi3_wheel_another_python_cell_lists_for_other_archs_is_not_replaced(tmp_path):
    out = tmp_path / "out"
    shared = NAME.replace("cp312-cp312", "cp39-abi3")
    collect.place(out, _sage("8.6", "3.11"), _big_wheel(tmp_path / "a", shared, b"a", mib=1), inputs="a", record={})
    with pytest.raises(RefusedError, match=r"\(built for archs 8\.6\) would be replaced by the wheel for archs 9\.0"):
        collect.place(out, _sage("9.0", "3.12"), _big_wheel(tmp_path / "b", shared, b"b", mib=1), inputs="b",
                        record={})


def test_a_lock_file_that_is_a_symlink_is_refused_and_its_target_untouched(tmp_path):
    out = tmp_path / "out"
    folder = wheelhouse.cell_dir(out, _sage("8.6"))
    folder.mkdir(parents=True)
    target = tmp_path / "precious"
    target.write_text("keep")
    (folder / collect.LOCK).symlink_to(target)
    with pytest.raises(Exception) as info:
        collect.place(out, _sage("8.6"), _big_wheel(tmp_path / "a", NAME, b"a", mib=1), inputs="a", record={})
    assert info.value.__class__.__name__ == "PublishError" and "lock" in str(info.value)
    assert target.read_text() == "keep" and not (folder / NAME).exists()


# --------------------------------------------------------------------------------------------
# 16: a refusal has its own exit code and one message


def _wheel_of_other_archs(out: Path) -> Path:
    return collect.place(out, _sage("8.0"), WHEEL, inputs="earlier", record={})


def test_a_build_refused_before_it_runs_exits_10_with_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(engine, "bake", lambda *a, **k: pytest.fail("a refused cell is not built"))
    wheel = _wheel_of_other_archs(tmp_path / "out")
    code = cli.main(["build", "sage", "--torch", "2.8", "--cuda", "12.8", "--python", "3.12", "--arch", "9.0",
                     "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work")])
    captured = capsys.readouterr()
    assert code == 10
    assert captured.out == ""  # no table repeating it
    assert captured.err.count("\n") == 1 and captured.err.startswith("imagegen: error: ")
    assert captured.err.count("would be replaced") == 1 and "(log: None)" not in captured.err
    assert str(wheel) in captured.err and "--force" in captured.err


NO_QEMU = "Name: default\nDriver: docker\nPlatforms: linux/amd64, linux/amd64/v2, linux/386\n"


def test_a_platform_the_builder_cannot_run_exits_10_with_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    # The builder's answer to `docker buildx inspect` (no QEMU): the engine is not what is tested here.
    monkeypatch.setattr(engine, "docker", lambda *a, **k: subprocess.CompletedProcess(["docker", *a], 0, NO_QEMU, ""))
    monkeypatch.setattr(engine, "bake", lambda *a, **k: pytest.fail("a refused cell is not built"))
    code = cli.main(["build", "sage", "--torch", "2.8", "--cuda", "12.8", "--python", "3.12", "--arch", "9.0",
                     "--flavor", "cuda", "--platform", "linux/arm64", "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work")])
    captured = capsys.readouterr()
    assert code == 10, captured.err
    assert captured.out == "" and captured.err.count("\n") == 1 and captured.err.startswith("imagegen: error: ")
    assert captured.err.count("cannot run linux/arm64") == 1 and "(log: None)" not in captured.err


def test_a_refused_cell_beside_built_ones_is_said_once_in_the_table_and_exits_10(tmp_path):
    built = CellResult(_sage("9.0", "3.11"), "built", wheel=tmp_path / "a.whl")
    refused = CellResult(_sage("9.0"), "refused", error="X would be replaced by the wheel for archs 9.0")
    shown: list[str] = []
    with pytest.raises(RefusedError) as info:
        report.report([built, refused], as_json=False, show=shown.append)
    assert info.value.exit_code == 10 and refused.cell.name in str(info.value)
    assert "would be replaced" not in str(info.value)  # the table says it, once
    assert "\n".join(shown).count("would be replaced") == 1


def test_a_failed_cell_still_exits_5_and_a_cell_without_a_log_says_no_log_none(tmp_path):
    failed = CellResult(_sage("9.0", "3.11"), "failed", error="no base image")
    refused = CellResult(_sage("9.0"), "refused", error="cannot run linux/arm64")
    with pytest.raises(BuildError) as info:
        report.report([failed, refused], as_json=False, show=lambda text: None)
    assert info.value.exit_code == 5 and "(log: None)" not in str(info.value) and "1 refused" in str(info.value)


def test_json_consumers_still_get_every_result_of_a_refused_run(tmp_path):
    refused = CellResult(_sage("9.0"), "refused", error="X would be replaced")
    shown: list[str] = []
    with pytest.raises(RefusedError):
        report.report([refused], as_json=True, show=shown.append)
    assert json.loads(shown[0])[0]["status"] == "refused"


# --------------------------------------------------------------------------------------------
# Left over from items 1-3: `build`/`push`/`pull --netrc FILE` hand a netrc to the builds as the BuildKit
# secret `netrc`, by path: its content is in no generated file, message or log.

TOKEN = "ghp_NetrcTokenThatMustStayInItsFile0123"


def _netrc(tmp_path: Path) -> Path:
    path = tmp_path / "home" / ".netrc"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"machine github.com login x-access-token password {TOKEN}\n")
    return path


def _scan(root: Path) -> list[Path]:
    """Every file under ``root`` that holds the token."""
    return [p for p in root.rglob("*") if p.is_file() and not p.is_symlink() and TOKEN.encode() in p.read_bytes()]


def test_build_hands_the_netrc_to_every_bake_target_by_path_and_writes_its_content_nowhere(tmp_path, monkeypatch,
                                                                                         capsys):
    monkeypatch.chdir(tmp_path)
    netrc = _netrc(tmp_path)
    baked: list[dict] = []

    def bake(file, targets, **kw):  # the engine's part: what buildx would be handed
        baked.append(json.loads(Path(file).read_text()))
    monkeypatch.setattr(engine, "bake", bake)
    code = cli.main(["build", "sage", "--torch", "2.8", "--cuda", "12.8", "--python", "3.12", "--arch", "9.0",
                     "--netrc", str(netrc), "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"),
                     "--no-audit"])
    captured = capsys.readouterr()
    assert code == 5 and baked  # no wheel came out of the stand-in bake: a failed cell, as it should be
    for data in baked:
        for name, target in data["target"].items():
            assert f"id=netrc,src={netrc}" in target["secret"], name
    assert TOKEN not in captured.out + captured.err
    assert _scan(tmp_path / "work") == [] and _scan(tmp_path / "out") == []


def test_push_hands_the_netrc_to_the_builder_bake_by_path(tmp_path, monkeypatch):
    from imagegen.executors import prebuilt

    netrc = _netrc(tmp_path)
    baked: list[dict] = []
    monkeypatch.setattr(engine, "bake", lambda file, targets, **kw: baked.append(json.loads(Path(file).read_text())))
    cell = _sage("9.0")
    prebuilt.bake_builders([cell], "registry.example:5000/ns", work=tmp_path / "work", push=False, ca_bundle=None,
                           builder=None, cache_from=[], cache_to=[], say=lambda m: None, netrc=str(netrc))
    (target,) = baked[0]["target"].values()
    assert f"id=netrc,src={netrc}" in target["secret"] and _scan(tmp_path / "work") == []


@pytest.mark.parametrize("make, says", [
    (lambda p: os.mkfifo(p), "not a regular file"),
    (lambda p: p.mkdir(), "not a regular file"),
    (lambda p: None, "no such file"),
    (lambda p: p.write_bytes(b"#" * ((1 << 20) + 1)), "1048577 bytes; at most 1048576 are read"),
])
@pytest.mark.parametrize("command", ["build", "push", "pull"])
def test_a_netrc_that_is_not_a_small_regular_file_is_one_line_before_anything_runs(tmp_path, monkeypatch, capsys,
                                                                                  make, says, command):
    monkeypatch.chdir(tmp_path)
    for step in ("bake", "docker"):
        monkeypatch.setattr(engine, step, lambda *a, **k: pytest.fail("nothing runs before --netrc is checked"))
    bad = tmp_path / "netrc"
    make(bad)
    argv = [command, "sage", "--torch", "2.8", "--cuda", "12.8", "--python", "3.12",
            *(["--arch", "9.0"] if command != "push" else []),
            *(["--registry", "registry.example:5000/ns"] if command != "build" else []), "--netrc", str(bad)]
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith(f"imagegen: error: --netrc {bad}: {says}"), err


def test_a_netrc_path_that_would_break_the_secret_spec_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    odd = tmp_path / "a,src=elsewhere"
    odd.write_text("machine h login u password p\n")
    code = cli.main(["build", "sage", "--torch", "2.8", "--cuda", "12.8", "--python", "3.12", "--arch", "9.0",
                     "--netrc", str(odd)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "without ','" in err


# --------------------------------------------------------------------------------------------
# Left over from items 1-3: every command that writes an output file or folder refuses the filesystem
# root, the home folder and system folders (outputs.resolve_target / outputs.output_folder), as
# safety.wheelhouse_folder does for a wheelhouse. /proc/self stands for a system folder: nothing can
# be written there even on the code before this check, so a failing run of this test writes nothing.

SYSTEM_FILE = "/proc/self/imagegen-output"
CELL = ["sage", "--torch", "2.8", "--cuda", "12.8", "--python", "3.12", "--arch", "9.0"]


@pytest.mark.parametrize("argv", [
    ["render", *CELL, "-o", SYSTEM_FILE],
    ["bake", *CELL, "-f", SYSTEM_FILE + ".hcl"],
    ["ci", "github", "-o", SYSTEM_FILE + ".yml"],
])
def test_an_output_file_in_a_system_folder_is_refused_in_one_line(tmp_path, monkeypatch, capsys, argv):
    monkeypatch.chdir(tmp_path)
    shutil.copy(ROOT / "docker-bake.hcl", tmp_path / "docker-bake.hcl")  # what `ci github` reads
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "is in the filesystem root or a system folder" in err


@pytest.mark.parametrize("place", ["system", "home"])
@pytest.mark.parametrize("argv", [
    lambda d: ["bake", *CELL, "-f", "x.hcl", "--dockerfiles", d],
    lambda d: ["build", *CELL, "--work", d],
    lambda d: ["plan", *CELL, "--audit", "--work", d],
    lambda d: ["repair", str(WHEEL), "--out", d],
])
def test_an_output_folder_that_is_home_or_a_system_folder_is_refused_in_one_line(tmp_path, monkeypatch, capsys,
                                                                                argv, place):
    monkeypatch.chdir(tmp_path)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for step in ("bake", "docker"):
        monkeypatch.setattr(engine, step, lambda *a, **k: pytest.fail("nothing runs before the folder is checked"))
    folder = "/proc/self/imagegen-folder" if place == "system" else str(home)
    code = cli.main(argv(folder))
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "is the filesystem root, your home folder or a system folder" in err
    assert sorted(p.name for p in home.iterdir()) == []  # nothing written into the home folder


def test_the_cdi_spec_may_still_go_where_the_engines_read_it():
    from imagegen import outputs

    assert outputs.resolve_target("/etc/cdi/imagegen-nvidia.json", "CDI spec", ("/etc/cdi",)) == \
        Path("/etc/cdi/imagegen-nvidia.json")
    with pytest.raises(Exception, match="system folder"):
        outputs.resolve_target("/etc/cdi/imagegen-nvidia.json", "output file")
