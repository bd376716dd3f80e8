"""`imagegen collect` (imagegen.commands.collecting) over build records: a wheel a builder image exported (bake, `docker run -v OUT:/out`)
enters the wheelhouse's manifest, and so the index and publish, only once it is verified.

The record is written by the in-build script's own functions (imagegen_build.write_build_record and
add_report_to_records, fed the real cell document of the fixture cell), beside the fixture's real wheel
(sm_80, sm_90, compute_90). Then the command runs as imagegen.cli.main runs it: what it records, what it
refuses (a wheel that lacks a requested arch, changed bytes, no smoke test, hostile records) and that
a refusal is one line with exit 6 or 2, never a traceback; the engine round trip is in
tests/integration/test_engine_build.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from imagegen.wheelhouse import manifest as wheelhouse
from imagegen.commands import collecting
from imagegen.errors import UsageError, VerifyError
from imagegen.publish.index import write_index
from imagegen.render.dockerfile import cell_document, inputs_hash
from tests.unit.builder_script import RECORDS, builder_module
from tests.unit.command_helpers import ROOT, call
from tests.unit.executor_fixtures import WHEEL, tiny_cell

ib = builder_module("imagegen_records_collecting", RECORDS)
PLANNED = "8.0;9.0+PTX"


def exported(tmp_path: Path, *, requested: str = PLANNED, smoke: bool = True, monkeypatch=None) -> Path:
    """A bake export of the fixture cell: its wheel in the cell folder with the record the builder writes."""
    cell = tiny_cell()
    doc = cell_document(cell)
    folder = tmp_path / "export" / cell.wheel_dir
    folder.mkdir(parents=True)
    wheel = folder / WHEEL.name
    shutil.copyfile(WHEEL, wheel)
    env = {"IMAGEGEN_PLANNED_ARCHS": PLANNED, "IMAGEGEN_INPUTS": inputs_hash(cell, doc),
           "IMAGEGEN_BASE_IMAGE": "example.org/base:1"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        ib.write_build_record(doc, {"TORCH_CUDA_ARCH_LIST": requested}, str(wheel), 0.0)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    if smoke:
        ib.add_report_to_records([str(wheel)], "smoke", {"imports": {"tiny_kernel": "ok"}, "ok": True})
    return tmp_path / "export"


def record_of(out: Path) -> Path:
    return next(out.rglob("*.whl.imagegen.json"))


def collect(*argv) -> int:
    return call(collecting.cmd_collect, "collect", *argv)


def test_the_builder_record_names_the_cell_its_inputs_and_what_was_asked(tmp_path):
    cell = tiny_cell()
    doc = json.loads(record_of(exported(tmp_path)).read_text())
    assert doc["kind"] == "imagegen-build-record" and doc["cell"] == cell.name
    assert (doc["recipe"], doc["torch"], doc["cuda"], doc["python"]) == ("tiny-kernel", cell.torch_version, "cu130", "3.11")
    assert doc["requested_archs"] == PLANNED and doc["planned_archs"] == PLANNED
    assert doc["inputs"] == inputs_hash(cell, cell_document(cell))
    assert doc["base_image"] == "example.org/base:1"
    assert doc["sha256"] == wheelhouse.sha256(WHEEL) and doc["smoke"]["ok"] is True


def test_a_verified_export_enters_the_manifest_the_index_and_a_later_build_sees_it_up_to_date(tmp_path, capsys):
    out = exported(tmp_path)
    assert wheelhouse.verified_wheels(out) == []  # not before collect
    assert collect(out) == 0
    line = capsys.readouterr().out.splitlines()[0]
    assert line.startswith("ok   ") and "recorded" in line and "sm_80" not in line and PLANNED in line
    cell = tiny_cell()
    [verified] = wheelhouse.verified_wheels(out)
    assert verified.path.name == WHEEL.name and verified.entry["verify"]["ok"] is True
    assert verified.entry["expected_archs"] == PLANNED and verified.entry["base_image"] == "example.org/base:1"
    # The manifest key and inputs are the ones imagegen build would write: it would skip this cell.
    assert wheelhouse.up_to_date(out, cell, inputs_hash(cell, cell_document(cell))) == verified.path
    assert write_index(out, say=lambda m: None).wheels == 1
    # Again: nothing to do, and the manifest is untouched.
    manifest = (verified.path.parent / "manifest.json").read_bytes()
    assert collect(out) == 0
    assert "recorded before" in capsys.readouterr().out
    assert (verified.path.parent / "manifest.json").read_bytes() == manifest


def test_a_wheel_missing_a_requested_arch_is_refused_and_stays_out(tmp_path, capsys):
    out = exported(tmp_path, requested="8.0;9.0;12.0+PTX")
    with pytest.raises(VerifyError, match=r"1 of 1 wheels were not recorded: tiny_kernel-.*sm_120"):
        collect(out)
    assert "FAIL" in capsys.readouterr().out
    assert wheelhouse.verified_wheels(out) == [] and not list(out.rglob("manifest.json"))


def test_an_overridden_arch_list_keeps_no_plan_inputs(tmp_path):
    out = exported(tmp_path, requested="9.0")
    assert collect(out) == 0
    [verified] = wheelhouse.verified_wheels(out)
    assert verified.entry["inputs"] == "" and verified.entry["requested_archs"] == "9.0"


def test_changed_bytes_and_a_missing_smoke_test_are_refused(tmp_path, capsys):
    out = exported(tmp_path / "a")
    wheel = next(out.rglob("*.whl"))
    with wheel.open("ab") as fh:
        fh.write(b"\0")
    with pytest.raises(VerifyError, match="sha256 differs"):
        collect(out)
    out = exported(tmp_path / "b", smoke=False)
    with pytest.raises(VerifyError, match="no passed smoke test"):
        collect(out)
    assert wheelhouse.verified_wheels(out) == []


@pytest.mark.parametrize("hostile", [
    b"\xff\xfe not json",
    b"[]",
    json.dumps({"kind": "imagegen-build-record"}).encode(),
    b"{" + b" " * (2 << 20) + b"}",
])
def test_a_broken_or_hostile_record_is_a_problem_of_its_wheel(tmp_path, hostile, capsys):
    out = exported(tmp_path)
    record_of(out).write_bytes(hostile)
    with pytest.raises(VerifyError, match="build record: "):
        collect(out)
    assert wheelhouse.verified_wheels(out) == []


def test_a_record_that_names_another_file_or_a_symlinked_wheel_is_refused(tmp_path):
    out = exported(tmp_path)
    path = record_of(out)
    doc = json.loads(path.read_text())
    path.write_text(json.dumps(dict(doc, wheel="../../../etc/passwd.whl")))
    with pytest.raises(VerifyError, match="not the wheel beside it"):
        collect(out)
    path.write_text(json.dumps(doc))
    wheel = path.with_name(doc["wheel"])
    real = tmp_path / "elsewhere.whl"
    wheel.rename(real)
    wheel.symlink_to(real)
    with pytest.raises(VerifyError, match="its wheel is missing"):
        collect(out)


def test_a_hostile_cell_name_does_not_become_the_manifest_key(tmp_path):
    out = exported(tmp_path)
    path = record_of(out)
    doc = json.loads(path.read_text())
    path.write_text(json.dumps(dict(doc, cell="../x y")))
    assert collect(out) == 0
    [verified] = wheelhouse.verified_wheels(out)
    manifest = json.loads((verified.path.parent / "manifest.json").read_text())
    assert list(manifest["cells"]) == ["tiny-kernel-0_1_0-2_11_0-cu130-3_11"]


def test_nothing_to_collect_is_a_usage_error_that_names_bare_wheels(tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copyfile(WHEEL, bare / WHEEL.name)
    with pytest.raises(UsageError, match=r"no build record .*\(1 wheel without one: check those with `imagegen verify"):
        collect(bare)
    with pytest.raises(UsageError, match="is not a folder"):
        collect(tmp_path / "nowhere")


def test_through_the_real_cli_a_refusal_is_one_line_and_exit_6(tmp_path):
    out = exported(tmp_path, requested="12.0")
    proc = subprocess.run([sys.executable, "-m", "imagegen", "collect", str(out), "--json"], capture_output=True,
                          text=True, cwd=ROOT)
    assert proc.returncode == 6, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    results = json.loads(proc.stdout)["results"]
    assert results[0]["status"] == "failed" and "sm_120" in results[0]["problems"][0]
