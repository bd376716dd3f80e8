"""The builder that turns the command line's data into argparse: each field of an option reaches
add_argument (and only the given ones), cell options in their two forms, Later values computed per
build, one-line usage errors, a single value given twice refused."""

from __future__ import annotations

import argparse

import pytest

from imagegen.commands import cli_spec, planning
from imagegen.commands.cli_spec import UNSET, Command, Group, Later, Opt, Program
from imagegen.errors import UsageError

AXIS = Opt(("--axis",), many=" (repeatable)", help="an axis{many}; default: all")
PROGRAM = Program("tool", "a tool", "tool 1.0")


def build(*args, **command) -> argparse.ArgumentParser:
    return cli_spec.build(PROGRAM, [Command("go", "planning.cmd_plan", "go somewhere", "Go.", tuple(args), **command)])


def test_only_the_fields_given_reach_argparse():
    parser = build(Opt(("--flag",), action="store_true", help="a switch"),  # a store_true takes no type or choices
                   Opt(("-n", "--count"), type=int, default=3, help="how many"),
                   Opt(("--mode",), choices=("a", "b"), metavar="MODE", required=True, help="which"),
                   Opt(("--print",), dest="show", action="store_true", help="show"),
                   Opt(("items",), nargs="*", help="things"))
    args = parser.parse_args(["go", "x", "y", "--mode", "a"])
    assert (args.command, args.flag, args.count, args.mode, args.show, args.items) == ("go", False, 3, "a", False,
                                                                                       ["x", "y"])
    assert parser.parse_args(["go", "-n", "7", "--mode", "b", "--print"]).count == 7
    with pytest.raises(UsageError, match="the following arguments are required: --mode"):
        parser.parse_args(["go"])


def test_a_single_valued_option_refuses_a_different_second_value():
    parser = build(Opt(("--name",), help="a name"))
    assert parser.parse_args(["go", "--name", "a", "--name", "a"]).name == "a"
    with pytest.raises(UsageError) as exc:
        parser.parse_args(["go", "--name", "a", "--name", "b"])
    assert str(exc.value) == "tool go: --name given twice (a and b): it takes one value (see tool go --help)"
    # given_once is per parse: the same parser parses a fresh command line afresh
    assert parser.parse_args(["go", "--name", "b"]).name == "b"


def test_a_cell_option_repeats_in_a_matrix_group_and_is_given_once_in_a_one_cell_group():
    many = build(Group((AXIS,), many=True, epilog="Cells: ..."))
    assert many.parse_args(["go", "--axis", "1", "--axis", "2"]).axis == ["1", "2"]
    go = many._subparsers._group_actions[0].choices["go"]
    assert go.epilog == "Cells: ..."
    assert [a.help for a in go._actions if a.dest == "axis"] == ["an axis (repeatable); default: all"]

    one = build(Group((AXIS,), many=False, once_hint="; one cell only"))
    go = one._subparsers._group_actions[0].choices["go"]
    assert [a.help for a in go._actions if a.dest == "axis"] == ["an axis; default: all"]
    assert go.epilog is None
    with pytest.raises(UsageError, match=r"--axis given twice \(1 and 2\): it takes one value; one cell only"):
        one.parse_args(["go", "--axis", "1", "--axis", "2"])


def test_a_cell_option_outside_a_cell_group_is_refused():
    # Its help has a {many} to fill and it has two forms: without a group, neither is chosen.
    with pytest.raises(TypeError, match="--axis is a cell option"):
        build(AXIS)
    with pytest.raises(TypeError, match="--axis is a cell option"):
        build(Group((AXIS,)))  # a plain group (no form of its own) passes none down


def test_later_values_are_computed_at_each_build():
    seen = {"default": "first"}
    opt = Opt(("--where",), default=Later(lambda: seen["default"]), choices=Later(lambda: ("first", "second")),
              help=Later(lambda: f"where (default: {seen['default']})"))
    assert build(opt).parse_args(["go"]).where == "first"
    seen["default"] = "second"
    parser = build(opt)
    assert parser.parse_args(["go"]).where == "second"
    with pytest.raises(UsageError, match="invalid choice: 'third'"):
        parser.parse_args(["go", "--where", "third"])


def test_usage_errors_are_one_line_and_name_the_command():
    parser = build()
    with pytest.raises(UsageError) as exc:
        parser.parse_args(["nope"])
    assert "\n" not in str(exc.value) and str(exc.value).startswith("tool: argument COMMAND: invalid choice")
    assert UsageError.exit_code == 2
    with pytest.raises(UsageError, match="the following arguments are required: COMMAND"):
        parser.parse_args([])


def test_version_subcommands_sections_and_exclusive_options(capsys):
    deep = Command("deep", None, "one level down", "Deeper.", (
        Group((Opt(("--left",), help="left"), Opt(("--right",), help="right")), exclusive=True),
        Group((Opt(("--win",), action="append", help="a Windows thing"),), title="Windows", description="its part"),
    ), epilog="example: tool own deep --left x")
    parser = cli_spec.build(PROGRAM, [Command("own", "planning.cmd_plan", "has its own", "Own.", subcommands=(deep,),
                                              subcommand_dest="own_command", subcommand_metavar="WHICH")])
    args = parser.parse_args(["own", "deep", "--left", "x", "--win", "a", "--win", "b"])
    assert (args.command, args.own_command, args.left, args.right, args.win) == ("own", "deep", "x", None, ["a", "b"])
    with pytest.raises(UsageError, match="argument --right: not allowed with argument --left"):
        parser.parse_args(["own", "deep", "--left", "x", "--right", "y"])
    with pytest.raises(UsageError, match="tool own: the following arguments are required: WHICH"):
        parser.parse_args(["own"])
    with pytest.raises(UsageError, match=r"--left given twice"):  # a section's and a group's options are _Once too
        parser.parse_args(["own", "deep", "--left", "x", "--left", "y"])
    with pytest.raises(SystemExit):
        parser.parse_args(["own", "deep", "--help"])
    shown = capsys.readouterr().out
    assert "Windows:\n  its part\n" in shown and shown.rstrip().endswith("example: tool own deep --left x")
    with pytest.raises(SystemExit):
        parser.parse_args(["--version"])
    assert capsys.readouterr().out == "tool 1.0\n"


def test_resolve_and_options():
    assert cli_spec.resolve("planning.cmd_plan") is planning.cmd_plan
    a, b, c = Opt(("--a",), help="a"), Opt(("--b",), help="b"), Opt(("--c",), help="c")
    assert cli_spec.options([a, Group((b, Group((c,)))), a]) == [a, b, c, a]
    assert a.but(help="other").help == "other" and a.but(help="other").flags == a.flags and a.help == "a"
    assert a.dest is UNSET and a.action is UNSET
