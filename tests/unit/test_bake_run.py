"""Tests for imagegen.executors.bake_run: the variables every bake sets, which CA bundle builds
trust, the bake data with the pip_cert secret (an empty stand-in when the host has none), run folders
of their own, the run's bake file (absolute outputs and contexts, companions, job secrets, cache
settings, the re-render command), and run_bake's reading of a bake (per-target logs and steps, the
failed cells and bake's own error) with a stand-in for engine.bake."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from imagegen import engine
from imagegen.executors import bake_run
from imagegen.executors.bake_log import AUDIT_SUFFIX, LOG_SUFFIX, TargetLogs
from imagegen.executors.bake_run import bake_data, bake_variables, default_ca_bundle, new_run_dir, prepare_run, run_bake
from imagegen.model.arch_parse import parse_arch_list
from imagegen.model.catalogue import load_catalogue
from imagegen.model.cell import Plan
from imagegen.plan.matrix import make_cell
from imagegen.render.bake import build_definition
from tests.unit.executor_fixtures import FIXTURES, FakeBake, output_dest, tiny_cell


def test_every_bake_sets_the_ca_bundle_and_blanks_the_overrides(monkeypatch):
    monkeypatch.delenv("IMAGEGEN_AUDIT_PROBE", raising=False)
    assert bake_variables("/etc/ca.pem") == {
        "BUILDX_BAKE_ENTITLEMENTS_FS": "0",  # no prompt for the local folders the bake file names
        "IMAGEGEN_PIP_CERT": "/etc/ca.pem",
        # The file's own defaults, not whatever the caller's environment holds.
        "IMAGEGEN_TORCH_CUDA_ARCH_LIST": "", "IMAGEGEN_MAX_JOBS": "", "IMAGEGEN_NVCC_THREADS": "",
        "IMAGEGEN_AUDIT_PROBE": "",
        # the compile cache's secret reads this one: empty (no remote) unless `build --compile-cache` gave one
        "IMAGEGEN_CCACHE_REMOTE": "",
    }
    assert bake_variables("/etc/ca.pem", "redis://pw@h:1")["IMAGEGEN_CCACHE_REMOTE"] == "redis://pw@h:1"
    # ...except the header probe's switch: IMAGEGEN_AUDIT_PROBE=0 imagegen build skips it, as natively
    monkeypatch.setenv("IMAGEGEN_AUDIT_PROBE", "0")
    assert bake_variables("/etc/ca.pem")["IMAGEGEN_AUDIT_PROBE"] == "0"


def test_the_ca_bundle_is_the_first_existing_one_pip_would_use(tmp_path, monkeypatch):
    bundles = {}
    for var in ("IMAGEGEN_PIP_CERT", "PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):
        bundles[var] = tmp_path / f"{var.lower()}.pem"
        bundles[var].write_text("-----BEGIN CERTIFICATE-----\n")
        monkeypatch.setenv(var, str(bundles[var]))
    assert default_ca_bundle() == str(bundles["IMAGEGEN_PIP_CERT"])
    monkeypatch.setenv("IMAGEGEN_PIP_CERT", str(tmp_path / "missing.pem"))  # named but not there: passed over
    assert default_ca_bundle() == str(bundles["PIP_CERT"])
    monkeypatch.setenv("PIP_CERT", str(tmp_path))  # a folder is no bundle
    assert default_ca_bundle() == str(bundles["REQUESTS_CA_BUNDLE"])
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "")
    assert default_ca_bundle() == str(bundles["SSL_CERT_FILE"])


def _definition(tmp_path: Path, *cells):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    definition = build_definition(Plan(cells=list(cells)), out_dir=str(run_dir / "stage"),
                                  dockerfiles_dir=str(run_dir / "dockerfiles"), root=run_dir, command="imagegen build")
    return definition, run_dir


def test_bake_data_writes_the_dockerfiles_and_points_the_secret_at_the_bundle(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cell = tiny_cell()
    definition, run_dir = _definition(tmp_path, cell)
    (tmp_path / "certs").mkdir()
    (tmp_path / "certs" / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\n")
    data, ca = bake_data(definition, run_dir, "certs/ca.pem")
    assert ca == str(tmp_path / "certs" / "ca.pem")  # absolute: bake runs from elsewhere
    assert data["variable"]["IMAGEGEN_PIP_CERT"]["default"] == ca
    assert set(data["target"]) == {cell.name}
    dockerfile = run_dir / "dockerfiles" / f"{cell.name}.Dockerfile"
    assert dockerfile.is_file() and "FROM " in dockerfile.read_text()
    assert "id=pip_cert,src=${IMAGEGEN_PIP_CERT}" in data["target"][cell.name]["secret"]


def test_without_any_ca_bundle_an_empty_file_stands_in(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(bake_run, "default_ca_bundle", lambda: None)  # a host with no bundle anywhere
    definition, run_dir = _definition(tmp_path, tiny_cell())
    data, ca = bake_data(definition, run_dir, None)
    assert ca == str((run_dir / "no-ca-bundle.pem").resolve()) and Path(ca).read_text() == ""
    assert data["variable"]["IMAGEGEN_PIP_CERT"]["default"] == ca  # the secret always resolves


def test_run_folders_are_new_each_time_and_carry_the_tag(tmp_path):
    work = tmp_path / "not-yet"
    first, second = new_run_dir(work, "-audit"), new_run_dir(work, "-audit")
    assert first != second and first.parent == second.parent == work / "runs"
    assert first.is_dir() and not any(first.iterdir())
    stamp, _, rest = first.name.partition("-audit-")
    assert len(stamp) == len("20260101-120000") and stamp[8] == "-" and stamp.replace("-", "").isdigit() and rest
    assert new_run_dir(work).name.count("-") >= 2  # no tag: the stamp and the unique part


def test_prepare_run_gives_every_cell_three_targets_with_absolute_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cells = [tiny_cell(python="3.11"), tiny_cell(python="3.12")]
    run = prepare_run(cells, tmp_path / "work", ca_bundle=None, cache_from=["type=registry,ref=r/c"],
                      cache_to=["type=registry,ref=r/c,mode=max"], command="imagegen pull", tag="-t")
    assert run.dir.parent == tmp_path / "work" / "runs" and "-t-" in run.dir.name
    assert run.stage == run.dir / "stage" and run.bake_file == run.dir / "docker-bake.json"
    data = json.loads(run.bake_file.read_text())
    names = {c.name + s for c in cells for s in ("", LOG_SUFFIX, AUDIT_SUFFIX)}
    assert set(data["target"]) == names
    for name, target in data["target"].items():
        assert output_dest(target) == run.stage / name  # one staging folder per target
        assert target["context"] == str(run.dir / "dockerfiles")
        assert target["contexts"] == {"imagegen-scripts": str(run.dir / "dockerfiles" / "imagegen-scripts"),
                                      "source": str(FIXTURES / "tiny_kernel")}
        assert target["cache-from"] == ["type=registry,ref=r/c"]
        # Only the wheel target exports the cache: its companions build the same layers.
        assert ("cache-to" in target) == (name in {c.name for c in cells})
    for cell in cells:
        assert run.jobs_file(cell.name) == run.dir / "jobs" / f"{cell.name}.env" and run.jobs_file(cell.name).is_file()
        dockerfile = (run.dir / "dockerfiles" / f"{cell.name}.Dockerfile").read_text()
        assert ": imagegen pull" in dockerfile.splitlines()[1]
    assert (run.dir / "dockerfiles" / "imagegen-scripts" / "imagegen_build.py").is_file()
    assert data["variable"]["IMAGEGEN_PIP_CERT"]["default"] == run.ca and os.path.isabs(run.ca)


def test_prepare_run_without_cache_settings_names_none(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = prepare_run([tiny_cell()], tmp_path / "work")
    for target in json.loads(run.bake_file.read_text())["target"].values():
        assert "cache-from" not in target and "cache-to" not in target


@pytest.fixture
def bake(monkeypatch):
    """Install a FakeBake for engine.bake; the test sets its behaviour."""
    fake = FakeBake()
    monkeypatch.setattr(engine, "bake", fake)
    return fake


def test_run_bake_feeds_each_targets_lines_to_its_cells_log_and_says_steps(tmp_path, monkeypatch, bake):
    monkeypatch.chdir(tmp_path)
    cells = [tiny_cell(python="3.11"), tiny_cell(python="3.12")]
    run = prepare_run(cells, tmp_path / "work")
    logs = TargetLogs(tmp_path / "logs", [c.name for c in cells])
    steps: list[tuple[str, str]] = []
    targets = [cells[0].name, cells[0].name + LOG_SUFFIX, cells[1].name]
    assert run_bake(run.bake_file, targets, logs, lambda t, s: steps.append((t, s)), "farm", run.ca) is True
    logs.close()
    (call,) = bake.calls
    assert call["targets"] == targets and call["builder"] == "farm" and call["variables"] == bake_variables(run.ca)
    assert [t for t, _ in steps] == [cells[0].name, cells[0].name, cells[1].name]  # companions count as their cell
    assert steps[0][1] == "wheels 1/1 RUN python /imagegen/imagegen_build.py wheels"
    assert f"compiled {cells[0].name}{LOG_SUFFIX}" in (tmp_path / "logs" / f"{cells[0].name}.log").read_text()
    assert logs.sole is None and logs.failed == set() and logs.bake_error == ""
    assert (run.stage / cells[1].name / "tiny_kernel-0.1.0+cu130torch2.11-cp311-cp311-linux_x86_64.whl").is_file()


def test_run_bake_of_one_target_knows_its_cell(tmp_path, monkeypatch, bake):
    monkeypatch.chdir(tmp_path)
    cell = tiny_cell()
    run = prepare_run([cell], tmp_path / "work")
    logs = TargetLogs(tmp_path / "logs", [cell.name])
    assert run_bake(run.bake_file, [cell.name + AUDIT_SUFFIX], logs, lambda t, s: None, None, run.ca)
    logs.close()
    assert logs.sole == cell.name  # bake names no target in its lines when it runs only one
    assert bake.calls[0]["builder"] is None


def test_run_bake_records_the_failed_cells_and_bakes_last_error(tmp_path, monkeypatch, bake):
    monkeypatch.chdir(tmp_path)
    good, bad = tiny_cell(python="3.11"), tiny_cell(python="3.12")
    run = prepare_run([good, bad], tmp_path / "work")
    logs = TargetLogs(tmp_path / "logs", [good.name, bad.name])
    bake.fail = {bad.name}
    targets = [good.name, good.name + LOG_SUFFIX, bad.name, bad.name + LOG_SUFFIX]
    assert run_bake(run.bake_file, targets, logs, lambda t, s: None, None, run.ca) is False
    logs.close()
    assert logs.failed == {bad.name}  # the cancelled neighbour is not a failure of its own
    assert logs.bake_error == (f"ERROR: target {bad.name}{LOG_SUFFIX}: failed to solve:"
                               " process did not complete successfully")


def test_a_bake_that_fails_before_any_target_keeps_bakes_error(tmp_path, monkeypatch, bake):
    monkeypatch.chdir(tmp_path)
    cell = tiny_cell()
    run = prepare_run([cell], tmp_path / "work")
    logs = TargetLogs(tmp_path / "logs", [cell.name])
    bake.bake_error = "ERROR: failed to read docker-bake.json: invalid secret id"
    assert run_bake(run.bake_file, [cell.name], logs, lambda t, s: None, None, run.ca) is False
    logs.close()
    assert logs.failed == set() and logs.bake_error == "ERROR: failed to read docker-bake.json: invalid secret id"


# ------------------------------------------------------- moved from test_execute_units.py


def test_a_bake_run_hands_every_target_its_job_secret(tmp_path):
    from imagegen.executors.bake_run import prepare_run
    from imagegen.shipped.builder.imagegen_rules import JOBS_SECRET

    recipe = load_catalogue().get("sageattention")
    cell = make_cell(recipe, recipe.version(None), "2.11", "13.0", "3.11", parse_arch_list("9.0"), "pypi")
    run = prepare_run([cell], tmp_path / "work")
    data = json.loads(run.bake_file.read_text())
    assert set(data["target"]) == {cell.name, cell.name + "--log", cell.name + "--audit"}
    for target in data["target"].values():
        assert f"id={JOBS_SECRET},src={run.jobs_file(cell.name)}" in target["secret"]
        assert any(s.startswith("id=pip_cert,") for s in target["secret"])
        # Never a number in a build arg (a cache key): the ARG stays the variable run_bake blanks.
        assert not str(target.get("args", {}).get("MAX_JOBS", "")).isdigit()
    assert run.jobs_file(cell.name).is_file()
    # The compile step mounts it; the Dockerfile still takes ARGs for a plain `docker buildx build`.
    dockerfile = next((run.dir / "dockerfiles").glob("*.Dockerfile")).read_text()
    assert "--mount=type=secret,id=imagegen_jobs" in dockerfile and "ARG MAX_JOBS=" in dockerfile


def _cell():
    r = load_catalogue().get("sage")
    return make_cell(r, r.version(None), "2.8", "12.8", "3.12", parse_arch_list("9.0"), "cuda")


def test_every_cell_gets_log_and_audit_companion_targets(tmp_path, monkeypatch):
    from imagegen.executors.bake_log import AUDIT_SUFFIX, LOG_SUFFIX, cell_of
    from imagegen.executors.bake_run import prepare_run
    from imagegen.model.cell import Plan

    monkeypatch.chdir(tmp_path)
    cell = _cell()
    run = prepare_run([cell], tmp_path / "work", ca_bundle=None, cache_from=["type=local,src=/c"],
                      cache_to=["type=inline"])
    data = json.loads(run.bake_file.read_text())
    wheel, log, audit = (data["target"][cell.name + s] for s in ("", LOG_SUFFIX, AUDIT_SUFFIX))
    assert (wheel["target"], log["target"], audit["target"]) == ("wheels", "buildlog", "audit-report")
    assert audit["output"] == [f"type=local,dest={run.stage / (cell.name + AUDIT_SUFFIX)}"]
    # The companions build the same Dockerfile with the same args, so they share the cell's layers.
    assert audit["dockerfile"] == wheel["dockerfile"] and audit["args"] == wheel["args"]
    assert all(t["cache-from"] == ["type=local,src=/c"] for t in (wheel, log, audit))
    assert "cache-to" in wheel and "cache-to" not in log and "cache-to" not in audit
    # The Dockerfile has the stage the audit target names.
    dockerfile = (Path(wheel["context"]) / wheel["dockerfile"]).read_text()
    assert "FROM scratch AS audit-report" in dockerfile and "FROM base AS audit" in dockerfile
    assert {cell_of(n) for n in data["target"]} == {cell.name}
    assert cell_of("x--audit--log") == "x--audit" and Plan(cells=[cell]).buildable == [cell]

