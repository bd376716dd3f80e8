"""Tests for imagegen.commands.indexing: `imagegen index OUT [--base-url URL] [--json]`.

The summary (what was indexed, how pip reads it), the JSON, warnings for wheels left out on stderr, and
errors as one line with their exit code through imagegen's own main (never a traceback)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from imagegen import cli
from imagegen.wheelhouse import collect
from imagegen.commands import indexing
from tests.unit.command_helpers import call
from tests.unit.executor_fixtures import WHEEL, pure_wheel, tiny_cell


def wheelhouse(tmp_path: Path) -> Path:
    """A wheelhouse as a build leaves it: the fixture's wheel in its cell folder, with its manifest."""
    out = tmp_path / "house"
    collect.place(out, tiny_cell(), WHEEL, inputs="inputs", record={})
    return out


def index(*argv) -> int:
    return call(indexing.cmd_index, "index", *argv)


def test_the_summary_says_what_was_indexed_and_how_pip_reads_it(tmp_path, capsys):
    out = wheelhouse(tmp_path)
    assert index(out) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert captured.out.splitlines() == [
        f"indexed 1 wheel of 1 project (tiny-kernel) in {out} (10 files written, 0 removed)",
        "  pip install --index-url <URL the folder is served at>/simple/ PROJECT",
        "  pip install --find-links <URL the folder is served at>/index.html PROJECT",
        "  pip install --index-url <URL the folder is served at>/cu130/simple/ PROJECT   (only the cu130 wheels)",
        f"  here: --index-url {out.resolve().as_uri()}/simple/ or --find-links {out.resolve().as_uri()}/index.html"]
    assert (out / "simple" / "tiny-kernel" / "index.html").is_file()
    assert index(out) == 0
    assert "(0 files written, 0 removed)" in capsys.readouterr().out


def test_a_base_url_is_where_pip_is_told_to_look(tmp_path, capsys):
    out = wheelhouse(tmp_path)
    assert index(out, "--base-url", "https://wheels.example.com/house/") == 0
    assert capsys.readouterr().out.splitlines()[1:] == [
        "  pip install --index-url https://wheels.example.com/house/simple/ PROJECT",
        "  pip install --find-links https://wheels.example.com/house/index.html PROJECT",
        "  pip install --index-url https://wheels.example.com/house/cu130/simple/ PROJECT   (only the cu130 wheels)"]


def test_json_says_it_all(tmp_path, capsys):
    out = wheelhouse(tmp_path)
    assert index(out, "--json") == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["projects"] == {"tiny-kernel": [WHEEL.name]} and report["wheels"] == 1
    assert report["simple"] == f"{out / 'simple'}/" and report["find_links"] == str(out / "index.html")
    assert report["base_url"] is None and report["problems"] == [] and len(report["written"]) == 10
    assert report["cuda"] == {"cu130": {"simple": f"{out / 'cu130' / 'simple'}/", "projects": ["tiny-kernel"]}}
    assert captured.err == ""


def test_wheels_left_out_are_warnings_and_the_others_are_indexed(tmp_path, capsys):
    out = wheelhouse(tmp_path)
    other = pure_wheel(tmp_path / "src" / "other-1.0-py3-none-any.whl", {"other/__init__.py": ""}, name="other")
    placed = collect.place(out, dataclasses.replace(tiny_cell(), layout="others/a"), other, inputs="i", record={})
    placed.write_bytes(b"changed")
    assert index(out, "--json") == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["projects"] == {"tiny-kernel": [WHEEL.name]}
    assert captured.err == (f"imagegen: warning: {placed}: changed since it was built and verified (sha256 differs"
                            f" from {placed.parent / 'manifest.json'})\n")


def test_errors_are_one_line_with_their_exit_code(tmp_path, capsys):
    assert cli.main(["index", str(tmp_path / "nowhere")]) == 9
    assert capsys.readouterr().err == (f"imagegen: error: {tmp_path / 'nowhere'}: no such directory: give the"
                                       " wheelhouse (imagegen build's --out)\n")
    assert cli.main(["index", str(tmp_path)]) == 9
    err = capsys.readouterr().err
    assert err.startswith("imagegen: error: ") and "no verified wheel to index" in err and err.count("\n") == 1
    out = wheelhouse(tmp_path)
    assert cli.main(["index", str(out), "--base-url", "https://x.example/a\nb"]) == 2
    assert capsys.readouterr().err == ("imagegen: error: --base-url 'https://x.example/a\\nb' is not allowed: use an"
                                       " http(s) URL without quotes, spaces or $\n")
    assert not (out / "simple").exists()
