"""Tests for imagegen.executors.buildx_audit: `plan --audit` (each buildable cell's audit-report
target baked in its own run folder, AUDIT_BATCH at a time, a cancelled one again alone, each report
judged), what is said of a verdict, and the gate in front of a compile (passed cells go on with
their verdicts, refused ones and ones whose audit could not run fail with the reason). engine.bake
is a stand-in that exports the audit reports a build would."""

from __future__ import annotations

import pytest

from imagegen import engine
from imagegen.model.audit import judge_cell
from imagegen.model.audit_report import AuditReport
from imagegen.executors import buildx_audit
from imagegen.executors.bake_log import AUDIT_SUFFIX, TargetLogs
from imagegen.executors.bake_run import prepare_run
from imagegen.model.arch_parse import parse_arch_list
from imagegen.model.cell import Plan
from imagegen.plan.matrix import make_cell
from tests.unit.executor_fixtures import FakeBake, audit_report, tiny_cell, tiny_recipe

PY311, PY312 = tiny_cell(python="3.11"), tiny_cell(python="3.12")
GOOD = audit_report(["sm_80", "sm_90"], ["compute_90"])  # what 8.0;9.0+PTX asks for
IGNORES_ARCH = audit_report(["sm_80"])  # a build that ignores --arch


@pytest.fixture
def bake(monkeypatch, tmp_path):
    fake = FakeBake()
    monkeypatch.setattr(engine, "bake", fake)
    monkeypatch.chdir(tmp_path)
    return fake


def test_a_plan_without_buildable_cells_audits_nothing(tmp_path, bake):
    recipe = tiny_recipe()
    rejected = make_cell(recipe, recipe.version(None), "2.11", "13.0", "3.8", parse_arch_list("8.0"), "pypi")
    assert not rejected.buildable
    assert buildx_audit.audit(Plan(cells=[rejected]), work=tmp_path / "work") == []
    assert bake.calls == [] and not (tmp_path / "work").exists()


def test_plan_audit_judges_each_cells_report_in_its_own_run(tmp_path, bake):
    bake.audits = {PY311.name: GOOD, PY312.name: IGNORES_ARCH}
    said: list[str] = []
    ok, refused = buildx_audit.audit(Plan(cells=[PY311, PY312]), work=tmp_path / "work", builder="farm",
                                     say=said.append)
    (call,) = bake.calls
    assert call["targets"] == [PY311.name + AUDIT_SUFFIX, PY312.name + AUDIT_SUFFIX] and call["builder"] == "farm"
    assert (ok.cell, ok.error, ok.verdict.ok) == (PY311, "", True)
    assert (refused.cell, refused.error, refused.verdict.ok) == (PY312, "", False)
    assert "no extension would carry sm_90" in refused.verdict.refusals[0]
    (run_dir,) = (tmp_path / "work" / "runs").iterdir()
    assert "-audit-" in run_dir.name and ok.log == run_dir / "logs" / f"{PY311.name}.log" and ok.log.is_file()
    dockerfile = (run_dir / "dockerfiles" / f"{PY311.name}.Dockerfile").read_text()
    assert ": imagegen plan --audit" in dockerfile.splitlines()[1]
    assert said[0].startswith("auditing 2 cell(s): each package's own build with stand-in compilers")
    assert f"[{PY312.name}] audit (1.5 s): REFUSED; what the build would compile:" in said
    assert f"[{PY312.name}] audit: refused: {refused.verdict.refusals[0]}" in said


def test_say_verdict_prints_the_table_and_findings_under_the_cells_name():
    verdict = judge_cell(AuditReport.from_json(GOOD), PY311)
    said: list[str] = []
    buildx_audit.say_verdict(PY311, verdict, said.append)
    assert said == [f"[{PY311.name}] audit (1.5 s): ok; what the build would compile:",
                    *(f"[{PY311.name}]   {line}" for line in verdict.table().splitlines())]
    assert said[2].split() == [f"[{PY311.name}]", "tiny_kernel._C", "sm_80", "sm_90", "compute_90", "-O3"]


def test_an_audit_cancelled_by_a_failing_neighbour_runs_again_alone(tmp_path, bake):
    bake.audits = {PY312.name: GOOD}
    bake.fail = {PY311.name}
    bake.errors = {PY311.name: "pip could not resolve setuptools>=80"}
    said: list[str] = []
    failed, ok = buildx_audit.audit(Plan(cells=[PY311, PY312]), work=tmp_path / "work", say=said.append)
    assert [c["targets"] for c in bake.calls] == [[PY311.name + AUDIT_SUFFIX, PY312.name + AUDIT_SUFFIX],
                                                  [PY312.name + AUDIT_SUFFIX]]
    assert failed.verdict is None and failed.error == "pip could not resolve setuptools>=80"
    assert any("setuptools" in line for line in failed.log_tail)
    assert ok.verdict is not None and ok.verdict.ok
    assert f"[{PY312.name}] audit cancelled by a failing neighbour; queued again on its own" in said


@pytest.mark.parametrize("fake, says", [
    (dict(fail={PY311.name}), "its builder image or the audit step failed"),  # no first error to tell
    (dict(audits={}), "its builder image or the audit step failed"),  # the bake passed, but no report
    (dict(bake_error="ERROR: failed to find target x"), "bake failed before building: ERROR: failed to find target x"),
    (dict(audits={PY311.name: ["not", "an", "object"]}), "the audit report is not a JSON object"),
])
def test_an_audit_that_could_not_run_says_why(tmp_path, bake, fake, says):
    for key, value in fake.items():
        setattr(bake, key, value)
    (outcome,) = buildx_audit.audit(Plan(cells=[PY311]), work=tmp_path / "work", say=lambda m: None)
    assert outcome.verdict is None and outcome.error == says and outcome.log.name == f"{PY311.name}.log"


def test_audits_run_at_most_audit_batch_at_once(tmp_path, bake):
    recipe = tiny_recipe()
    cells = [make_cell(recipe, recipe.version(None), torch, cuda, py, parse_arch_list("8.0;9.0+PTX"), "pypi")
             for torch, cuda in (("2.9", "13.0"), ("2.10", "13.0"), ("2.11", "13.0"))
             for py in ("3.10", "3.11", "3.12")]
    assert all(c.buildable for c in cells) and len({c.name for c in cells}) == 9 > buildx_audit.AUDIT_BATCH
    bake.audits = {c.name: GOOD for c in cells}
    outcomes = buildx_audit.audit(Plan(cells=cells), work=tmp_path / "work", say=lambda m: None)
    assert [len(c["targets"]) for c in bake.calls] == [buildx_audit.AUDIT_BATCH, 1]
    assert [o.cell for o in outcomes] == cells and all(o.verdict.ok for o in outcomes)


def test_the_gate_lets_passed_cells_through_and_fails_the_others_with_the_reason(tmp_path, bake):
    third = tiny_cell(python="3.13")
    bake.audits = {PY311.name: GOOD, PY312.name: IGNORES_ARCH}  # none for the third: its audit did not run
    run = prepare_run([PY311, PY312, third], tmp_path / "work")
    logs = TargetLogs(tmp_path / "logs", [PY311.name, PY312.name, third.name])
    results, verdicts = {}, {}
    passed = buildx_audit.audit_gate([PY311, PY312, third], run, logs, None, results, verdicts, lambda m: None)
    logs.close()
    assert passed == [PY311] and set(verdicts) == {PY311.name} and verdicts[PY311.name]["verdict"] == "ok"
    assert set(results) == {PY312.name, third.name}
    refused = results[PY312.name]
    assert refused.status == "failed" and refused.audit["verdict"] == "refused"
    assert refused.error.startswith(f"cannot build {PY312.describe()}: the gencode audit refuses it: ")
    assert results[third.name].error == ("the gencode audit could not run: its builder image or the audit step failed"
                                         " (--no-audit skips it)")
    assert results[third.name].audit is None and results[third.name].log == tmp_path / "logs" / f"{third.name}.log"


# BuildKit's own lines (docker buildx bake, docker driver) when FROM's image cannot be pulled.
_BAKE_LAST = ("ERROR: failed to solve: {ref}: failed to resolve source metadata for docker.io/{ref}: failed to do request:"
              " Head \"https://registry-1.docker.io/v2/{ref}\": dial tcp: lookup registry-1.docker.io on 10.0.0.53:53:"
              " no such host")
_VERTEX = ["#3 [{name} internal] load metadata for docker.io/{ref}",
           "#3 ERROR: failed to do request: Head \"https://registry-1.docker.io/v2/x\": dial tcp: lookup"
           " registry-1.docker.io: no such host"]


def test_a_base_image_that_cannot_be_pulled_is_named_with_the_fixes_that_apply():
    from imagegen.executors.bases import not_pulled
    ref = PY311.base.ref
    for lines in ([_BAKE_LAST.format(ref=ref)], [line.format(name=PY311.name, ref=ref) for line in _VERTEX]):
        said = not_pulled(PY311, lines)
        assert said is not None and said.startswith(f"the base image {ref.removeprefix('docker.io/')} cannot be pulled (")
        assert "no such host" in said and "--flavor" in said and "--base-image" in said and "imagegen lock" in said
        assert "--no-audit" not in said
    # Another image (the Dockerfile frontend's), or another failure: not the base image's.
    assert not_pulled(PY311, [_BAKE_LAST.format(ref="docker/dockerfile:1.7")]) is None
    assert not_pulled(PY311, ["ERROR: failed to solve: process did not complete successfully"]) is None


def test_the_gate_says_a_base_image_cannot_be_pulled_without_suggesting_no_audit(tmp_path, bake):
    bake.bake_error = _BAKE_LAST.format(ref=PY311.base.ref)
    run = prepare_run([PY311], tmp_path / "work")
    logs = TargetLogs(tmp_path / "logs", [PY311.name])
    results: dict = {}
    assert buildx_audit.audit_gate([PY311], run, logs, None, results, {}, lambda m: None) == []
    logs.close()
    error = results[PY311.name].error
    assert "cannot be pulled" in error and "--no-audit" not in error and "--base-image" in error
