"""The options several commands share: a cell's axes in both forms, and --budget's durations."""

from __future__ import annotations

import argparse

import pytest

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
