"""Tests for imagegen.wheelhouse.collect: built wheels copied into the output folder atomically (cell folders with a
manifest.json, or --flat), build logs kept, and what the manifest records of each cell."""

from __future__ import annotations

import json
import re
import stat
from pathlib import Path

import pytest

from imagegen.wheelhouse import manifest as wheelhouse
from imagegen.wheelhouse import collect
from imagegen.errors import PublishError, RecipeError
from imagegen.model.arch_parse import parse_arch_list
from imagegen.model.catalogue import load_catalogue
from imagegen.model.recipes import fetched_from
from imagegen.outputs import new_file_mode
from imagegen.plan.matrix import make_cell

WHEEL = next((Path(__file__).parent.parent / "fixtures" / "wheels").glob("tiny_kernel-*.whl"))


def _cell():
    r = load_catalogue().get("sage")
    return make_cell(r, r.version(None), "2.8", "12.8", "3.12", parse_arch_list("9.0"), "cuda")


def _file(folder: Path, name: str, body: bytes = b"wheel bytes") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(body)
    return path


def _partials(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.endswith(".partial")]


def test_publish_is_atomic_and_up_to_date_checks_hash(tmp_path):
    cell = _cell()
    out = tmp_path / "out"
    dest = collect.place(out, cell, WHEEL, inputs="abc", record={"duration_s": 1.0})
    assert dest.parent == out / "sageattention-2.2.0" / "torch2.8" / "cu128"
    assert not list(out.rglob("*.partial"))
    manifest = json.loads((dest.parent / "manifest.json").read_text())
    assert manifest["cells"][cell.name]["sha256"] == wheelhouse.sha256(WHEEL)
    assert wheelhouse.up_to_date(out, cell, "abc") == dest
    assert wheelhouse.up_to_date(out, cell, "other-inputs") is None
    dest.write_bytes(b"tampered")
    assert wheelhouse.up_to_date(out, cell, "abc") is None


def test_a_wheel_asked_to_pass_the_gpu_check_in_the_build_is_up_to_date_only_once_it_has(tmp_path):
    from dataclasses import replace
    plain, checked = _cell(), replace(_cell(), gpu_check_device="nvidia.com/gpu=all",
                                      dockerfile_frontend="docker/dockerfile:1.19-labs")
    out = tmp_path / "out"
    dest = collect.place(out, plain, WHEEL, inputs="abc", record={"duration_s": 1.0})
    assert wheelhouse.up_to_date(out, plain, "abc") == dest
    assert wheelhouse.up_to_date(out, checked, "abc") is None  # built without the check: build again, with it
    collect.place(out, checked, WHEEL, inputs="abc", record={"gpu_check": {"ok": False}})
    assert wheelhouse.up_to_date(out, checked, "abc") is None
    dest = collect.place(out, checked, WHEEL, inputs="abc", record={"gpu_check": {"ok": True, "device": "H100 (9.0)"}})
    assert wheelhouse.up_to_date(out, checked, "abc") == dest
    assert wheelhouse.up_to_date(out, plain, "abc") == dest


def test_the_manifest_says_what_was_asked_what_was_compiled_and_from_where(tmp_path):
    recipe = load_catalogue().get("flash-attn")
    cell = make_cell(recipe, recipe.version("2.8.3"), "2.8", "12.8", "3.12", parse_arch_list("8.6;9.0"), "cuda")
    dest = collect.place(tmp_path, cell, WHEEL, inputs="h1", record={"duration_s": 12.5, "verify": {"ok": True}})
    entry = json.loads((dest.parent / "manifest.json").read_text())["cells"][cell.name]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", entry.pop("built_at"))  # UTC
    assert entry == {
        "inputs": "h1", "wheel": WHEEL.name, "sha256": wheelhouse.sha256(WHEEL),
        "recipe": "flash-attn", "version": "2.8.3",
        "source": {"kind": "git", "url": recipe.source_url, "ref": cell.version.ref, "commit": cell.version.commit,
                   "path": None},
        "patches": [],
        "torch": "2.8.0", "cuda": "cu128", "python": "3.12",
        # 8.6 is served by the sm_80 cubin: the request, what was compiled and why all travel with the wheel.
        "archs": "8.0;9.0", "requested_archs": "8.6;9.0", "expected_archs": "8.0;9.0",
        "notes": ["8.6 runs the sm_80 cubin"],
        "flavor": "cuda", "base_image": cell.base.ref,
        "duration_s": 12.5, "verify": {"ok": True},
    }


def test_an_sdist_build_records_the_pinned_hash(tmp_path):
    recipe = load_catalogue().get("causal-conv1d")
    r, v = fetched_from(recipe, recipe.version("1.6.1"), "sdist")
    cell = make_cell(r, v, "2.8", "12.8", "3.12", parse_arch_list("9.0"), "cuda")
    dest = collect.place(tmp_path, cell, WHEEL, inputs="h", record={})
    entry = json.loads((dest.parent / "manifest.json").read_text())["cells"][cell.name]
    assert entry["source"] == {"kind": "sdist", "url": v.sdist.url, "ref": "causal_conv1d-1.6.1.tar.gz", "commit": None,
                               "path": None, "sha256": v.sdist.sha256}
    assert entry["patches"] == ["causal-conv1d-arch-list.patch"]  # what the build applied to that source


def test_a_version_pinned_by_its_sdist_alone_is_fetched_from_there(tmp_path):
    recipe = load_catalogue().get("causal-conv1d")
    v = recipe.version("1.7.0")
    assert v.ref == "" and v.commit is None and v.sdist is not None and v.rules_from.startswith("by_version[0]")
    r, fetched = fetched_from(recipe, v, None)  # no --fetch: the sdist, since there is no git ref
    assert (r.source_kind, r.source_url, fetched.ref) == ("sdist", v.sdist.url, "causal_conv1d-1.7.0.tar.gz")
    with pytest.raises(RecipeError, match="pinned by its sdist only"):
        fetched_from(recipe, v, "git")


def test_cells_that_differ_only_by_python_share_a_folder_and_its_manifest(tmp_path):
    recipe = load_catalogue().get("sageattention")
    cells = [make_cell(recipe, recipe.version(None), "2.8", "12.8", py, parse_arch_list("9.0"), "cuda")
             for py in ("3.11", "3.12")]
    wheels = [_file(tmp_path / "stage", f"sageattention-2.2.0+cu128torch2.8-cp{py}-cp{py}-linux_x86_64.whl",
                     py.encode()) for py in ("311", "312")]
    out = tmp_path / "out"
    first = collect.place(out, cells[0], wheels[0], inputs="a", record={})
    second = collect.place(out, cells[1], wheels[1], inputs="b", record={})
    assert first.parent == second.parent and first.read_bytes() == b"311" and second.read_bytes() == b"312"
    manifest = wheelhouse.read_manifest(first.parent)
    assert manifest["schema"] == 1 and set(manifest["cells"]) == {c.name for c in cells}
    # Building one again rewrites its own entry only.
    collect.place(out, cells[0], wheels[0], inputs="a2", record={})
    again = wheelhouse.read_manifest(first.parent)["cells"]
    assert again[cells[0].name]["inputs"] == "a2" and again[cells[1].name]["inputs"] == "b"
    assert _partials(out) == []


def test_a_broken_manifest_is_started_afresh(tmp_path):
    cell = _cell()
    folder = wheelhouse.cell_dir(tmp_path, cell)
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text("{ not json")
    collect.place(tmp_path, cell, WHEEL, inputs="x", record={})
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["schema"] == 1 and list(manifest["cells"]) == [cell.name]


def test_published_files_get_the_umasks_mode_not_a_temp_files(tmp_path):
    # The wheelhouse is served (a web server, a team's share): not mkstemp's 0600.
    dest = collect.place(tmp_path, _cell(), WHEEL, inputs="x", record={})
    for path in (dest, dest.parent / "manifest.json"):
        assert stat.S_IMODE(path.stat().st_mode) == new_file_mode()


def test_keep_log_copies_the_log_out_of_the_work_folder(tmp_path):
    cell = _cell()
    log = _file(tmp_path / "work", "build.log", b"line 1\nline 2\n")
    kept = collect.keep_log(tmp_path / "out", cell, log)
    assert kept == tmp_path / "out" / "logs" / f"{cell.name}.log"
    assert kept.read_bytes() == log.read_bytes()
    log.write_text("a later build\n")
    assert collect.keep_log(tmp_path / "out", cell, log).read_text() == "a later build\n"  # replaced, not appended
    assert sorted(p.name for p in (tmp_path / "out" / "logs").iterdir()) == [f"{cell.name}.log"]


def test_place_flat_puts_the_wheel_alone_in_out(tmp_path):
    out = tmp_path / "a" / "b"
    dest = collect.place_flat(out, WHEEL)
    assert dest == out / WHEEL.name and dest.read_bytes() == WHEEL.read_bytes()
    assert [p.name for p in out.iterdir()] == [WHEEL.name]  # no cell folders, no manifest
    assert collect.place_flat(out, WHEEL) == dest  # again: replaced in place


def test_a_copy_that_cannot_land_leaves_nothing_behind(tmp_path):
    out = tmp_path / "out"
    (out / WHEEL.name).mkdir(parents=True)
    (out / WHEEL.name / "keep").write_text("not ours")  # a folder where the wheel would go
    with pytest.raises(OSError):
        collect.place_flat(out, WHEEL)
    assert (out / WHEEL.name / "keep").read_text() == "not ours" and _partials(out) == []
    with pytest.raises(FileNotFoundError):  # no wheel to copy: no half-written folder content
        collect.place(out, _cell(), tmp_path / "missing.whl", inputs="x", record={})
    assert not (wheelhouse.cell_dir(out, _cell()) / "manifest.json").exists() and _partials(out) == []


# --------------------------------------------------------------------------------------------
# replace_wheel: a repaired wheel takes the place of the built one, in its folder and manifest


def _shared_folder(tmp_path: Path) -> tuple[Path, list]:
    """A cell folder whose two cells (Python 3.11 and 3.12) list one wheel, as an abi3 build does."""
    recipe = load_catalogue().get("sageattention")
    cells = [make_cell(recipe, recipe.version(None), "2.8", "12.8", py, parse_arch_list("9.0"), "cuda")
             for py in ("3.11", "3.12")]
    for cell in cells:
        built = collect.place(tmp_path / "out", cell, WHEEL, inputs=cell.python, record={"verify": {"ok": True}})
    return built.parent, cells


def test_replace_wheel_swaps_the_file_and_every_entry_that_lists_it(tmp_path):
    folder, cells = _shared_folder(tmp_path)
    repaired_name = WHEEL.name.replace("linux_x86_64", "manylinux_2_34_x86_64")
    new = _file(folder / ".staging", repaired_name, b"repaired bytes")
    new.chmod(0o600)
    dest = collect.replace_wheel(folder, WHEEL.name, wheelhouse.sha256(WHEEL), new,
                                 record={"repaired": {"tag": "manylinux_2_34_x86_64"}})
    assert dest == folder / repaired_name and dest.read_bytes() == b"repaired bytes" and not new.exists()
    assert sorted(p.name for p in folder.iterdir() if p.is_file()) == ["manifest.json", repaired_name]
    assert stat.S_IMODE(dest.stat().st_mode) == new_file_mode()  # served, whatever mode the repair left
    entries = wheelhouse.read_manifest(folder)["cells"]
    for cell in cells:
        entry = entries[cell.name]
        assert entry["wheel"] == repaired_name and entry["sha256"] == wheelhouse.sha256(dest)
        assert entry["repaired"] == {"tag": "manylinux_2_34_x86_64"}
        assert entry["inputs"] == cell.python and entry["verify"] == {"ok": True}  # the rest of the entry stays
    assert [v.path for v in wheelhouse.verified_wheels(tmp_path / "out")] == [dest]
    assert _partials(folder) == []


def test_replace_wheel_under_the_same_name_replaces_it_in_place(tmp_path):
    folder, cells = _shared_folder(tmp_path)
    new = _file(folder / ".staging", WHEEL.name, b"again")
    dest = collect.replace_wheel(folder, WHEEL.name, wheelhouse.sha256(WHEEL), new, record={})
    assert dest == folder / WHEEL.name and dest.read_bytes() == b"again"
    assert wheelhouse.read_manifest(folder)["cells"][cells[0].name]["sha256"] == wheelhouse.sha256(dest)


def test_replace_wheel_changes_nothing_when_the_manifest_no_longer_lists_that_wheel(tmp_path):
    folder, _ = _shared_folder(tmp_path)
    manifest = (folder / "manifest.json").read_text()
    new = _file(folder / ".staging", "other.whl", b"repaired")
    with pytest.raises(PublishError, match=r"manifest\.json no longer lists .* as it was \(rebuilt meanwhile\?\):"
                                           r" nothing replaced$") as info:
        collect.replace_wheel(folder, WHEEL.name, "0" * 64, new, record={})  # rebuilt: another sha256
    assert info.value.exit_code == 9
    assert (folder / "manifest.json").read_text() == manifest and (folder / WHEEL.name).is_file() and new.is_file()
    assert not (folder / "other.whl").exists()
