"""Native builds on this host (no Docker): the fixture CUDA extension compiled with the host's nvcc
against a real torch in a venv, verified and import-tested; mismatched torch/nvcc refused before any
compile. Also `imagegen doctor` on the same toolchain.

The venv gets torch 2.11.0 (CUDA 13.0, PyPI's default) and the build tools from PyPI; nvcc is the
host's (/usr/local/cuda, CUDA 13.0 on the project's machines) or, for the mismatch test, nvcc 12.8
from PyPI's cuda-toolkit.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from imagegen.model.arch_parse import parse_arch_list
from imagegen.finish.verify import verify_wheel
from redis_server import redis_server

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "fixtures" / "tiny_kernel"
IMAGEGEN = str(Path(sys.executable).parent / "imagegen")

pytestmark = pytest.mark.integration


def sh(*cmd, env=None, cwd=None, timeout=3000):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env={**os.environ, **(env or {})},
                          cwd=cwd, timeout=timeout)


def host_cuda_home() -> str:
    for cand in ("/usr/local/cuda", "/usr/local/cuda-13.0"):
        if Path(cand, "bin", "nvcc").exists():
            return cand
    pytest.fail("the host's CUDA 13 toolkit (nvcc) is required for the native tests")


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory):
    """A real Redis on loopback: the shared compile cache (`--compile-cache`) of the module's builds."""
    with redis_server("127.0.0.1", tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture(scope="module")
def shared_ccache(tmp_path_factory, compile_cache) -> dict[str, str]:
    """The environment of the native builds of the fixture for 8.0 below: the host's CUDA, one ccache
    (CCACHE_DIR, as a user sets it) and the shared compile cache (IMAGEGEN_COMPILE_CACHE, which
    `--compile-cache` defaults to). The first build (`first_build`) compiles into the empty caches, the
    others take its objects, and each still runs the package's whole build (setup.py, ninja, link,
    wheel, verify, import): the module pays for one compile, not five. Every test that uses the cache
    asks for `first_build` too, so the cold build comes first whichever tests run."""
    if not shutil.which("ccache"):
        pytest.fail("ccache is required for this test: scripts/test.sh installs it (apt-get install ccache)")
    return {"CUDA_HOME": host_cuda_home(), "CCACHE_DIR": str(tmp_path_factory.mktemp("ccache")),
            "IMAGEGEN_COMPILE_CACHE": compile_cache.url}


@pytest.fixture(scope="module")
def first_build(torch_venv, shared_ccache, tmp_path_factory) -> dict:
    """The module's first native build of the fixture for 8.0 (--flat), into the empty shared ccache."""
    root = tmp_path_factory.mktemp("first-native")
    proc = sh(IMAGEGEN, "build", "--native", "--source", TINY, "--arch", "8.0", "--python-exe", torch_venv / "bin" / "python",
              "--out", root / "drive", "--flat", "--work", root / "work", env=shared_ccache)
    return {"proc": proc, "drive": root / "drive"}


def ccache_counts(proc) -> tuple[int, int]:
    """(hits, compilations) from the build's `ccache: H of N compilations from the cache` line."""
    m = re.search(r"ccache: (\d+) of (\d+) compilations from the cache", proc.stdout + proc.stderr)
    assert m, (proc.stdout + proc.stderr)[-3000:]
    return int(m.group(1)), int(m.group(2))


def test_native_build_verify_and_import(torch_venv, first_build):
    proc, drive = first_build["proc"], first_build["drive"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    wheel = Path(proc.stdout.strip().splitlines()[-1])
    assert wheel.parent == drive and wheel.name == "tiny_kernel-0.1.0+cu130torch2.11-cp311-cp311-linux_x86_64.whl"
    assert "jobs: MAX_JOBS=" in proc.stderr  # the RAM-aware settings are printed before the build
    assert "smoke: {'tiny_kernel': 'ok'}" in proc.stderr
    report = verify_wheel(wheel, parse_arch_list("8.0"))
    assert report.ok and [str(e) for e in report.extensions[0].entries] == ["sm_80"]
    assert not list(drive.glob(".*partial"))
    # `imagegen verify` does the same for any wheel, import test included.
    proc = sh(IMAGEGEN, "verify", wheel, "--arch", "8.0", "--python-exe", torch_venv / "bin" / "python", "--json")
    (got,) = json.loads(proc.stdout)
    assert proc.returncode == 0 and got["ok"] and got["imports"] == {"tiny_kernel": "ok", "tiny_kernel._C": "ok"}


def test_native_build_into_the_wheelhouse_keeps_its_log_and_manifest(torch_venv, tmp_path, first_build, shared_ccache):
    # Without --flat the wheel goes through the same finish step as bake builds: verified, then
    # collected with its log copied beside it and a manifest entry recording the native facts.
    proc = sh(IMAGEGEN, "build", "--native", "--source", TINY, "--arch", "8.0", "--python-exe", torch_venv / "bin" / "python",
              "--out", tmp_path / "wh", "--work", tmp_path / "work", env=shared_ccache)
    assert proc.returncode == 0, proc.stderr[-3000:]
    wheel = Path(proc.stdout.strip().splitlines()[-1])
    assert wheel.parent == tmp_path / "wh" / "tiny-kernel-0.1.0" / "torch2.11" / "cu130"
    entry = json.loads((wheel.parent / "manifest.json").read_text())["cells"]["tiny-kernel-0_1_0-torch2_11-cu130-py311"]
    assert entry["wheel"] == wheel.name and entry["native"] is True and entry["smoke"] == {"tiny_kernel": "ok"}
    assert Path(entry["log"]) == tmp_path / "wh" / "logs" / "tiny-kernel-0_1_0-torch2_11-cu130-py311.log"
    assert Path(entry["log"]).read_text().startswith("[imagegen] build env: ")
    assert {"build", "verify+smoke"} <= set(entry["steps_s"]) and entry["verify"]["ok"]
    assert entry["audit"]["verdict"] == "ok"


def test_a_native_rerun_of_the_same_request_reuses_its_wheel_until_it_changes_or_force(torch_venv, tmp_path,
                                                                                         first_build, shared_ccache):
    # A Colab user who re-runs the build cell waited the whole compile again (the fixture: 27.8 s, then
    # 30.1 s). The wheelhouse's manifest says which inputs built the wheel and its sha256: the same request
    # again takes the wheel as it is, in seconds; a wheel changed since is built again, as is one --force asks.
    import hashlib
    import time

    assert first_build["proc"].returncode == 0, first_build["proc"].stderr[-3000:]
    out, work = tmp_path / "wh", tmp_path / "work"
    argv = [IMAGEGEN, "build", "--native", "--source", TINY, "--arch", "8.0", "--python-exe",
            torch_venv / "bin" / "python", "--out", out, "--work", work]
    proc = sh(*argv, env=shared_ccache)
    assert proc.returncode == 0, proc.stderr[-3000:]
    wheel = Path(proc.stdout.strip().splitlines()[-1])
    manifest = wheel.parent / "manifest.json"

    def entry() -> dict:
        (only,) = json.loads(manifest.read_text())["cells"].values()
        return only

    first = entry()
    stat, data = wheel.stat(), wheel.read_bytes()
    shutil.rmtree(work)  # its logs and build files: a re-run that compiled anything would make them again
    t0 = time.monotonic()
    proc = sh(*argv, env=shared_ccache)
    seconds = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert seconds < 2, seconds
    assert proc.stdout.strip().splitlines()[-1] == str(wheel)
    (line,) = proc.stderr.strip().splitlines()
    assert line == (f"up to date: {wheel}: built from the same inputs ({first['inputs']}) and still the file its"
                    " manifest's sha256 records, so nothing is compiled (--force rebuilds it)")
    assert not work.exists()  # no build log, no cell file, no dist folder
    assert (wheel.stat().st_ino, wheel.stat().st_mtime_ns, wheel.read_bytes()) == (stat.st_ino, stat.st_mtime_ns, data)
    assert entry() == first

    # One byte of the wheel changed since its build: not the wheel the manifest records, so built again.
    wheel.write_bytes(data[:200] + bytes([data[200] ^ 0xFF]) + data[201:])
    proc = sh(*argv, env=shared_ccache)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "up to date" not in proc.stderr and "building tiny-kernel 0.1.0" in proc.stderr
    assert (work / "logs" / "build.log").is_file()
    rebuilt = entry()
    assert rebuilt["sha256"] == hashlib.sha256(wheel.read_bytes()).hexdigest() and rebuilt["built_at"] >= first["built_at"]

    # --force: built again although the wheel is the one recorded.
    before = wheel.stat().st_ino
    proc = sh(*argv, "--force", env=shared_ccache)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "up to date" not in proc.stderr and "building tiny-kernel 0.1.0" in proc.stderr
    assert wheel.stat().st_ino != before and entry()["inputs"] == first["inputs"]


TINY_PATCH = """\
diff --git a/tiny_kernel/__init__.py b/tiny_kernel/__init__.py
--- a/tiny_kernel/__init__.py
+++ b/tiny_kernel/__init__.py
@@ -1,4 +1,5 @@
 \"\"\"tiny_kernel: x + 1 on the GPU (imagegen's test fixture).\"\"\"
 
 __version__ = "0.1.0"
+PATCHED_BY_RECIPE = True
 
"""


def test_native_build_of_a_local_tree_applies_the_recipes_patches_to_its_copy(torch_venv, tmp_path, first_build,
                                                                          shared_ccache):
    # Found on the H100: a local SageAttention v2.2.0 tree built natively got none of the recipe's
    # patches (the container build of the same tree did) and the wheel failed its GPU check.
    recipes = tmp_path / "recipes"
    shutil.copytree(ROOT / "tests" / "fixtures" / "tiny_git_recipe", recipes)
    (recipes / "patches" / "tiny-readme.patch").write_text(TINY_PATCH)
    tree = tmp_path / "tiny_kernel"
    shutil.copytree(TINY, tree)
    before = {p: p.read_bytes() for p in tree.rglob("*") if p.is_file()}
    proc = sh(IMAGEGEN, "build", "--native", "--source", tree, "--recipe-dir", recipes, "--arch", "8.0",
              "--python-exe", torch_venv / "bin" / "python", "--out", tmp_path / "drive", "--flat",
              "--work", tmp_path / "work", env=shared_ccache)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "applying patch tiny-readme.patch" in proc.stdout + proc.stderr
    wheel = Path(proc.stdout.strip().splitlines()[-1])
    with zipfile.ZipFile(wheel) as zf:
        assert "PATCHED_BY_RECIPE = True" in zf.read("tiny_kernel/__init__.py").decode()
    assert {p: p.read_bytes() for p in tree.rglob("*") if p.is_file()} == before  # the user's tree: untouched


def test_a_src_dir_checkout_at_the_pin_stays_the_pin_through_an_audit_and_a_build(torch_venv, tmp_path, first_build,
                                                                                   shared_ccache):
    # Found on the H200: `plan --audit --native --src-dir CHECKOUT` wrote the recipe's patches into the
    # user's checkout, so the build after it saw the pinned commit "with changes" and built a -local
    # version (every GPU proof until 2026-11-29 was labelled so). The checkout is the user's: read only.
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
    checkout = tmp_path / "tiny-checkout"
    shutil.copytree(TINY, checkout)
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "v0.1.0"]):
        subprocess.run([*git, "-C", checkout, *args], check=True)
    commit = subprocess.run(["git", "-C", checkout, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    recipes = tmp_path / "recipes"
    (recipes / "patches").mkdir(parents=True)
    (recipes / "patches" / "tiny-init.patch").write_text(TINY_PATCH)
    (recipes / "tiny.yaml").write_text(
        "schema: 1\nname: tiny\ndistribution: tiny_kernel\nsource:\n  git: https://example.invalid/tiny-kernel.git\n"
        f'versions:\n  "0.1.0":\n    ref: v0.1.0\n    commit: "{commit}"\n    archs: ["8.0", "9.0"]\n'
        "    patches:\n      - file: tiny-init.patch\n        reason: marks the build\n"
        "arch: {env: TORCH_CUDA_ARCH_LIST, style: torch, ptx: honoured}\n"
        "build:\n  requires: [setuptools, wheel, ninja, packaging]\nsmoke:\n  imports: [tiny_kernel]\n")
    common = ["tiny", "--recipe-dir", recipes, "--src-dir", checkout, "--arch", "8.0",
              "--python-exe", torch_venv / "bin" / "python"]

    def untouched():
        return subprocess.run(["git", "-C", checkout, "status", "--porcelain"], capture_output=True, text=True).stdout == ""

    audit = sh(IMAGEGEN, "plan", "--audit", "--native", *common, "--json", "--work", tmp_path / "audit", env=shared_ccache)
    assert audit.returncode == 0, audit.stderr[-3000:]
    record = json.loads(audit.stdout)
    assert record["cell"]["version"] == "0.1.0" and record["audit"]["verdict"] == "ok"
    assert untouched()
    proc = sh(IMAGEGEN, "build", "--native", *common, "--out", tmp_path / "drive", "--flat", "--work", tmp_path / "work",
              env=shared_ccache)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "building tiny 0.1.0 torch" in proc.stderr and "-local" not in proc.stderr  # the pin, as planned
    assert "applying patch tiny-init.patch" in proc.stdout + proc.stderr  # to the build's copy
    wheel = Path(proc.stdout.strip().splitlines()[-1])
    with zipfile.ZipFile(wheel) as zf:
        assert "PATCHED_BY_RECIPE = True" in zf.read("tiny_kernel/__init__.py").decode()
    assert untouched()


@pytest.mark.parametrize("verbose", [False, True], ids=["quiet", "verbose-build"])
def test_native_compile_error_is_shown_and_kept(torch_venv, tmp_path, verbose):
    (tmp_path / "tmp").mkdir()
    # pip runs without -v by default (its verbose console logging slows chatty builds down): the
    # compiler's error must still reach the user, and the build log, when the build fails.
    proc = sh(IMAGEGEN, "build", "--native", "--source", ROOT / "tests" / "fixtures" / "broken_kernel", "--arch", "8.0",
              "--python-exe", torch_venv / "bin" / "python", "--out", tmp_path / "o", "--work", tmp_path / "work",
              *(["--verbose-build"] if verbose else []), env={"CUDA_HOME": host_cuda_home(), "TMPDIR": str(tmp_path / "tmp")})
    assert proc.returncode == 5, proc.stderr[-3000:]
    # A failed build leaves nothing in the temporary folder: nvcc's tmpxft_* files went into the
    # build's work folder, which is removed (the log says why it failed).
    assert not list((tmp_path / "tmp").iterdir()), list((tmp_path / "tmp").iterdir())
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("imagegen: error: ") and "the build step failed" in last and "build.log" in last
    error = "broken.cu(4): error: expected a declaration"
    assert error in proc.stdout + proc.stderr
    log = (tmp_path / "work" / "logs" / "build.log").read_text()
    assert error in log and log.startswith("[imagegen] build env: ")
    # -v makes pip announce each command it runs; without it pip prints only its summary (and the
    # failed command's whole output).
    assert ("Running command" in log) == verbose
    assert not (tmp_path / "o").exists() or not list((tmp_path / "o").rglob("*.whl"))


def test_native_refuses_an_arch_the_host_nvcc_cannot_build(torch_venv, tmp_path):
    proc = sh(IMAGEGEN, "build", "--native", "--source", TINY, "--arch", "7.0", "--python-exe", torch_venv / "bin" / "python",
              "--out", tmp_path, env={"CUDA_HOME": host_cuda_home()})
    assert proc.returncode == 3
    assert "sm_70 was dropped in CUDA 13.0" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_native_refuses_nvcc_major_mismatch(torch_venv, tmp_path):
    # A CUDA 12 toolkit next to a CUDA 13.0 torch: torch's build would fail halfway; imagegen refuses
    # before compiling. No nvcc 12 can be installed here (PyPI's CUDA 12 wheels carry ptxas only), so
    # a stand-in nvcc that reports release 12.8 plays that toolkit: the refusal reads only its version.
    home = tmp_path / "cuda-12.8"
    (home / "bin").mkdir(parents=True)
    (home / "include").mkdir()
    (home / "include" / "cuda_runtime.h").touch()
    nvcc = home / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.8, V12.8.93'\n")
    nvcc.chmod(0o755)
    proc = sh(IMAGEGEN, "build", "--native", "--source", TINY, "--arch", "8.0", "--python-exe", torch_venv / "bin" / "python",
              "--out", tmp_path / "o", env={"CUDA_HOME": str(home)})
    assert proc.returncode == 3, proc.stderr
    assert "nvcc 12.8" in proc.stderr and "nvcc's major must equal torch's CUDA major" in proc.stderr
    assert not (tmp_path / "o").exists()
    doctor = sh(IMAGEGEN, "doctor", "--python-exe", torch_venv / "bin" / "python", "--no-engine", "--json",
                env={"CUDA_HOME": str(home)})
    checks = {c["name"]: c for c in json.loads(doctor.stdout)}
    assert doctor.returncode == 4 and checks["nvcc vs torch"]["status"] == "FAIL"
    assert "install CUDA 13.x" in checks["nvcc vs torch"]["fix"]


def test_native_refuses_a_torch_the_host_does_not_have(torch_venv, tmp_path):
    proc = sh(IMAGEGEN, "build", "--native", "--source", TINY, "--torch", "2.8", "--python-exe", torch_venv / "bin" / "python",
              "--out", tmp_path)
    assert proc.returncode == 2 and "--torch 2.8 asked, but this host has 2.11.0" in proc.stderr


def test_doctor_on_this_machine(torch_venv):
    proc = sh(IMAGEGEN, "doctor", "--python-exe", torch_venv / "bin" / "python", "--json", env={"CUDA_HOME": host_cuda_home()})
    checks = {c["name"]: c for c in json.loads(proc.stdout)}
    assert checks["torch"]["detail"].startswith("2.11.0 (CUDA 13.0)")
    assert checks["nvcc vs torch"]["status"] == "ok"
    assert checks["bake matrix + local export"]["status"] == "ok", checks["bake matrix + local export"]
    assert proc.returncode == 0, proc.stderr


def test_native_build_on_a_clean_machine_gets_every_compile_from_the_shared_cache(torch_venv, first_build, shared_ccache,
                                                                                compile_cache, tmp_path):
    # `build --native --compile-cache URL` (here through IMAGEGEN_COMPILE_CACHE): the module's first build
    # filled the shared Redis; a build with an empty local ccache (a second machine) compiles nothing:
    # every compile, nvcc's included, is a hit from the remote storage. The password is in no output or
    # file of that build.
    assert first_build["proc"].returncode == 0, first_build["proc"].stderr[-3000:]
    _, total = ccache_counts(first_build["proc"])
    assert compile_cache.keys() >= total
    env = dict(shared_ccache, CCACHE_DIR=str(tmp_path / "empty-ccache"))
    (tmp_path / "empty-ccache").mkdir()
    proc = sh(IMAGEGEN, "build", "--native", "--source", TINY, "--arch", "8.0", "--python-exe",
              torch_venv / "bin" / "python", "--out", tmp_path / "wh", "--work", tmp_path / "work", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert ccache_counts(proc) == (total, total)
    assert f"{total} of {total} compilations from the cache, {total} of them from the remote storage" in out, out[-3000:]
    assert f"remote storage redis://127.0.0.1:{compile_cache.port}" in out
    assert compile_cache.password not in out
    for path in (tmp_path / "wh").rglob("*"):
        if path.is_file():
            assert compile_cache.password.encode() not in path.read_bytes(), path
    for path in (tmp_path / "work").rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert compile_cache.password.encode() not in path.read_bytes(), path


def test_native_rebuild_takes_its_objects_from_ccache(torch_venv, first_build, shared_ccache, tmp_path):
    # Each native build compiles in a new temporary folder; with CCACHE_DIR set the in-build script
    # routes nvcc and the host compiler through ccache with paths relative to that folder, so a
    # second build of the same tree (here after the module's first, into the empty cache) compiles
    # nothing.
    assert first_build["proc"].returncode == 0, first_build["proc"].stderr[-3000:]
    first_hits, total = ccache_counts(first_build["proc"])
    assert total > 0 and first_hits == 0
    proc = sh(IMAGEGEN, "build", "--native", "--source", TINY, "--arch", "8.0", "--python-exe",
              torch_venv / "bin" / "python", "--out", tmp_path / "out", "--flat", "--work", tmp_path / "work",
              env=shared_ccache)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ccache_counts(proc) == (total, total)



def test_the_arch_list_of_a_native_build_travels_down_the_flow_once(torch_venv, first_build, shared_ccache, tmp_path,
                                                                     monkeypatch):
    # Issue 33's walk, on a real build (the fixture from the shared ccache): benchmarks/value_walk.py runs the
    # command in this process and lists every file whose functions get the --arch value or read it from what
    # carries it. It goes from the request through plan, render (the cell's document and inputs hash), the
    # native executor, finish and the wheelhouse's record without going back to an earlier step.
    from benchmarks.value_walk import follow

    assert first_build["proc"].returncode == 0, first_build["proc"].stderr[-3000:]
    for name, value in shared_ccache.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)  # no project config of the checkout
    trip = follow(["build", "--native", "--source", str(TINY), "--arch", "8.0", "--python-exe",
                   str(torch_venv / "bin" / "python"), "--out", str(tmp_path / "wh"), "--work", str(tmp_path / "work")])
    assert trip.exit == 0 and list((tmp_path / "wh").rglob("*.whl"))
    assert {"plan/options.py", "render/dockerfile.py", "executors/native.py", "finish/verify.py",
            "wheelhouse/collect.py"} <= set(trip.flow_files), trip.flow_files  # followed all the way
    assert trip.climbs == []
    assert len(trip.flow_files) <= 11 and len(trip.files) <= 18, trip.files

RESEED = ROOT / "tests" / "fixtures" / "reseed_resumable_kernel.py"
PARTS = 10  # ninja steps of the resumable fixture's whole build: eight parts, the module and the kernel


def test_native_build_stopped_at_its_budget_resumes_from_its_work_folder(torch_venv, tmp_path):
    # Seed 000's Colab build takes longer than a runtime may last: --budget stops the compile in time and
    # keeps its tree in --work (on Drive there); the same command again, in a new runtime, compiles only
    # what is left. No ccache anywhere: the kept tree alone does it.
    proc = subprocess.run([sys.executable, str(RESEED), str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    tree, work, drive = Path(proc.stdout.strip()), tmp_path / "work", tmp_path / "drive"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CCACHE_", "IMAGEGEN_"))}
    env.update(CUDA_HOME=host_cuda_home(), XDG_CACHE_HOME=str(tmp_path / "cache"))
    compiling = tmp_path / "cache" / "imagegen" / "native-builds"  # where it compiles: local disk, not --work
    build = [IMAGEGEN, "build", "--native", "--source", str(tree), "--arch", "8.0", "--python-exe",
             str(torch_venv / "bin" / "python"), "--max-jobs", "1", "--out", str(drive), "--flat", "--work", str(work)]
    # The budget runs from the package's build's start, setup.py's torch import included, which a loaded
    # machine can take longer than the first budget over: a build stopped before its first object keeps its
    # tree all the same, and the next, with a longer budget, resumes it (a user's second runtime does that).
    for budget in (16, 24, 36, 54):
        stopped = subprocess.run(build + ["--budget", f"{budget}s"], capture_output=True, text=True, env=env,
                                 timeout=1200)
        assert stopped.returncode == 5, stopped.stderr[-3000:]
        m = re.search(rf"budget of {budget} s is spent: stopped after (\d+) ninja step\(s\), its state \(\d+ MB\) is"
                      r" kept in (\S+); the same build again resumes from it", stopped.stderr)
        assert m, stopped.stderr[-3000:]
        done, state = int(m.group(1)), Path(m.group(2))
        if done:
            break
    assert 1 <= done < PARTS, f"the budget should stop the build partway, it stopped after {done} of {PARTS}"
    assert state.parent == work / "resume" and state.is_file()
    last = stopped.stderr.strip().splitlines()[-1]
    assert last.startswith("imagegen: error: ")
    assert f"stopped at its --budget of {budget} s with its build tree kept in {work}/resume" in last
    assert "Traceback" not in stopped.stderr and not list(drive.glob("*.whl")) and not any(compiling.iterdir())

    # The same command again, without the budget: the kept tree is restored at the same path and ninja
    # runs only what the stopped build had not finished; the wheel is whole, verified and imported.
    resumed = subprocess.run(build, capture_output=True, text=True, env=env, timeout=1200)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    said = resumed.stdout + resumed.stderr  # the in-build script's lines go to imagegen's stdout
    assert f"resuming from {state}: {done} object(s) compiled by the stopped build" in said, said[-3000:]
    m = re.search(r"resumed build: (\d+) step\(s\) run now, (\d+) done by the stopped build(.*)", said)
    assert m and (int(m.group(1)), int(m.group(2))) == (PARTS - done, done), said[-3000:]
    assert "run again" not in m.group(3)  # nothing the stopped build finished was compiled twice
    wheel = Path(resumed.stdout.strip().splitlines()[-1])
    assert wheel.parent == drive and wheel.name.startswith("resumable_kernel-0.1.0+cu130torch2.11-cp311")
    assert verify_wheel(wheel, parse_arch_list("8.0")).ok
    assert "smoke: {'resumable_kernel': 'ok'}" in resumed.stderr
    assert not state.exists() and not any(compiling.iterdir())  # the kept tree is used once, then gone
    assert sorted(p.name for p in work.iterdir() if not p.name.endswith(".py")) == ["cell.json", "dist", "logs",
                                                                                    "resume"]
