"""Tests for imagegen.finish.finisher: a staged wheel is verified (the requested SASS/PTX really in its .so)
before it enters the wheelhouse; a built cell's wheel, kept log and manifest entry (with the record's
fields, a record function called only once the wheel passed), --flat, and the failures that leave
the output folder untouched."""

from __future__ import annotations

import shutil

import pytest

from imagegen.wheelhouse import manifest as wheelhouse
from imagegen.errors import VerifyError
from imagegen.finish.finisher import finish
from tests.unit.executor_fixtures import WHEEL, pure_wheel, temp_files_under, tiny_cell


@pytest.fixture(autouse=True)
def _temp_files(tmp_path, monkeypatch):
    """Temporary files (the import test's folder, verify's extracted .so files) under tmp_path."""
    temp_files_under(tmp_path, monkeypatch)


def _staged(tmp_path, wheel=WHEEL):
    stage = tmp_path / "stage"
    stage.mkdir(exist_ok=True)
    staged = stage / wheel.name
    shutil.copy(wheel, staged)
    log = tmp_path / "work" / "build.log"
    log.parent.mkdir(exist_ok=True)
    log.write_text("nvcc -gencode arch=compute_80,code=sm_80 ...\n")
    return staged, log


def test_a_verified_wheel_is_collected_with_its_log_and_manifest_entry(tmp_path):
    cell = tiny_cell("8.0;9.0+PTX")
    staged, log = _staged(tmp_path)
    out = tmp_path / "out"
    ccache = {"hits": 1, "misses": 0, "hit_rate": 1.0}
    result = finish(cell, [staged], out=out, inputs="abc123", log=log, seconds=61.26, audit={"verdict": "ok"},
                    smoke={"tiny_kernel": "ok"}, ccache=ccache, record={"image": "reg/imagegen-tiny-kernel:x"})
    assert result.status == "built" and result.error == ""
    assert result.wheel == wheelhouse.cell_dir(out, cell) / WHEEL.name
    assert result.wheel.read_bytes() == WHEEL.read_bytes()
    # The log is kept in OUT (the work folder is temporary) and the result points at the copy.
    assert result.log == out / "logs" / f"{cell.name}.log" and result.log.read_text() == log.read_text()
    assert result.verify["ok"] and result.verify["extensions"][0]["archs"] == ["sm_80", "sm_90", "compute_90"]
    assert (result.smoke, result.ccache, result.audit) == ({"tiny_kernel": "ok"}, ccache, {"verdict": "ok"})
    entry = wheelhouse.read_manifest(wheelhouse.cell_dir(out, cell))["cells"][cell.name]
    assert entry["inputs"] == "abc123" and entry["wheel"] == WHEEL.name and entry["duration_s"] == 61.3
    assert entry["log"] == str(result.log) and entry["verify"] == result.verify
    assert entry["image"] == "reg/imagegen-tiny-kernel:x" and entry["audit"] == {"verdict": "ok"}
    # The manifest makes the next run skip this unchanged cell.
    assert wheelhouse.up_to_date(out, cell, "abc123") == result.wheel


def test_the_manifest_has_no_audit_field_when_the_audit_did_not_run(tmp_path):
    cell = tiny_cell()
    staged, log = _staged(tmp_path)
    result = finish(cell, [staged], out=tmp_path / "out", inputs="x", log=log, seconds=1.0)
    entry = wheelhouse.read_manifest(wheelhouse.cell_dir(tmp_path / "out", cell))["cells"][cell.name]
    assert result.status == "built" and result.audit is None and "audit" not in entry


def test_a_wheel_lacking_a_requested_arch_fails_and_nothing_enters_out(tmp_path):
    cell = tiny_cell("8.0;12.0")  # the fixture wheel carries sm_80, sm_90, compute_90: no sm_120
    staged, log = _staged(tmp_path)
    called = []
    result = finish(cell, [staged], out=tmp_path / "out", inputs="x", log=log, seconds=5.0, audit={"verdict": "ok"},
                    record=lambda: called.append(1) or {})
    assert result.status == "failed" and result.wheel is None
    assert result.error.startswith("verification failed: ") and "lacks sm_120" in result.error
    assert result.verify is not None and not result.verify["ok"] and result.audit == {"verdict": "ok"}
    assert result.log == log  # the work folder's log: nothing was kept in OUT
    assert not (tmp_path / "out").exists()
    assert called == []  # the record (a native build's import test) is not waited for


def test_anything_but_exactly_one_staged_wheel_fails(tmp_path):
    cell = tiny_cell()
    staged, log = _staged(tmp_path)
    other = pure_wheel(tmp_path / "stage" / "demo-1.0-py3-none-any.whl", {"demo/__init__.py": ""})
    none = finish(cell, [], out=tmp_path / "out", inputs="x", log=log, seconds=2.0)
    assert none.status == "failed" and none.error == "expected one wheel, got []" and none.log == log
    two = finish(cell, [staged, other], out=tmp_path / "out", inputs="x", log=log, seconds=2.0)
    assert two.status == "failed" and two.error == f"expected one wheel, got {[WHEEL.name, other.name]!r}"
    assert not (tmp_path / "out").exists()


def test_a_record_function_is_called_once_after_the_wheel_passed(tmp_path):
    cell = tiny_cell()
    staged, log = _staged(tmp_path)
    calls = []

    def record() -> dict:
        calls.append(1)
        return {"smoke": {"tiny_kernel": "ok"}, "native": True}

    result = finish(cell, [staged], out=tmp_path / "out", inputs="x", log=log, seconds=1.0, smoke={"stale": "x"},
                    record=record)
    assert calls == [1]
    assert result.smoke == {"tiny_kernel": "ok"}  # the record's smoke report wins over the one handed in
    entry = wheelhouse.read_manifest(wheelhouse.cell_dir(tmp_path / "out", cell))["cells"][cell.name]
    assert entry["native"] is True and entry["smoke"] == {"tiny_kernel": "ok"}


def test_flat_puts_the_wheel_alone_into_out(tmp_path):
    cell = tiny_cell()
    staged, log = _staged(tmp_path)
    out = tmp_path / "out"
    result = finish(cell, [staged], out=out, inputs="x", log=log, seconds=1.0, record=lambda: {"smoke": {"m": "ok"}},
                    flat=True)
    assert result.status == "built" and result.wheel == out / WHEEL.name and result.smoke == {"m": "ok"}
    assert sorted(p.name for p in out.iterdir()) == [WHEEL.name]  # no cell folders, no manifest, no log copy
    assert result.log == log


def test_a_file_that_is_no_wheel_is_a_one_line_verify_error(tmp_path):
    cell = tiny_cell()
    bad = tmp_path / "stage" / "tiny_kernel-0.1.0-cp311-cp311-linux_x86_64.whl"
    bad.parent.mkdir()
    bad.write_text("not a zip")
    _, log = _staged(tmp_path)
    with pytest.raises(VerifyError, match="not a readable wheel") as info:
        finish(cell, [bad], out=tmp_path / "out", inputs="x", log=log, seconds=1.0)
    assert info.value.exit_code == 6 and "\n" not in str(info.value)
    assert not (tmp_path / "out").exists()
