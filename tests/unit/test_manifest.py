"""Tests for imagegen.wheelhouse.manifest: the output folder read-only: where a cell's wheel goes, its manifest read
defensively, whether an earlier build of the same inputs is still there intact, what a build would silently
replace (and --force), the wheel's hash and a cell's result record."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from imagegen.wheelhouse import manifest as wheelhouse
from imagegen.model.arch_parse import parse_arch_list
from imagegen.model.catalogue import load_catalogue
from imagegen.plan.matrix import make_cell

EMPTY = {"schema": 1, "cells": {}}


def _cell(archs="9.0", python="3.12"):
    r = load_catalogue().get("sage")
    return make_cell(r, r.version(None), "2.8", "12.8", python, parse_arch_list(archs), "cuda")


def _built(out: Path, cell, *, archs: str, inputs: str = "in", body: bytes = b"wheel") -> Path:
    """A wheelhouse as collect leaves it: the wheel and its manifest entry (written here by hand)."""
    folder = wheelhouse.cell_dir(out, cell)
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / "sageattention-2.2.0+cu128torch2.8-cp312-cp312-linux_x86_64.whl"
    wheel.write_bytes(body)
    entry = {"inputs": inputs, "wheel": wheel.name, "sha256": hashlib.sha256(body).hexdigest(), "archs": archs}
    (folder / wheelhouse.MANIFEST).write_text(json.dumps({"schema": 1, "cells": {cell.name: entry}}))
    return wheel


def test_sha256_reads_the_whole_file_in_chunks(tmp_path):
    data = os.urandom(3 << 20) + b"tail"  # more than one 1 MiB chunk, and a short last one
    (tmp_path / "big").write_bytes(data)
    (tmp_path / "empty").write_bytes(b"")
    assert wheelhouse.sha256(tmp_path / "big") == hashlib.sha256(data).hexdigest()
    assert wheelhouse.sha256(tmp_path / "empty") == hashlib.sha256(b"").hexdigest()


def test_cell_dir_is_package_version_torch_and_cuda(tmp_path):
    assert wheelhouse.cell_dir(tmp_path, _cell()) == tmp_path / "sageattention-2.2.0" / "torch2.8" / "cu128"
    # Python and archs are not part of it: a cell of another Python shares the folder.
    assert wheelhouse.cell_dir(tmp_path, _cell("8.0", "3.11")) == wheelhouse.cell_dir(tmp_path, _cell())


@pytest.mark.parametrize("content", [None, b"{ not json", b"[]", b'{"cells": []}', b'{"schema": 1}', b"\xff\xfe\x00"])
def test_a_missing_or_foreign_manifest_reads_as_empty(tmp_path, content):
    if content is not None:
        (tmp_path / wheelhouse.MANIFEST).write_bytes(content)
    assert wheelhouse.read_manifest(tmp_path) == EMPTY


def test_a_good_manifest_is_read_as_it_is(tmp_path):
    data = {"schema": 1, "cells": {"a": {"inputs": "x"}}, "extra": [1, 2]}
    (tmp_path / wheelhouse.MANIFEST).write_text(json.dumps(data))
    assert wheelhouse.read_manifest(tmp_path) == data


def test_up_to_date_needs_the_same_inputs_and_the_wheel_intact(tmp_path):
    cell = _cell()
    wheel = _built(tmp_path, cell, archs="9.0", inputs="h1")
    assert wheelhouse.up_to_date(tmp_path, cell, "h1") == wheel
    assert wheelhouse.up_to_date(tmp_path, cell, "h2") is None
    assert wheelhouse.up_to_date(tmp_path, _cell(python="3.11"), "h1") is None  # another cell's entry is not this one's
    wheel.unlink()
    assert wheelhouse.up_to_date(tmp_path, cell, "h1") is None
    manifest = wheelhouse.cell_dir(tmp_path, cell) / wheelhouse.MANIFEST
    manifest.write_text(json.dumps({"schema": 1, "cells": {cell.name: {"inputs": "h1"}}}))  # no wheel named
    assert wheelhouse.up_to_date(tmp_path, cell, "h1") is None


def test_replaced_names_a_wheel_of_the_same_cell_built_for_other_archs(tmp_path):
    wheel = _built(tmp_path, _cell(), archs="8.0")
    assert wheelhouse.replaced(tmp_path, _cell("9.0")) == f"{wheel} (built for archs 8.0)"
    assert wheelhouse.replaced(tmp_path, _cell("8.0")) is None  # the same archs: a rebuild, nothing lost
    assert wheelhouse.replaced(tmp_path / "elsewhere", _cell("9.0")) is None
    wheel.unlink()
    assert wheelhouse.replaced(tmp_path, _cell("9.0")) is None  # nothing there any more


def test_replaced_reads_only_the_file_name_a_manifest_gives(tmp_path):
    # The manifest is a file in the output folder: a path in it never points outside the cell folder.
    cell = _cell()
    folder = wheelhouse.cell_dir(tmp_path, cell)
    folder.mkdir(parents=True)
    (tmp_path / "outside.whl").write_bytes(b"x")
    entry = {"wheel": "../../../outside.whl", "archs": "8.0"}
    (folder / wheelhouse.MANIFEST).write_text(json.dumps({"cells": {cell.name: entry}}))
    assert wheelhouse.replaced(tmp_path, cell) is None
    (folder / "outside.whl").write_bytes(b"x")
    assert wheelhouse.replaced(tmp_path, cell) == f"{folder / 'outside.whl'} (built for archs 8.0)"
    (folder / wheelhouse.MANIFEST).write_text(json.dumps({"cells": {cell.name: {"wheel": 7, "archs": "8.0"}}}))
    assert wheelhouse.replaced(tmp_path, cell) is None


def test_replacement_is_refused_unless_forced_and_forcing_says_so(tmp_path):
    wheel = _built(tmp_path, _cell(), archs="8.0")
    said: list[str] = []
    why = wheelhouse.replacement_refused(tmp_path, _cell("9.0"), force=False, say=said.append)
    assert why == (f"{wheel} (built for archs 8.0) would be replaced by the wheel for archs 9.0 (same file name):"
                   " build into another --out to keep both, or --force to replace it")
    assert said == []
    assert wheelhouse.replacement_refused(tmp_path, _cell("9.0"), force=True, say=said.append) is None
    assert said == [f"--force: the new wheel replaces {wheel} (built for archs 8.0)"]
    assert wheelhouse.replacement_refused(tmp_path, _cell("8.0"), force=False, say=said.append) is None
    assert len(said) == 1


def test_verified_wheels_are_the_manifests_intact_wheels(tmp_path):
    good = tmp_path / "a-1.0" / "torch2.8" / "cu128"
    good.mkdir(parents=True)
    (good / "a-1.0+cu128torch2.8-cp312-cp312-linux_x86_64.whl").write_bytes(b"wheel a")
    (good / "changed-1.0-py3-none-any.whl").write_bytes(b"now different")
    (good / "stray-1.0-py3-none-any.whl").write_bytes(b"not in any manifest")
    _manifest(good, {
        "a-cell-py312": {"wheel": "a-1.0+cu128torch2.8-cp312-cp312-linux_x86_64.whl",
                         "sha256": wheelhouse.sha256(good / "a-1.0+cu128torch2.8-cp312-cp312-linux_x86_64.whl")},
        "a-cell-py311": {"wheel": "a-1.0+cu128torch2.8-cp312-cp312-linux_x86_64.whl",
                         "sha256": wheelhouse.sha256(good / "a-1.0+cu128torch2.8-cp312-cp312-linux_x86_64.whl")},
        "changed": {"wheel": "changed-1.0-py3-none-any.whl", "sha256": "0" * 64},
        "gone": {"wheel": "gone-1.0-py3-none-any.whl", "sha256": "0" * 64},
        "escape": {"wheel": "../../../../etc/passwd.whl", "sha256": "0" * 64},
        "junk": "not a table",
    })
    problems: list[str] = []
    (only,) = wheelhouse.verified_wheels(tmp_path, problems=problems)
    assert only.path.name == "a-1.0+cu128torch2.8-cp312-cp312-linux_x86_64.whl" and len(only.sha256) == 64
    assert only.entry["wheel"] == only.path.name
    assert sorted(p.split(": ", 1)[1] for p in problems) == [
        f"changed since it was built and verified (sha256 differs from {good / wheelhouse.MANIFEST})",
        f"listed in {good / wheelhouse.MANIFEST} but missing"]


def test_verified_wheels_follow_no_symlink_and_read_no_huge_manifest(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "x").mkdir(parents=True)
    (elsewhere / "x" / "x-1.0-py3-none-any.whl").write_bytes(b"x")
    _manifest(elsewhere / "x", {"x": {"wheel": "x-1.0-py3-none-any.whl", "sha256": wheelhouse.sha256(elsewhere / "x" / "x-1.0-py3-none-any.whl")}})
    out = tmp_path / "out"
    out.mkdir()
    (out / "link").symlink_to(elsewhere / "x")
    assert wheelhouse.verified_wheels(out) == []
    assert len(wheelhouse.verified_wheels(elsewhere)) == 1
    big = out / "big"
    big.mkdir()
    (big / wheelhouse.MANIFEST).write_bytes(b" " * (wheelhouse.MAX_MANIFEST_BYTES + 1))
    assert wheelhouse.verified_wheels(out) == []


def _manifest(folder, cells):
    import json as _json
    folder.mkdir(parents=True, exist_ok=True)
    (folder / wheelhouse.MANIFEST).write_text(_json.dumps({"schema": 1, "cells": cells}))
