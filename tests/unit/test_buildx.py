"""Tests for imagegen.executors.buildx: building a plan with bake, driven by a stand-in for
engine.bake that exports what each target's build would: up-to-date cells need no engine, each
batch's job settings go into the job secrets, a built wheel is finished with its log companion's
reports, a failing cell fails alone while the neighbours it cancelled are built again on their own,
the audit gate refuses a cell before it compiles, cells are dealt out over several builders, and a
cache export the docker driver cannot do is refused up front."""

from __future__ import annotations

import json

import pytest

from imagegen import engine
from imagegen.wheelhouse import manifest as wheelhouse
from imagegen.wheelhouse import collect
from imagegen.errors import UsageError
from imagegen.executors import buildx
from imagegen.executors.bake_log import AUDIT_SUFFIX, LOG_SUFFIX
from imagegen.finish.finisher import finish
from imagegen.model import jobs
from imagegen.model.cell import Plan
from imagegen.render.dockerfile import cell_document, inputs_hash
from tests.unit.executor_fixtures import WHEEL, FakeBake, audit_report, temp_files_under, tiny_cell

PY311, PY312 = tiny_cell(python="3.11"), tiny_cell(python="3.12")


@pytest.fixture(autouse=True)
def _temp_files(tmp_path, monkeypatch):
    """Temporary files (the import test's folder, verify's extracted .so files) under tmp_path."""
    temp_files_under(tmp_path, monkeypatch)


@pytest.fixture
def bake(monkeypatch, tmp_path):
    """engine.bake replaced by a FakeBake, a fixed big machine (every cell in one batch), and the
    tests' own folder as the current one."""
    cp312 = tmp_path / "wheels" / WHEEL.name.replace("cp311-cp311", "cp312-cp312")
    cp312.parent.mkdir()
    cp312.write_bytes(WHEEL.read_bytes())
    fake = FakeBake(wheels={PY312.name: cp312}, smoke={"tiny_kernel": "ok"},
                    ccache={"hits": 7, "misses": 1, "hit_rate": 0.875})
    monkeypatch.setattr(engine, "bake", fake)
    monkeypatch.setattr(jobs, "host", lambda: jobs.Host(cpus=64, mem_gb=512))
    monkeypatch.chdir(tmp_path)
    return fake


def _build(tmp_path, cells, said, **kw):
    kw.setdefault("audit", False)
    return buildx.build(Plan(cells=list(cells)), out=tmp_path / "out", work=tmp_path / "work", finish=finish,
                        say=said.append, **kw)


def test_built_cells_are_finished_with_their_log_companions_reports(tmp_path, bake):
    said: list[str] = []
    results = _build(tmp_path, [PY311, PY312], said, max_jobs=6, nvcc_threads=2)
    assert [r.status for r in results] == ["built", "built"] and [r.cell for r in results] == [PY311, PY312]
    (call,) = bake.calls  # one batch: both cells and their log companions
    assert call["targets"] == [PY311.name, PY312.name, PY311.name + LOG_SUFFIX, PY312.name + LOG_SUFFIX]
    assert results[0].wheel.name == WHEEL.name and results[1].wheel.name.endswith("-cp312-cp312-linux_x86_64.whl")
    for r in results:
        assert r.wheel.parent == wheelhouse.cell_dir(tmp_path / "out", r.cell) and r.wheel.is_file()
        assert r.log.read_text() == f"compile log of {r.cell.name}\n"  # the build's own log, kept in OUT
        assert r.smoke == {"tiny_kernel": "ok"} and r.ccache == {"hits": 7, "misses": 1, "hit_rate": 0.875}
        entry = wheelhouse.read_manifest(r.wheel.parent)["cells"][r.cell.name]
        assert entry["inputs"] == inputs_hash(r.cell, cell_document(r.cell)) and entry["smoke"] == r.smoke
        assert entry["ccache"] == r.ccache and entry["log"] == str(r.log)
    # The batch's job settings went to each cell's job secret, not into a build arg.
    (run_dir,) = (tmp_path / "work" / "runs").iterdir()
    assert (run_dir / "jobs" / f"{PY311.name}.env").read_text() == "MAX_JOBS=6\nNVCC_THREADS=2\n"
    assert any("building 2 cell(s)" in line and "2 at a time" in line for line in said)


def test_up_to_date_cells_need_no_engine_and_no_run_folder(tmp_path, bake):
    for cell, wheel in ((PY311, WHEEL), (PY312, bake.wheels[PY312.name])):
        collect.place(tmp_path / "out", cell, wheel, inputs=inputs_hash(cell, cell_document(cell)), record={})
    said: list[str] = []
    results = _build(tmp_path, [PY311, PY312], said)
    assert [r.status for r in results] == ["up-to-date", "up-to-date"]
    assert results[0].wheel == wheelhouse.cell_dir(tmp_path / "out", PY311) / WHEEL.name
    assert results[1].wheel == wheelhouse.cell_dir(tmp_path / "out", PY312) / bake.wheels[PY312.name].name
    assert bake.calls == [] and not (tmp_path / "work").exists()
    assert said == [f"[{c.name}] up to date: {r.wheel}" for c, r in zip((PY311, PY312), results)]
    # --force builds them again.
    forced = _build(tmp_path, [PY311], said, force=True)
    assert forced[0].status == "built" and len(bake.calls) == 1


def test_a_failing_cell_fails_alone_and_the_neighbour_it_cancelled_is_built_again(tmp_path, bake):
    bake.fail = {PY311.name}
    bake.errors = {PY311.name: "csrc/add_one.cu(7): error: identifier \"x\" is undefined"}
    said: list[str] = []
    failed, built = _build(tmp_path, [PY311, PY312], said)
    assert failed.status == "failed" and failed.wheel is None
    assert failed.error == "csrc/add_one.cu(7): error: identifier \"x\" is undefined (the build failed)"
    (run_dir,) = (tmp_path / "work" / "runs").iterdir()
    assert failed.log == run_dir / "logs" / f"{PY311.name}.log"
    assert any("error: identifier" in line for line in failed.log_tail)
    assert built.status == "built"
    assert [c["targets"] for c in bake.calls] == [
        [PY311.name, PY312.name, PY311.name + LOG_SUFFIX, PY312.name + LOG_SUFFIX],
        [PY312.name, PY312.name + LOG_SUFFIX],  # alone this time
    ]
    assert f"[{PY312.name}] cancelled by a failing neighbour; queued again on its own" in said
    # The two cells share a wheel folder (they differ by Python only): only the built one is recorded.
    assert set(wheelhouse.read_manifest(built.wheel.parent)["cells"]) == {PY312.name}


def test_a_bake_that_fails_before_building_says_so(tmp_path, bake):
    bake.bake_error = "ERROR: failed to parse docker-bake.json: unknown key"
    (result,) = _build(tmp_path, [PY311], [])
    assert result.status == "failed"
    assert result.error == "bake failed before building: ERROR: failed to parse docker-bake.json: unknown key"


def test_a_build_that_exports_no_wheel_fails(tmp_path, bake):
    bake.wheels = {PY311.name: None}
    (result,) = _build(tmp_path, [PY311], [])
    assert result.status == "failed" and result.error == "the build produced no wheel"


def test_a_wheel_that_fails_verification_is_a_failed_cell(tmp_path, bake):
    cell = tiny_cell("8.0;12.0")  # the exported wheel has no sm_120
    (result,) = _build(tmp_path, [cell], [])
    assert result.status == "failed" and result.error.startswith("verification failed: ") and "sm_120" in result.error
    assert result.log.read_text() == f"compile log of {cell.name}\n"  # still the build's own log
    assert not (tmp_path / "out").exists()


def test_unreadable_reports_are_left_out(tmp_path, bake):
    bake.ccache = ["not", "an", "object"]
    bake.smoke = None  # no smoke.json at all
    (result,) = _build(tmp_path, [PY311], [])
    assert result.status == "built" and result.ccache is None and result.smoke is None


def test_the_audit_gate_refuses_a_cell_before_anything_compiles(tmp_path, bake):
    bake.audits = {PY311.name: audit_report(["sm_80", "sm_90"], ["compute_90"]), PY312.name: audit_report(["sm_80"])}
    said: list[str] = []
    passed, refused = _build(tmp_path, [PY311, PY312], said, audit=True)
    assert [c["targets"] for c in bake.calls] == [[PY311.name + AUDIT_SUFFIX, PY312.name + AUDIT_SUFFIX],
                                                  [PY311.name, PY311.name + LOG_SUFFIX]]
    assert refused.status == "failed" and refused.audit["verdict"] == "refused"
    assert refused.error.startswith(f"cannot build {PY312.describe()}: the gencode audit refuses it: ")
    assert passed.status == "built" and passed.audit["verdict"] == "ok"
    entry = wheelhouse.read_manifest(passed.wheel.parent)["cells"][PY311.name]
    assert entry["audit"]["extensions"][0]["sass"] == ["sm_80", "sm_90"]
    assert f"[{PY312.name}] audit (1.5 s): REFUSED; what the build would compile:" in said


def test_cells_are_dealt_out_over_several_builders(tmp_path, bake):
    said: list[str] = []
    results = _build(tmp_path, [PY311, PY312], said, builders=["node-a", "node-b"])
    assert [r.status for r in results] == ["built", "built"]
    assert sorted((c["builder"], c["targets"][0]) for c in bake.calls) == [("node-a", PY311.name),
                                                                           ("node-b", PY312.name)]
    assert "splitting 2 cell(s) over 2 builders: node-a (1), node-b (1)" in said
    (run_dir,) = (tmp_path / "work" / "runs").iterdir()
    assert (run_dir / "logs" / "node-a" / f"{PY311.name}.log").is_file()
    assert (run_dir / "logs" / "node-b" / f"{PY312.name}.log").is_file()


def test_a_re_run_gives_each_cell_the_builder_it_had(tmp_path, bake):
    # A cell's builder is where its stopped compile's tree is kept (--budget): a re-run of the same matrix
    # on the same builders must send it there even when the cells before it are up to date now.
    first = _build(tmp_path, [PY311, PY312], [], builders=["node-a", "node-b"])
    assert [r.status for r in first] == ["built", "built"]
    first[1].wheel.unlink()  # PY312's wheel is gone (a stopped build makes none): built again, PY311 is up to date
    bake.calls.clear()
    said: list[str] = []
    again = _build(tmp_path, [PY311, PY312], said, builders=["node-a", "node-b"])
    assert [r.status for r in again] == ["up-to-date", "built"]
    assert [(c["builder"], c["targets"][0]) for c in bake.calls] == [("node-b", PY312.name)]
    assert "splitting 1 cell(s) over 2 builders: node-a (0), node-b (1)" in said


def test_inline_cache_needs_no_question_to_the_engine(monkeypatch):
    def no_engine(builder):
        raise AssertionError("the engine was asked")

    monkeypatch.setattr(engine, "builder_driver", no_engine)
    buildx.validate_cache_support([None, "farm"], [])
    buildx.validate_cache_support([None, "farm"], ["type=inline"])


def test_a_cache_export_on_the_docker_driver_is_refused_up_front(monkeypatch):
    drivers = {None: "docker", "farm": "docker-container", "old": "docker"}
    monkeypatch.setattr(engine, "builder_driver", lambda builder: drivers[builder])
    buildx.validate_cache_support(["farm"], ["type=registry,ref=r/cache"])
    with pytest.raises(UsageError) as info:
        buildx.validate_cache_support(["farm", None], ["type=gha"])
    assert str(info.value).startswith("builder (current) uses the docker driver, which exports only inline cache:")
    assert "--cache-to type=inline" in str(info.value) and info.value.exit_code == 2
    with pytest.raises(UsageError, match="^builder old uses the docker driver"):
        buildx.validate_cache_support(["old"], ["type=local,dest=/c"])


def test_a_refused_cache_export_stops_the_build_before_baking(tmp_path, bake, monkeypatch):
    monkeypatch.setattr(engine, "builder_driver", lambda builder: "docker")
    with pytest.raises(UsageError):
        _build(tmp_path, [PY311], [], cache_to=["type=registry,ref=r/cache"])
    assert bake.calls == []
    (run_dir,) = (tmp_path / "work" / "runs").iterdir()
    bake_file = json.loads((run_dir / "docker-bake.json").read_text())
    assert bake_file["target"][PY311.name]["cache-to"] == ["type=registry,ref=r/cache"]


# `docker buildx inspect` of the docker driver here (buildx 0.13.1): before and after QEMU's binfmt
# handler for aarch64 was registered (imagegen setup qemu).
INSPECT_NO_QEMU = """Name:          default
Driver:        docker
Last Activity: 2026-11-25 17:12:02 +0000 UTC

Nodes:
Name:             default
Endpoint:         default
Status:           running
BuildKit version: v0.0.0+unknown
Platforms:        linux/amd64, linux/amd64/v2, linux/amd64/v3, linux/386
Labels:
 org.mobyproject.buildkit.worker.moby.host-gateway-ip: 172.17.0.1
"""
INSPECT_QEMU = INSPECT_NO_QEMU.replace("linux/amd64/v3, linux/386", "linux/amd64/v3, linux/arm64, linux/386")


def test_builder_platforms_are_read_from_buildx_inspect():
    assert "linux/arm64" not in buildx.builder_platforms(INSPECT_NO_QEMU)
    assert buildx.builder_platforms(INSPECT_QEMU) >= {"linux/amd64", "linux/arm64"}
    assert buildx.builder_platforms("Platforms: linux/amd64*, linux/arm64*\n") == {"linux/amd64", "linux/arm64"}


@pytest.mark.parametrize("inspect, built", [(INSPECT_NO_QEMU, False), (INSPECT_QEMU, True)])
def test_an_arm64_cell_the_builder_cannot_run_fails_before_anything_builds(monkeypatch, inspect, built):
    import subprocess
    from dataclasses import replace
    arm = replace(PY312, platform="linux/arm64")
    asked = []

    def docker(*args, **kw):
        asked.append(args)
        return subprocess.CompletedProcess(["docker", *args], 0, inspect, "")
    monkeypatch.setattr(engine, "docker", docker)
    results = {}
    kept = buildx.runnable_platforms([PY311, arm], ["farm"], results)
    assert asked == [("buildx", "inspect", "farm")]
    if built:
        assert kept == [PY311, arm] and results == {}
    else:
        assert kept == [PY311]  # the amd64 cell builds as before
        assert results[arm.name].status == "refused"  # not a failed build (issue 32, item 16)
        assert "cannot run linux/arm64 build steps" in results[arm.name].error
        assert "imagegen setup qemu" in results[arm.name].error


def test_amd64_cells_alone_ask_the_builder_nothing(monkeypatch):
    monkeypatch.setattr(engine, "docker", lambda *a, **k: pytest.fail("no buildx inspect for amd64 cells"))
    assert buildx.runnable_platforms([PY311, PY312], [], {}) == [PY311, PY312]


def test_each_cells_document_and_inputs_hash_are_worked_out_once_per_build(tmp_path, bake, monkeypatch):
    # Issue 33: the up-to-date check and the Dockerfile of a cell read the same inputs, worked out once.
    from imagegen.render import dockerfile

    made: list[str] = []
    real = dockerfile.cell_document
    monkeypatch.setattr(dockerfile, "cell_document", lambda cell: made.append(cell.name) or real(cell))
    results = _build(tmp_path, [PY311, PY312], [])
    assert [r.status for r in results] == ["built", "built"]
    assert sorted(made) == sorted([PY311.name, PY312.name])
    text = next((tmp_path / "work" / "runs").glob(f"*/dockerfiles/{PY311.name}.Dockerfile")).read_text()
    assert f'io.imagegen.inputs="{inputs_hash(PY311, cell_document(PY311))}"' in text
