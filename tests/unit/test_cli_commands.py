"""The command table is complete and consistent: every command is in the parser and dispatched, every
handler exists and takes the parsed args, no command has a flag or a destination twice, every option is
read by some command, and every option's data is well formed."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
from pathlib import Path

import pytest

from imagegen import cli
from imagegen.commands import cli_commands, cli_spec, planning
from imagegen.commands.cli_spec import UNSET, Later, options
from imagegen.plan.options import Flags

COMMANDS = cli_commands.COMMANDS
SUBCOMMANDS = tuple(s for c in COMMANDS for s in c.subcommands)
COMMANDS_DIR = Path(cli_spec.__file__).parent
TABLES = {"cli_spec.py", "cli_options.py", "cli_commands.py", "cli_ci.py"}


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return action.choices


def every_parser() -> list[tuple[str, argparse.ArgumentParser]]:
    """(`imagegen ci github`-style path, parser) for every command and subcommand."""
    found, todo = [], [("imagegen", cli.build_parser())]
    while todo:
        path, parser = todo.pop()
        found.append((path, parser))
        if any(isinstance(a, argparse._SubParsersAction) for a in parser._actions):
            todo.extend((f"{path} {name}", sub) for name, sub in subparsers(parser).items())
    return found


def test_the_parser_the_dispatch_and_the_table_name_the_same_commands_in_order():
    names = [c.name for c in COMMANDS]
    assert len(set(names)) == len(names)
    assert list(subparsers(cli.build_parser())) == names
    assert list(cli.COMMANDS) == names


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.name)
def test_every_handler_exists_and_takes_the_parsed_args(command):
    handler = cli_spec.resolve(command.handler)
    params = list(inspect.signature(handler).parameters)
    assert callable(handler) and params == ["args"], (command.handler, params)
    assert command.help and command.description and (command.args or command.subcommands), command.name
    # a command with subcommands runs them all: they have no handler of their own, and one must be named
    assert all(s.handler is None and s.help and s.description for s in command.subcommands)
    assert bool(command.subcommands) == bool(command.subcommand_dest) == bool(command.subcommand_metavar)


def test_dispatch_runs_the_handler_the_table_names(monkeypatch):
    seen = []
    # resolved when the command runs, so the module's function as it is then runs
    monkeypatch.setattr(planning, "cmd_archs", lambda args: seen.append((args.arch, args.argv)) or 0)
    assert cli.main(["archs", "9.0"]) == 0 and seen == [("9.0", ("archs", "9.0"))]


@pytest.mark.parametrize("path, parser", every_parser(), ids=lambda x: x if isinstance(x, str) else "")
def test_no_command_has_a_flag_or_a_destination_twice(path, parser):
    # argparse refuses a flag twice in one parser; two flags with one dest it takes silently (the last given wins)
    flags = [f for a in parser._actions for f in a.option_strings]
    assert len(flags) == len(set(flags)), path
    dests = [a.dest for a in parser._actions if a.dest != argparse.SUPPRESS]
    assert len(dests) == len(set(dests)), (path, sorted(d for d in dests if dests.count(d) > 1))
    assert "argv" not in dests, path  # cli.parse puts the command line there


@pytest.mark.parametrize("command", COMMANDS + SUBCOMMANDS, ids=lambda c: c.name)
def test_no_command_lists_an_option_twice(command):
    flags = [f for o in options(command.args) for f in o.flags]
    assert len(flags) == len(set(flags)), sorted(f for f in flags if flags.count(f) > 1)


def read_dests() -> str:
    """The source of the command modules, which read the parsed options (the tables excluded)."""
    return "\n".join(p.read_text() for p in sorted(COMMANDS_DIR.glob("*.py")) if p.name not in TABLES)


def is_read(dest: str, source: str) -> bool:
    """``dest`` is read as ``args.dest``, by name (getattr(args, "dest")), or is a field of
    plan.options.Flags, which commands.common.flags fills from the parsed options by name."""
    return dest in {f.name for f in dataclasses.fields(Flags)} or bool(
        re.search(rf"\bargs\.{dest}\b|[\"']{dest}[\"']", source))


def test_every_option_is_read_by_a_command():
    source = read_dests()
    dests = {a.dest: path for path, parser in every_parser() for a in parser._actions
             if a.dest not in (argparse.SUPPRESS, "help", "version")}
    assert len(dests) > 80 and "ci_command" in dests and "windows_arch" in dests
    unread = sorted(f"{path}: {dest}" for dest, path in dests.items() if not is_read(dest, source))
    assert not unread, f"options nothing reads: {unread}"
    # the check itself can fail: an option no command reads is found
    assert not is_read("colour_scheme", source) and is_read("arch", source) and is_read("show", source)


def every_opt():
    return [o for c in COMMANDS + SUBCOMMANDS for o in options(c.args)]


def test_every_option_is_well_formed():
    for opt in every_opt():
        help = cli_spec.value(opt.help)
        assert help and help == help.strip() and "  " not in help, opt.flags
        # {many} is filled in only for a cell option: anywhere else it would show as it is
        assert ("{many}" in help) == (opt.many is not None), opt.flags
        positional = not opt.flags[0].startswith("-")
        assert (len(opt.flags) == 1 and opt.flags[0].isidentifier()) if positional else all(
            re.fullmatch(r"--?[a-z][a-z0-9-]*", f) for f in opt.flags), opt.flags
        choices, default = cli_spec.value(opt.choices), cli_spec.value(opt.default)
        if choices is not UNSET and default not in (UNSET, None):
            assert default in choices, opt.flags
        if opt.action in ("store_true", "append") or isinstance(opt.action, type):
            assert opt.type is UNSET or opt.action == "append", opt.flags  # a switch takes no value to convert


def test_the_help_texts_computed_from_the_tables_are_filled_in():
    render = subparsers(cli.build_parser())["render"]
    helps = {a.option_strings[-1]: a.help for a in render._actions if a.option_strings}
    assert "{" not in helps["--python"] and "default: 3." in helps["--python"]
    flavor = next(a for a in render._actions if a.dest == "flavor")
    assert flavor.choices and flavor.default is None and "else" in flavor.help
    assert render.epilog.startswith("Cells: ")
    (cache,) = [o for o in options(cli_commands.BUILD.args) if o.flags == ("--compile-cache",)]
    assert isinstance(cache.default, Later)  # read from the environment when the parser is built


def test_compile_cache_default_is_the_environment_when_the_parser_is_built(monkeypatch):
    monkeypatch.setenv("IMAGEGEN_COMPILE_CACHE", "redis://cache:6379")
    assert cli.build_parser().parse_args(["build"]).compile_cache == "redis://cache:6379"
    monkeypatch.delenv("IMAGEGEN_COMPILE_CACHE")
    assert cli.build_parser().parse_args(["build"]).compile_cache is None
