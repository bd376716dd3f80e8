"""imagegen.wheelhouse.records on its own: which files a walk takes for build records and bare wheels (symlinks
and folders named like wheels are not), and the record read back within bounds. The command around it
(verification, the manifest, the exit codes) is tested in test_collecting.py."""

from __future__ import annotations

import json
import shutil

import pytest

from imagegen.wheelhouse import records
from imagegen.errors import BuildRecordError
from tests.unit.executor_fixtures import WHEEL


def test_find_takes_records_and_bare_wheels_but_no_symlink_or_folder(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    shutil.copyfile(WHEEL, tmp_path / "a" / WHEEL.name)
    (tmp_path / "a" / (WHEEL.name + records.RECORD_SUFFIX)).write_text("{}")
    shutil.copyfile(WHEEL, tmp_path / "a" / "b" / "bare-1.0-py3-none-any.whl")
    (tmp_path / "a" / "b" / "link.whl.imagegen.json").symlink_to(tmp_path / "a" / (WHEEL.name + records.RECORD_SUFFIX))
    (tmp_path / "a" / "b" / "dir.whl").mkdir()
    found, bare = records.find(tmp_path)
    assert found == [tmp_path / "a" / (WHEEL.name + records.RECORD_SUFFIX)]
    assert bare == [tmp_path / "a" / "b" / "bare-1.0-py3-none-any.whl"]


def test_a_record_is_read_only_up_to_its_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(records, "MAX_RECORD_BYTES", 64)
    shutil.copyfile(WHEEL, tmp_path / WHEEL.name)
    path = tmp_path / (WHEEL.name + records.RECORD_SUFFIX)
    path.write_text(json.dumps({"kind": "imagegen-build-record", "padding": "x" * 100}))
    with pytest.raises(BuildRecordError, match="148 bytes; at most 64 are read"):
        records.read(path)


def test_a_record_missing_a_field_names_it(tmp_path):
    shutil.copyfile(WHEEL, tmp_path / WHEEL.name)
    path = tmp_path / (WHEEL.name + records.RECORD_SUFFIX)
    path.write_text(json.dumps({"kind": "imagegen-build-record", "recipe": "x", "version": "1"}))
    with pytest.raises(BuildRecordError, match="no valid 'torch'"):
        records.read(path)
