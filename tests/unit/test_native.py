"""Tests for imagegen.executors.native: a native build driven end to end with a stand-in host
interpreter (it answers the in-build script's steps: fetch, audit, build, env; the import test's
`-c` runs the real Python): the cell file and environment each step gets, the audit's gate and job
settings, the wheel verified, import-tested and collected, --flat, --print-env, and every failure as
one line (a failed step with the compiler's first error, no wheel, a wheel that fails verification
or its import test, an audit refusal)."""

from __future__ import annotations

import json
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.version import Version

from imagegen.wheelhouse import manifest as wheelhouse
from imagegen.errors import BuildError, CompatError
from imagegen.executors import native
from imagegen.model.cell import HostToolchain
from imagegen.plan.matrix import preflight
from imagegen.finish.finisher import finish
from imagegen.model import jobs
from imagegen.model.arch_parse import parse_arch_list
from imagegen.model.catalogue import load_catalogue
from tests.unit.executor_fixtures import FIXTURES, WHEEL, audit_report, python_stand_in, temp_files_under, tiny_recipe


@pytest.fixture(autouse=True)
def _temp_files(tmp_path, monkeypatch):
    """Temporary files (the import test's folder, verify's extracted .so files) under tmp_path."""
    temp_files_under(tmp_path, monkeypatch)


# The stand-in for the host's Python. Every call of the in-build script is logged (step, its
# arguments, the cell file as it was then, the environment variables a build reads).
INTERPRETER = """
import json, os, shutil, sys
REAL, CALLS, PLAN = {real!r}, {calls!r}, json.loads({plan!r})
if sys.argv[1] == "-c":  # the import test's interpreter: the real Python
    os.execv(REAL, [REAL, *sys.argv[1:]])
script, flag, cell_file, step, *rest = sys.argv[1:]
doc = json.load(open(cell_file))
os.makedirs(doc["log_dir"], exist_ok=True)
env = {{k: os.environ.get(k) for k in ("TORCH_CUDA_ARCH_LIST", "MAX_JOBS", "NVCC_THREADS", "PYTHONUNBUFFERED",
                                      "IMAGEGEN_BUILD_VERBOSE", "IMAGEGEN_BUILD_BUDGET", "IMAGEGEN_RESUME_DIR",
                                      "IMAGEGEN_INPUTS")}}
with open(CALLS, "a") as fh:
    call = {{"script": script, "flag": flag, "step": step, "args": rest, "cell": doc, "env": env}}
    fh.write(json.dumps(call) + "\\n")
if step == "fetch":
    sys.exit(PLAN.get("fetch_rc", 0))
if step == "audit":
    out = rest[rest.index("--out") + 1]
    with open(out, "w") as fh:
        json.dump(PLAN["audit"], fh)
    sys.exit(0)
if step == "env":
    print(PLAN.get("env_output", json.dumps(env)))
    sys.exit(0)
if step == "build":
    with open(os.path.join(doc["log_dir"], "build.log"), "w") as fh:
        fh.write("nvcc ... compiled\\n")
    if PLAN.get("failure") is not None:
        with open(os.path.join(doc["log_dir"], "failure.json"), "w") as fh:
            fh.write(PLAN["failure"])
    dist = rest[rest.index("--out") + 1]
    os.makedirs(dist, exist_ok=True)
    for wheel in PLAN.get("wheels", []):
        shutil.copy(wheel, dist)
    sys.exit(PLAN.get("build_rc", 0))
sys.exit(99)
"""


class Host:
    """A stand-in interpreter in ``folder`` and the toolchain a probe of it would give."""

    def __init__(self, folder: Path, **plan) -> None:
        plan.setdefault("wheels", [str(WHEEL)])
        plan.setdefault("audit", audit_report(["sm_80", "sm_90"], ["compute_90"]))
        self.calls_file = folder / "calls.jsonl"
        self.exe = python_stand_in(folder / "python", INTERPRETER.format(
            real=sys.executable, calls=str(self.calls_file), plan=json.dumps(plan)))
        self.toolchain = HostToolchain(python_exe=str(self.exe), python="3.11", torch="2.11.0", torch_cuda="13.0",
                                       cuda_home=None, nvcc=Version("13.0"), gpus=())

    def calls(self) -> list[dict]:
        if not self.calls_file.is_file():
            return []
        return [json.loads(line) for line in self.calls_file.read_text().splitlines()]


def _tiny(host: Host, archs: str = "8.0;9.0+PTX"):
    recipe = tiny_recipe()
    return preflight(recipe, recipe.version(None), parse_arch_list(archs), host.toolchain)


def _sage(host: Host):
    recipe = load_catalogue().get("sageattention")
    return preflight(recipe, recipe.version(None), parse_arch_list("9.0"), host.toolchain)


@pytest.fixture(autouse=True)
def _machine(monkeypatch):
    """A fixed machine, so that the job settings do not depend on where the tests run."""
    monkeypatch.setattr(jobs, "host", lambda: jobs.Host(cpus=16, mem_gb=64))


def test_a_native_build_runs_the_build_step_then_verifies_imports_and_collects(tmp_path):
    host = Host(tmp_path)
    cell = _tiny(host)
    said: list[str] = []
    out, work = tmp_path / "out", tmp_path / "work"
    dest = native.build_native(cell, host.toolchain, out=out, work=work, finish=finish, audit=False, say=said.append)
    assert dest == wheelhouse.cell_dir(out, cell) / WHEEL.name and dest.read_bytes() == WHEEL.read_bytes()
    (call,) = host.calls()  # a local source: no fetch; --no-audit: no audit
    assert (call["script"], call["flag"], call["step"], call["args"]) == (str(work / "imagegen_build.py"), "--cell",
                                                                         "build", ["--out", str(work / "dist")])
    # The cell file: the host's Python and torch, a fresh temporary work folder, the local tree.
    doc = call["cell"]
    assert (doc["venv"], doc["base_python"], doc["work_dir"], doc["torch_checked"]) == (None, str(host.exe), None, True)
    assert doc["src_dir"] == str(FIXTURES / "tiny_kernel") and doc["log_dir"] == str(work / "logs")
    assert call["env"]["TORCH_CUDA_ARCH_LIST"] == "8.0;9.0+PTX" and call["env"]["PYTHONUNBUFFERED"] == "1"
    assert call["env"]["MAX_JOBS"].isdigit() and call["env"]["IMAGEGEN_BUILD_VERBOSE"] is None
    entry = wheelhouse.read_manifest(dest.parent)["cells"][cell.name]
    assert entry["native"] is True and entry["nvcc"] == "13.0" and entry["smoke"] == {"tiny_kernel": "ok"}
    assert entry["jobs"]["from_audit"] is False and entry["jobs"]["max_jobs"] == int(call["env"]["MAX_JOBS"])
    assert set(entry["steps_s"]) == {"build", "verify+smoke"} and "audit" not in entry
    assert Path(entry["log"]).read_text() == "nvcc ... compiled\n"  # the log kept in OUT
    assert any(line.startswith(f"building {cell.describe()} natively: Python 3.11") for line in said)
    assert said[-1].startswith(f"built {dest} in ") and said[-1].endswith("archs: sm_80, sm_90, compute_90")
    assert any(line == "smoke: {'tiny_kernel': 'ok'}" for line in said)


def test_flat_verbose_and_explicit_jobs_reach_the_build(tmp_path):
    host = Host(tmp_path)
    cell = _tiny(host)
    dest = native.build_native(cell, host.toolchain, out=tmp_path / "out", work=tmp_path / "work", finish=finish,
                               flat=True, verbose_build=True, max_jobs=3, nvcc_threads=2, audit=False,
                               say=lambda m: None)
    assert dest == tmp_path / "out" / WHEEL.name
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [WHEEL.name]
    (call,) = host.calls()
    env = call["env"]
    assert (env["MAX_JOBS"], env["NVCC_THREADS"], env["IMAGEGEN_BUILD_VERBOSE"]) == ("3", "2", "1")


def test_a_budget_builds_in_a_fixed_folder_of_work_and_a_stop_there_says_how_to_resume(tmp_path, monkeypatch):
    # The in-build script stops at IMAGEGEN_BUILD_BUDGET and keeps the tree under IMAGEGEN_RESUME_DIR, keyed by
    # IMAGEGEN_INPUTS (tests/integration/test_native.py runs it for real); ninja's commands name the tree's
    # path, so it compiles in a fixed folder for its inputs instead of a fresh temporary one.
    host = Host(tmp_path, wheels=[], build_rc=75)
    cell, work = _tiny(host), tmp_path / "work"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the tree compiles on local disk, not in --work
    with pytest.raises(BuildError) as err:
        native.build_native(cell, host.toolchain, out=tmp_path / "out", work=work, finish=finish, audit=False,
                            budget=600, say=lambda m: None)
    assert err.value.exit_code == 5 and str(err.value) == (
        f"{cell.describe()}: stopped at its --budget of 600 s with its build tree kept in {work / 'resume'}: run the"
        " same command again (with or without --budget) to compile only what is left")
    (call,) = host.calls()
    inputs = call["env"]["IMAGEGEN_INPUTS"]
    tree = tmp_path / "cache" / "imagegen" / "native-builds" / inputs
    assert call["cell"]["work_dir"] == str(tree) and len(inputs) == 16
    assert (call["env"]["IMAGEGEN_BUILD_BUDGET"], call["env"]["IMAGEGEN_RESUME_DIR"]) == ("600", str(work / "resume"))
    assert not (tmp_path / "out").exists()
    # The same build again without the budget: a kept tree for its inputs (the script wrote it) is resumed in
    # the same folder, with no budget; another --work (or no tree kept) builds in a fresh temporary folder.
    (work / "resume").mkdir()
    (work / "resume" / f"{inputs}.tar").write_bytes(b"")
    again = Host(tmp_path)  # the same interpreter (its path is one of the inputs), now building a wheel
    monkeypatch.setenv("IMAGEGEN_BUILD_BUDGET", "5")  # the caller's own: never a build's budget
    for folder, resumed in ((work, True), (tmp_path / "elsewhere", False)):
        native.build_native(cell, again.toolchain, out=tmp_path / "out", work=folder, finish=finish, audit=False,
                            say=lambda m: None, flat=True)
        call = again.calls()[-1]
        assert call["cell"]["work_dir"] == (str(tree) if resumed else None)
        assert call["env"]["IMAGEGEN_BUILD_BUDGET"] is None
        assert call["env"]["IMAGEGEN_INPUTS"] == (inputs if resumed else None)


def test_the_audit_runs_first_and_its_load_sets_the_jobs(tmp_path):
    host = Host(tmp_path)
    cell = _tiny(host)
    said: list[str] = []
    dest = native.build_native(cell, host.toolchain, out=tmp_path / "out", work=tmp_path / "work", finish=finish,
                               say=said.append)
    assert [c["step"] for c in host.calls()] == ["audit", "build"]
    audit_call, build_call = host.calls()
    assert audit_call["args"][:2] == ["--out", str(tmp_path / "work" / "logs" / "audit.json")]
    assert (tmp_path / "work" / "imagegen_audit.py").is_file()  # the audit's stand-in compilers, for the script
    # The build's cell file carries the audit's per-extension load, so the script prints the same estimate.
    assert build_call["cell"]["load_profile"]["extensions"] and "load_profile" not in audit_call["cell"]
    entry = wheelhouse.read_manifest(dest.parent)["cells"][cell.name]
    assert entry["audit"]["verdict"] == "ok" and entry["jobs"]["from_audit"] is True and "audit" in entry["steps_s"]
    assert any(line.startswith("audit (1.5 s): what the build would compile\nextension") for line in said)


def test_a_refused_audit_stops_the_build_before_it_compiles(tmp_path):
    host = Host(tmp_path, audit=audit_report(["sm_80"]))  # the package would ignore 9.0 and +PTX
    cell = _tiny(host)
    with pytest.raises(CompatError) as info:
        native.build_native(cell, host.toolchain, out=tmp_path / "out", work=tmp_path / "work", finish=finish,
                            say=lambda m: None)
    assert str(info.value).startswith(f"cannot build {cell.describe()}: the gencode audit refuses it: ")
    assert "no extension would carry sm_90" in str(info.value) and "\n" not in str(info.value)
    assert [c["step"] for c in host.calls()] == ["audit"] and not (tmp_path / "out").exists()


def test_audit_native_fetches_a_git_source_then_judges_the_audit(tmp_path):
    host = Host(tmp_path, audit=json.loads((Path(__file__).resolve().parents[2] / "docs" / "records" / "gpu-results" / "2026-11-24"
                                            / "proof1" / "audit.json").read_text()))
    cell = _sage(host)
    said: list[str] = []
    verdict = native.audit_native(cell, host.toolchain, work=tmp_path / "work", say=said.append)
    assert [c["step"] for c in host.calls()] == ["fetch", "audit"]
    assert host.calls()[0]["cell"]["src_dir"] == str(tmp_path / "work" / "src")  # a git source: fetched into work
    assert verdict.ok and [r[0] for r in verdict.rows()][0] == "sageattention._qattn_sm90"
    assert any(line.startswith("audit: warning: sageattention._fused compiles") for line in said)


def test_a_given_source_folder_is_where_the_fetch_goes(tmp_path):
    host = Host(tmp_path, fetch_rc=7)
    cell = _sage(host)
    with pytest.raises(BuildError) as info:
        native.audit_native(cell, host.toolchain, work=tmp_path / "work", src_dir=tmp_path / "checkout",
                            say=lambda m: None)
    assert str(info.value) == (f"{cell.describe()}: the fetch step failed (exit 7);"
                               f" log: {tmp_path / 'work' / 'logs' / 'build.log'}")
    assert [c["step"] for c in host.calls()] == ["fetch"]
    assert host.calls()[0]["cell"]["src_dir"] == str(tmp_path / "checkout")


def test_a_failed_build_step_leads_with_the_compilers_first_error(tmp_path):
    failure = {"error": "csrc/add_one.cu(7): error: identifier \"x\" is undefined", "error_at": 10.25,
               "stopped_at": 11.75}
    host = Host(tmp_path, build_rc=2, wheels=[], failure=json.dumps(failure))
    cell = _tiny(host)
    with pytest.raises(BuildError) as info:
        native.build_native(cell, host.toolchain, out=tmp_path / "out", work=tmp_path / "work", finish=finish,
                            audit=False, say=lambda m: None)
    log = tmp_path / "work" / "logs" / "build.log"
    assert str(info.value) == (f"{failure['error']} ({cell.describe()}: the build step failed (exit 2); log: {log},"
                               " stopped 1.5 s after it)")
    assert info.value.exit_code == 5 and not (tmp_path / "out").exists()


@pytest.mark.parametrize("failure", [None, "{not json", json.dumps({"error": ""}), json.dumps(["a list"])])
def test_a_failed_build_step_without_a_usable_first_error_names_the_step_and_log(tmp_path, failure):
    host = Host(tmp_path, build_rc=1, wheels=[], failure=failure)
    cell = _tiny(host)
    with pytest.raises(BuildError) as info:
        native.build_native(cell, host.toolchain, out=tmp_path / "out", work=tmp_path / "work", finish=finish,
                            audit=False, say=lambda m: None)
    assert str(info.value) == (f"{cell.describe()}: the build step failed (exit 1);"
                               f" log: {tmp_path / 'work' / 'logs' / 'build.log'}")


@pytest.mark.parametrize("count", [0, 2])
def test_a_build_that_leaves_other_than_one_wheel_fails(tmp_path, count):
    other = tmp_path / "tiny_kernel-0.1.0+cu130torch2.11-cp312-cp312-linux_x86_64.whl"
    other.write_bytes(WHEEL.read_bytes())
    host = Host(tmp_path, wheels=[str(WHEEL), str(other)][:count])
    cell = _tiny(host)
    with pytest.raises(BuildError, match=r"^expected one wheel in .*/work/dist, found \[") as info:
        native.build_native(cell, host.toolchain, out=tmp_path / "out", work=tmp_path / "work", finish=finish,
                            audit=False, say=lambda m: None)
    assert (WHEEL.name in str(info.value)) == (count == 2)


def test_a_wheel_that_fails_verification_is_not_collected(tmp_path):
    host = Host(tmp_path)
    cell = _tiny(host, "8.0;12.0")  # the wheel has no sm_120
    with pytest.raises(BuildError) as info:
        native.build_native(cell, host.toolchain, out=tmp_path / "out", work=tmp_path / "work", finish=finish,
                            audit=False, say=lambda m: None)
    assert str(info.value).startswith(f"{WHEEL.name} failed verification: tiny_kernel/_C.")
    assert "lacks sm_120" in str(info.value) and not (tmp_path / "out").exists()


def test_a_wheel_whose_import_fails_is_not_collected(tmp_path):
    broken = tmp_path / "broken" / WHEEL.name
    broken.parent.mkdir()
    with zipfile.ZipFile(WHEEL) as src, zipfile.ZipFile(broken, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename == "tiny_kernel/__init__.py":
                data = b"raise ImportError('undefined symbol: _ZN3c104cuda')\n"
            dst.writestr(info, data)
    host = Host(tmp_path, wheels=[str(broken)])
    cell = _tiny(host)
    with pytest.raises(BuildError, match=r"`import tiny_kernel` failed: ImportError: undefined symbol"):
        native.build_native(cell, host.toolchain, out=tmp_path / "out", work=tmp_path / "work", finish=finish,
                            audit=False, say=lambda m: None)
    assert not (tmp_path / "out").exists()


def test_print_env_is_what_the_in_build_script_computes(tmp_path):
    host = Host(tmp_path)
    cell = _tiny(host)
    env = native.build_env_native(cell, host.toolchain, work=tmp_path / "work", max_jobs=5, nvcc_threads=1)
    assert env == {"TORCH_CUDA_ARCH_LIST": "8.0;9.0+PTX", "MAX_JOBS": "5", "NVCC_THREADS": "1", "PYTHONUNBUFFERED": "1",
                   "IMAGEGEN_BUILD_VERBOSE": None, "IMAGEGEN_BUILD_BUDGET": None, "IMAGEGEN_RESUME_DIR": None,
                   "IMAGEGEN_INPUTS": None}
    assert [c["step"] for c in host.calls()] == ["env"]
    written = json.loads((tmp_path / "work" / "cell.json").read_text())
    assert written == host.calls()[0]["cell"] and written["base_python"] == str(host.exe)


def test_print_env_that_the_script_cannot_compute_is_a_build_error(tmp_path):
    host = Host(tmp_path, env_output="Traceback (most recent call last): boom")
    cell = _tiny(host)
    with pytest.raises(BuildError, match=r"^could not compute the build environment: Traceback .*boom$"):
        native.build_env_native(cell, host.toolchain, work=tmp_path / "work")


# ------------------------------------------------------------------- a re-run of the same request


def _built(tmp_path, archs: str = "8.0;9.0+PTX"):
    """A native build of the tiny fixture into tmp_path/out (stand-in compile): host, cell, out, work, wheel."""
    host = Host(tmp_path)
    cell = _tiny(host, archs)
    out, work = tmp_path / "out", tmp_path / "work"
    wheel = native.build_native(cell, host.toolchain, out=out, work=work, finish=finish, audit=False, say=lambda m: None)
    return host, cell, out, work, wheel


def test_a_wheel_built_from_the_same_inputs_is_reused_and_says_why(tmp_path):
    host, cell, out, work, wheel = _built(tmp_path)
    reused = native.up_to_date(cell, host.toolchain, out=out, work=work)
    assert reused is not None and reused.wheel == wheel
    entry = wheelhouse.read_manifest(wheel.parent)["cells"][cell.name]
    assert reused.inputs == entry["inputs"]  # the hash the build recorded, computed again the same way
    assert reused.line() == (f"up to date: {wheel}: built from the same inputs ({entry['inputs']}) and still the file"
                             " its manifest's sha256 records, so nothing is compiled (--force rebuilds it)")
    # Only the inputs hash is computed: no in-build script ran, and --work was not written to again.
    calls = len(host.calls())
    before = sorted(p for p in work.rglob("*"))
    native.up_to_date(cell, host.toolchain, out=out, work=work)
    assert len(host.calls()) == calls and sorted(work.rglob("*")) == before


@pytest.mark.parametrize("change", ["tampered", "truncated", "removed"])
def test_a_wheel_changed_since_its_build_is_not_reused(tmp_path, change):
    host, cell, out, work, wheel = _built(tmp_path)
    data = wheel.read_bytes()
    if change == "tampered":  # same size, one byte different
        wheel.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    elif change == "truncated":
        wheel.write_bytes(data[: len(data) // 2])
    else:
        wheel.unlink()
    assert native.up_to_date(cell, host.toolchain, out=out, work=work) is None


def test_other_inputs_are_not_the_wheel_built(tmp_path):
    host, cell, out, work, _ = _built(tmp_path)
    # Another arch list, another work folder (where the build's logs and tree go), another host Python.
    assert native.up_to_date(_tiny(host, "8.0"), host.toolchain, out=out, work=work) is None
    assert native.up_to_date(cell, host.toolchain, out=out, work=tmp_path / "elsewhere") is None
    other = HostToolchain(python_exe=str(tmp_path / "other-python"), python="3.11", torch="2.11.0", torch_cuda="13.0",
                          cuda_home=None, nvcc=Version("13.0"), gpus=())
    assert native.up_to_date(cell, other, out=out, work=work) is None
    assert native.up_to_date(cell, host.toolchain, out=tmp_path / "empty", work=work) is None


def test_a_local_tree_edited_since_the_build_is_built_again(tmp_path):
    import shutil

    from imagegen.model.source_tree import recipe_from_source_tree

    tree = tmp_path / "tiny_kernel"
    shutil.copytree(FIXTURES / "tiny_kernel", tree)
    host = Host(tmp_path)
    recipe = recipe_from_source_tree(tree)
    cell = preflight(recipe, recipe.version(None), parse_arch_list("8.0;9.0+PTX"), host.toolchain)
    out, work = tmp_path / "out", tmp_path / "work"
    native.build_native(cell, host.toolchain, out=out, work=work, finish=finish, audit=False, say=lambda m: None)
    assert native.up_to_date(cell, host.toolchain, out=out, work=work) is not None
    (tree / "csrc" / "extra.cu").write_text("// a new kernel\n")
    assert native.up_to_date(cell, host.toolchain, out=out, work=work) is None
