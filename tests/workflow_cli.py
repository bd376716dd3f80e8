"""Shared by the `imagegen ci github` tests (tests/unit/test_workflow.py, pure; tests/integration/
test_ci_workflow.py, against buildx): the command run as the shell runs it, and the workflow it writes."""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

import yaml

from imagegen import cli
from imagegen.commands import ci

ROOT = Path(__file__).resolve().parents[1]


def parser():
    p = cli._Parser(prog="imagegen")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=cli._Parser)
    sub.required = True
    ci.add_parser(sub)
    return p


def imagegen(*argv: str) -> tuple[int, str, str]:
    """`imagegen ...` as the command line runs it: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(argv))
    return code, out.getvalue(), err.getvalue()


def generate(tmp_path: Path, *extra: str, name: str = "imagegen.yml") -> tuple[str, dict]:
    """Run `imagegen ci github` in the repository's top folder through ci.run; return text and YAML."""
    out = tmp_path / name
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        assert ci.run(parser().parse_args(["ci", "github", "--output", str(out), *extra])) == 0
    finally:
        os.chdir(cwd)
    text = out.read_text(encoding="utf-8")
    return text, yaml.safe_load(text)


def steps_by_name(doc: dict) -> dict[str, dict]:
    return {s["name"]: s for s in doc["jobs"]["build"]["steps"]}
