"""docs/reference/cli.md is what imagegen.commands.cli_reference makes of the command table today: the
committed page is regenerated and compared (regenerate with
`python -m imagegen.commands.cli_reference > docs/reference/cli.md`), and the page says every command,
every flag and every exit code."""

from __future__ import annotations

import argparse
from pathlib import Path

from imagegen import cli, errors
from imagegen.commands import cli_reference

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "reference" / "cli.md"
REGENERATE = "python -m imagegen.commands.cli_reference > docs/reference/cli.md"


def test_the_committed_page_is_the_generated_one():
    assert PAGE.read_text(encoding="utf-8") == cli_reference.render(), (
        f"docs/reference/cli.md is stale: the command table changed. Regenerate it: {REGENERATE}")


def _parsers(parser: argparse.ArgumentParser, path: str):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{path} {name}")


def test_every_command_and_flag_has_its_place():
    page = cli_reference.render()
    commands = list(_parsers(cli.build_parser(), "imagegen"))[1:]
    assert {p for p, _ in commands} >= {f"imagegen {name}" for name in cli.COMMANDS}
    for path, parser in commands:
        start = page.index(f"`{path}`\n")
        end = page.find("\n## ", start)
        section = page[start:end]
        for action in parser._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert f"`{flag}`" in section, f"{path}: {flag} is not on the page"


def test_exit_codes_are_the_error_types():
    kinds = cli_reference.error_kinds()
    declared = {obj.exit_code for obj in vars(errors).values()
                if isinstance(obj, type) and issubclass(obj, errors.ImagegenError)}
    assert set(kinds) == declared == set(cli_reference.EXIT_MEANINGS)
    table = cli_reference.render().split("## Exit codes", 1)[1]
    for code, names in kinds.items():
        assert f"| {code} | {', '.join(names)} |" in table


def test_the_page_reads_no_environment(monkeypatch, tmp_path):
    # A default taken from the environment (a compile cache URL with its password) never reaches the page,
    # and an overlay of the compatibility tables (imagegen refresh) does not change it.
    before = cli_reference.render()
    monkeypatch.setenv("IMAGEGEN_COMPILE_CACHE", "redis://hunter2@cache.internal:6379")
    overlay = tmp_path / "compat"
    overlay.mkdir()
    (overlay / "base_images.yaml").write_text("not: [a table")
    monkeypatch.setenv("IMAGEGEN_COMPAT_DIR", str(overlay))
    after = cli_reference.render()
    assert "hunter2" not in after
    assert after == before
