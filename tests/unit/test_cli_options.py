"""The options several commands share: a cell's axes in both forms, and --budget's durations."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from imagegen import cli
from imagegen.commands import cli_options
from imagegen.commands.cli_spec import options


def test_the_two_forms_of_the_cell_options_are_the_same_options():
    # render (one cell) and the matrix commands must not drift apart: one tuple, two forms
    assert cli_options.ONE_CELL.options is cli_options.CELLS.options is cli_options.CELL_OPTIONS
    assert cli_options.ONE_CELL.many is False and cli_options.CELLS.many is True
    assert "render makes one cell" in cli_options.ONE_CELL.once_hint
    assert cli_options.CELLS in cli_options.MATRIX.options


def test_the_cell_options_that_repeat_are_the_axes():
    repeat = {o.flags[0] for o in cli_options.CELL_OPTIONS if o.many is not None}
    assert repeat == {"--arch", "--torch", "--cuda", "--python", "--base-image", "--version", "--source", "--platform"}
    # --env is repeatable everywhere (several variables), never a per-cell axis
    (env,) = [o for o in cli_options.CELL_OPTIONS if o.flags == ("--env",)]
    assert env.action == "append" and env.many is None


def test_the_shared_groups_hold_their_flags():
    flags = {g: [o.flags[-1] for o in options([getattr(cli_options, g)])] for g in
             ("COMMON", "COMPILE", "GPU_CHECK", "CACHE")}
    assert flags == {"COMMON": ["--lock", "--config", "--recipe-dir"],
                     "COMPILE": ["--force", "--max-jobs", "--nvcc-threads"],
                     "GPU_CHECK": ["--gpu-check-device", "--dockerfile-frontend"],
                     "CACHE": ["--cache-from", "--cache-to"]}
    assert cli_options.JSON_RESULTS.flags == cli_options.JSON.flags and cli_options.JSON_RESULTS.help != cli_options.JSON.help


@pytest.mark.parametrize("text, seconds", [("330m", 19800), ("5h30m", 19800), ("90s", 90), ("19800", 19800),
                                           (" 1h ", 3600), ("2m5", 125)])
def test_budget_durations(text, seconds):
    assert cli_options.budget_seconds(text) == seconds


@pytest.mark.parametrize("text", ["0", "", "0m", "abc", "5x", "1d", "-5", "1.5h", "12345h"])
def test_budget_refuses_what_is_no_duration(text):
    with pytest.raises(argparse.ArgumentTypeError, match="is no duration"):
        cli_options.budget_seconds(text)


# --------------------------------------------------------------------------------------------
# Options that take a local path refuse a URL (found by a fuzz of every option, 2026-11-28: `render
# --output https://u:TOKEN@h/x` wrote the folders ./https:/u:TOKEN@h/ and printed the token; `--config
# URL` said "no such config file" with the token in it, since a Path keeps one '/' of "//").

TOKEN = "ghp_S3cr3tT0kenDoNotLeak1234"


def _path_options() -> list[tuple[list[str], str]]:
    """(the words naming the command, the option string) of every option typed as a local path."""
    found = []

    def walk(parser: argparse.ArgumentParser, words: list[str]) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, words + [name])
            elif action.type in (cli_options.local_path, cli_options.path_text):
                found.append((words, action.option_strings[-1] if action.option_strings else ""))
    walk(cli.build_parser(), [])
    return found


def test_every_path_option_of_the_cli_is_typed_as_one():
    shown = {(" ".join(w), o) for w, o in _path_options()}
    for expected in [("render", "--output"), ("render", "--config"), ("bake", "--file"), ("bake", "--dockerfiles"),
                     ("build", "--out"), ("build", "--work"), ("build", "--ca-bundle"), ("build", "--netrc"),
                     ("build", "--python-exe"), ("build", "--source"), ("build", "--recipe-dir"), ("plan", "--lock"),
                     ("verify", ""), ("index", ""), ("ci github", "--output"), ("ci github", "--bake-file")]:
        assert expected in shown, expected
    assert len(shown) > 40


@pytest.mark.parametrize("url", [f"https://user:{TOKEN}@host/x", "s3://bucket/wheels", "file:///etc/passwd"])
def test_a_url_given_for_a_path_is_one_line_and_exit_2_without_the_token(url, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for words, option in _path_options():
        code = cli.main(words + ([option, url] if option else [url]))
        err = capsys.readouterr().err
        assert code == 2, (words, option, err)
        assert err.count("\n") == 1 and "takes a local path, not a URL" in err and TOKEN not in err, err
    assert list(tmp_path.iterdir()) == []  # nothing written, no https:/ folder


@pytest.mark.parametrize("text", ["-", "python3", "out/wheelhouse", "/abs/path", "c:/x", "a:b", "wheel@1.whl"])
def test_paths_and_program_names_are_taken_as_given(text):
    assert cli_options.path_text(text) == text
    assert cli_options.local_path(text) == Path(text)
