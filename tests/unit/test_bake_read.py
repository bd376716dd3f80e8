"""imagegen's own reading of a bake file (imagegen.render.bake_read), which lets `ci github` write a workflow
with no docker: the files imagegen writes read back (HCL and JSON, template escapes, groups of groups), what
it does not write refused with the line it stopped at. That buildx reads the same is proved against buildx
in tests/integration/test_ci_workflow.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from imagegen.errors import EngineError, UsageError
from imagegen.render import bake_read, bakefiles
from imagegen.render.bake import to_hcl, to_json

ROOT = Path(__file__).resolve().parents[2]

DEFINITION = {
    "variable": {"IMAGEGEN_PIP_CERT": {"default": "/etc/ssl/certs/ca-certificates.crt"}},
    "group": {"default": {"targets": ["fa"]}, "all": {"targets": ["default", "arm"]}},
    "target": {
        "fa": {"context": "dockerfiles", "output": ["type=local,dest=wheelhouse/fa-2.8.3/torch2.8/cu128"],
               "labels": {"io.imagegen.cell": "fa", "odd": 'a "quoted" ${not} %{this} \\ back\tslash ü'}},
        "arm": {"output": ["type=local,dest=wheelhouse/x"], "platforms": ["linux/arm64"], "labels": {}},
    },
}


def _read(tmp_path: Path, name: str, text: str, targets=None) -> dict:
    (tmp_path / name).write_text(text, encoding="utf-8")
    return bake_read.select(bake_read.load_definition(tmp_path / name), Path(name), targets)


@pytest.mark.parametrize("name", ["b.hcl", "b.json"])
def test_what_imagegen_writes_reads_back(tmp_path, name):
    text = to_json(DEFINITION) if name.endswith(".json") else to_hcl(DEFINITION, "a header\n\nof two lines")
    got = _read(tmp_path, name, text, ["all"])
    assert list(got["target"]) == ["arm", "fa"]  # sorted, as buildx prints its map
    assert got["group"] == {"default": {"targets": ["fa", "arm"]}}
    assert got["target"]["fa"]["labels"]["odd"] == DEFINITION["target"]["fa"]["labels"]["odd"]
    assert got["target"]["arm"]["platforms"] == ["linux/arm64"]
    assert _read(tmp_path, name, text)["group"]["default"]["targets"] == ["fa"]  # no name: `default`


def test_the_repository_bake_file_reads_back_with_its_args_left_out():
    got = bake_read.select(bake_read.load_definition(ROOT / "docker-bake.hcl"), Path("docker-bake.hcl"), None)
    assert got["target"] and all("args" not in body or not body["args"] for body in got["target"].values())
    assert all(body["output"][0].startswith("type=local,dest=wheelhouse/") for body in got["target"].values())


@pytest.mark.parametrize("text, says", [
    ('target "a" {\n  output = ["type=local,dest=${OUT}"]\n}\n', "expression in 'output'"),
    ('target "a" {\n  inherits = ["b"]\n}\n', "uses 'inherits'"),
    ('function "f" {\n  params = []\n}\n', "a function block"),
    ('target "a" {\n  labels = <<EOT\nx\nEOT\n}\n', "line 2: a heredoc"),
    ('target "a" {\n  output = ["x"\n', "line 3"),
    ('target "a" {\n  labels = { x = "unterminated }\n}\n', "line 2: a string that does not end"),
    ('target "a" "b" {\n}\n', "2 labels"),
    ('OUT = "x"\n', "top-level attribute"),
    ('target "a" {\n  output = [upper("x")]\n}\n', "expression in 'output'"),
])
def test_what_imagegen_does_not_write_is_refused(tmp_path, text, says):
    with pytest.raises(bake_read.BakeReadError, match=says):
        _read(tmp_path, "b.hcl", text)


def test_a_json_interpolation_is_an_expression(tmp_path):
    text = json.dumps({"target": {"a": {"output": ["type=local,dest=${OUT}"]}}})
    with pytest.raises(bake_read.BakeReadError, match="expression in 'output'"):
        _read(tmp_path, "b.json", text, ["a"])
    assert _read(tmp_path, "b.json", text.replace("${", "$${"), ["a"])["target"]["a"]["output"] == ["type=local,dest=${OUT}"]


def test_an_unknown_name_is_one_line(tmp_path):
    with pytest.raises(UsageError, match="no bake target or group named nope"):
        _read(tmp_path, "b.hcl", to_hcl(DEFINITION, "h"), ["nope"])


def test_a_group_naming_itself_ends(tmp_path):
    definition = {**DEFINITION, "group": {"default": {"targets": ["default", "fa"]}}}
    assert list(_read(tmp_path, "b.hcl", to_hcl(definition, "h"))["target"]) == ["fa"]


def _no_buildx(*args, **kwargs):
    raise EngineError("the docker CLI is not installed: ...")


def test_read_bake_without_buildx_is_imagegen_s_reading(tmp_path, monkeypatch):
    monkeypatch.setattr(bakefiles, "print_bake", _no_buildx)
    (tmp_path / "b.hcl").write_text(to_hcl(DEFINITION, "h"))
    assert bake_read.read_bake(Path("b.hcl"), tmp_path, ["fa"]) == _read(tmp_path, "b.hcl", to_hcl(DEFINITION, "h"),
                                                                        ["fa"])
    (tmp_path / "b.hcl").write_text('target "a" {\n  output = [OUT]\n}\n')
    with pytest.raises(UsageError) as exc:
        bake_read.read_bake(Path("b.hcl"), tmp_path, ["a"])
    assert "\n" not in str(exc.value) and "give its JSON form" in str(exc.value) and "buildx plugin" in str(exc.value)


def test_read_bake_takes_buildx_s_reading_of_a_file_only_buildx_reads(tmp_path, monkeypatch):
    printed = {"target": {"a": {"output": ["type=local,dest=o"]}}}
    monkeypatch.setattr(bakefiles, "print_bake", lambda *a, **k: printed)
    (tmp_path / "b.hcl").write_text('target "a" {\n  output = ["type=local,dest=${X}"]\n}\n')
    assert bake_read.read_bake(Path("b.hcl"), tmp_path, ["a"]) is printed


def test_read_bake_refuses_where_buildx_reads_otherwise(tmp_path, monkeypatch):
    (tmp_path / "b.hcl").write_text(to_hcl(DEFINITION, "h"))
    monkeypatch.setattr(bakefiles, "print_bake", lambda *a, **k: {"target": {"other": {}}})
    with pytest.raises(EngineError, match="imagegen reads targets fa but docker buildx bake --print other"):
        bake_read.read_bake(Path("b.hcl"), tmp_path, ["fa"])


def test_read_bake_passes_on_buildx_refusing_the_file(tmp_path, monkeypatch):
    def refuses(*a, **k):
        raise EngineError("docker buildx bake --print rejected b.hcl: failed to find target fa")
    monkeypatch.setattr(bakefiles, "print_bake", refuses)
    (tmp_path / "b.hcl").write_text(to_hcl(DEFINITION, "h"))
    with pytest.raises(EngineError, match="rejected"):
        bake_read.read_bake(Path("b.hcl"), tmp_path, ["fa"])
