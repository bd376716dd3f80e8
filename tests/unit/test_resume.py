"""Stop at a budget and resume (imagegen_resume.py, shipped beside the in-build script): the state's
key, its round trip with the files' times (what ninja compares), a state that cannot be used, and the
supervisor stopping a process tree when the budget is spent. A real ninja resumes a stopped build.
The whole flow on the engine: tests/integration/test_engine_resume.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from tests.unit.builder_script import BUILDER, CCACHE, SUPERVISE, builder_module
from tests.unit.test_failfast import _alive, _tree_script

R = builder_module("imagegen_resume_unit", BUILDER / "imagegen_resume.py")
S = builder_module("imagegen_supervise_resume", SUPERVISE)
HASH = "0123456789abcdef"


def test_the_state_is_keyed_by_the_inputs_hash_and_only_for_the_planned_archs(tmp_path):
    env = {"IMAGEGEN_RESUME_DIR": str(tmp_path), "IMAGEGEN_INPUTS": HASH, "IMAGEGEN_PLANNED_ARCHS": "9.0",
           "TORCH_CUDA_ARCH_LIST": "9.0"}
    assert R.state_path(env) == str(tmp_path / f"{HASH}.tar")
    assert R.state_path(dict(env, TORCH_CUDA_ARCH_LIST="8.0;9.0")) is None  # overridden: the hash says nothing
    assert R.state_path(dict(env, IMAGEGEN_INPUTS="../../etc/x")) is None
    assert R.state_path(dict(env, IMAGEGEN_RESUME_DIR="")) is None
    assert R.budget_seconds({"IMAGEGEN_BUILD_BUDGET": "19800"}) == 19800
    assert R.budget_seconds({"IMAGEGEN_BUILD_BUDGET": "0"}) is R.budget_seconds({"IMAGEGEN_BUILD_BUDGET": "5h"}) is None


def _tree(work: Path) -> Path:
    src = work / "src"
    (src / "csrc").mkdir(parents=True)
    (src / "csrc" / "a.cpp").write_text("int a;\n")
    (src / "build" / "temp").mkdir(parents=True)
    (src / "build" / "temp" / "a.o").write_bytes(b"\x7fELF object")
    (src / "build" / "temp" / ".ninja_log").write_text("# ninja log v5\n1\t2\t3\tbuild/temp/a.o\tabc\n")
    (src / "link").symlink_to("csrc/a.cpp")
    os.utime(src / "csrc" / "a.cpp", ns=(1_700_000_000_123_456_789, 1_700_000_000_123_456_789))
    os.utime(src / "build" / "temp" / "a.o", ns=(1_700_000_005_987_654_321, 1_700_000_005_987_654_321))
    return src


def test_a_saved_tree_comes_back_at_the_same_path_with_its_times(tmp_path):
    work = tmp_path / "work"
    src = _tree(work)
    state = tmp_path / "resume" / f"{HASH}.tar"
    size = R.save(str(work), str(state), {"steps_done": 1})
    assert size == state.stat().st_size > 0 and not list(state.parent.glob("*.partial*"))
    shutil.rmtree(work)
    restored = R.restore(str(state), str(work))
    assert restored["objects"] == 1 and restored["entries"] == 1 and restored["info"]["steps_done"] == 1
    # ninja compares an object's time with the one its deps log recorded: they come back to the
    # nanosecond (a PAX header's time alone came back ~100 ns off, and ninja compiled those again)
    assert (src / "build" / "temp" / "a.o").stat().st_mtime_ns == 1_700_000_005_987_654_321
    assert (src / "csrc" / "a.cpp").stat().st_mtime_ns == 1_700_000_000_123_456_789
    assert not (src / R.TIMES).exists()
    assert os.readlink(src / "link") == "csrc/a.cpp"
    R.forget(str(state))
    assert not state.exists() and not Path(str(state) + ".json").exists()
    assert R.restore(str(state), str(work)) is None


@pytest.mark.parametrize("member", ["../escape.txt", "src/../../escape.txt", "/abs.txt", "src/link-out"])
def test_a_state_that_would_write_outside_the_tree_is_not_used(tmp_path, member):
    state = tmp_path / f"{HASH}.tar"
    payload = tmp_path / "payload"
    payload.write_text("x")
    with tarfile.open(state, "w", format=tarfile.PAX_FORMAT) as tar:
        if member == "src/link-out":
            info = tarfile.TarInfo(member)
            info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
            tar.addfile(info)
        else:
            tar.add(payload, arcname=member)
    work = tmp_path / "work"
    work.mkdir()
    assert R.restore(str(state), str(work)) is None  # the build starts afresh
    assert not (tmp_path / "escape.txt").exists() and not (work / "src").exists()


def test_the_safe_member_check_of_a_python_without_the_data_filter(tmp_path):
    # Debian bookworm's Python 3.11.2 predates tarfile's extraction filters: the fallback check
    for member in ("../x", "src/../../x"):
        state = tmp_path / "s.tar"
        with tarfile.open(state, "w") as tar:
            info = tarfile.TarInfo(member)
            tar.addfile(info)
        with tarfile.open(state) as tar, pytest.raises(ValueError):
            R._safe_members(tar, str(tmp_path / "work"))
    with tarfile.open(state, "w") as tar:
        tar.addfile(tarfile.TarInfo("src/ok.txt"))
    with tarfile.open(state) as tar:
        assert [m.name for m in R._safe_members(tar, str(tmp_path / "work"))] == ["src/ok.txt"]


def test_a_broken_state_is_not_used(tmp_path):
    state = tmp_path / f"{HASH}.tar"
    state.write_bytes(b"not a tar at all" * 100)
    assert R.restore(str(state), str(tmp_path)) is None and not (tmp_path / "src").exists()


def test_the_supervisor_stops_the_whole_tree_when_the_budget_is_spent(tmp_path):
    pip = _tree_script(tmp_path, "pass")  # three 'compilers' that would run for 300 s, one ignoring TERM
    t0 = time.time()
    with open(tmp_path / "build.log", "wb", buffering=0) as lf:
        result = S.supervise([str(pip)], dict(os.environ), lf, None, deadline=time.time() + 3)
    assert result["budget_spent"] and result["error"] is None
    assert 3 <= time.time() - t0 < 3 + S.KILL_GRACE_S + 5
    pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
    assert not [p for p in pids if _alive(p)], "a compiler outlived the stop"
    assert "the build's budget is spent" in (tmp_path / "build.log").read_text()


@pytest.mark.skipif(not shutil.which("ninja"), reason="needs ninja (scripts/test.sh installs it)")
def test_a_real_ninja_stopped_at_its_budget_and_restored_runs_only_what_is_left(tmp_path):
    ninja = shutil.which("ninja")
    work = tmp_path / "work"
    src = work / "src"
    (src / "build").mkdir(parents=True)
    # deps = gcc as torch's ninja files have it: ninja then keeps each object's time in .ninja_deps and
    # compiles again an object whose time is off by even a nanosecond from it
    rules = ["rule slow", "  command = sleep 1 && cp $in $out && echo \"$out: $in\" > $out.d", "  depfile = $out.d",
             "  deps = gcc"]
    edges = []
    for i in range(6):
        (src / f"p{i}.c").write_text(f"part {i}\n")
        edges.append(f"build build/p{i}.o: slow p{i}.c")
    (src / "build.ninja").write_text("\n".join(rules + edges) + "\n")
    (src / "build" / ".keep").write_text("")

    def run_ninja(deadline):
        with open(tmp_path / "log", "ab", buffering=0) as lf:
            return S.supervise([ninja, "-j1", "-C", str(src)], dict(os.environ), lf, None, deadline=deadline)

    first = run_ninja(time.time() + 2.5)
    assert first["budget_spent"]
    done = sorted(p.name for p in (src / "build").glob("*.o"))
    assert 1 <= len(done) < 6, done
    state = tmp_path / "resume" / f"{HASH}.tar"
    R.save(str(work), str(state), {})
    shutil.rmtree(work)
    R.restore(str(state), str(work))
    second = subprocess.run([ninja, "-j1", "-C", str(src), "-n"], capture_output=True, text=True)
    to_run = [line for line in second.stdout.splitlines() if line.startswith("[")]
    assert len(to_run) == 6 - len(done), (done, to_run)  # only what the stopped build had not finished
    assert not any(f"build/{name} " in line + " " for name in done for line in to_run)


# ------------------------------------------------------------------------ the shared compile cache (item 2)

B = builder_module("imagegen_ccache_compile_cache", CCACHE)


@pytest.mark.parametrize("url, shown", [("redis://s3cret@10.0.0.5:6379", "redis://10.0.0.5:6379"),
                                        ("redis://default:s3cret@cache:6379/2", "redis://cache:6379/2"),
                                        ("http://cache.example:8080/ccache", "http://cache.example:8080/ccache")])
def test_the_build_reads_the_remote_from_its_secret_and_logs_it_without_the_password(tmp_path, monkeypatch, url, shown):
    monkeypatch.setattr(B, "SECRETS", str(tmp_path))
    (tmp_path / B.rules.COMPILE_CACHE_SECRET).write_text(url + "\n")
    assert B.compile_cache_remote() == url and B.remote_shown(url) == shown
    (tmp_path / B.rules.COMPILE_CACHE_SECRET).write_text("")  # bake's env= secret when the variable is unset
    assert B.compile_cache_remote() is None
    (tmp_path / B.rules.COMPILE_CACHE_SECRET).write_text("redis://h:1 --evil\n")
    assert B.compile_cache_remote() is None


@pytest.mark.parametrize("bad", ["ftp://cache:21/x", "redis://host:6379 -x", "redis://pw@host:1\nx", "s3://bucket",
                                 "redis://" + "a" * 500])
def test_a_bad_compile_cache_is_one_line_and_never_shows_its_password(bad):
    from imagegen.commands.common import compile_cache
    from imagegen.errors import UsageError

    with pytest.raises(UsageError) as exc:
        compile_cache(bad.replace("host", "s3cretpw@host") if "@" not in bad else bad)
    assert "\n" not in str(exc.value) and "s3cretpw" not in str(exc.value) and "give redis://" in str(exc.value)
    assert compile_cache("redis://pw@127.0.0.1:6379") == "redis://pw@127.0.0.1:6379" and compile_cache(" ") is None
