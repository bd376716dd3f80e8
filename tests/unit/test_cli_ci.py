"""`imagegen ci` as data: one provider (github), its Linux target choice exclusive, its Windows options
in a section of their own, its defaults those the workflow renderer uses."""

from __future__ import annotations

import argparse

import pytest

from imagegen import cli
from imagegen.commands import ci, cli_ci
from imagegen.commands.cli_spec import options
from imagegen.errors import UsageError
from imagegen.render import workflow


def github() -> argparse.ArgumentParser:
    (sub,) = [a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    (providers,) = [a for a in sub.choices["ci"]._actions if isinstance(a, argparse._SubParsersAction)]
    return providers.choices["github"]


def test_ci_has_one_provider_and_needs_it():
    assert cli_ci.CI.subcommands == (cli_ci.GITHUB,) and cli_ci.CI.handler == "ci.run"
    with pytest.raises(UsageError, match="imagegen ci: the following arguments are required: PROVIDER"):
        cli.build_parser().parse_args(["ci"])


def test_targets_or_a_group_not_both():
    assert [o.flags for o in cli_ci._WHICH_TARGETS.options] == [("--targets",), ("--group",)]
    (group,) = github()._mutually_exclusive_groups
    assert [a.dest for a in group._group_actions] == ["targets", "group"]
    with pytest.raises(UsageError, match="not allowed with argument"):
        cli.build_parser().parse_args(["ci", "github", "--targets", "a", "--group", "b"])


def test_the_windows_section_holds_every_windows_option_and_only_them():
    section = next(g for g in github()._action_groups if g.title == "Windows jobs")
    dests = [a.dest for a in section._group_actions]
    assert dests == [o.flags[0][2:].replace("-", "_") for o in options([cli_ci._WINDOWS_JOBS])]
    assert dests and all(d.startswith("windows") for d in dests)
    every = [a.dest for a in github()._actions]
    assert {d for d in every if d.startswith("windows")} == set(dests)


def test_the_defaults_are_the_workflow_renderers():
    args = cli.build_parser().parse_args(["ci", "github"])
    assert (args.command, args.ci_command) == ("ci", "github")
    assert (args.registry, args.namespace, args.output) == (workflow.DEFAULT_REGISTRY, workflow.DEFAULT_NAMESPACE,
                                                            workflow.DEFAULT_OUTPUT)
    assert str(workflow.DEFAULT_TIMEOUT) in next(a.help for a in github()._actions if a.dest == "timeout")


def test_ci_add_parser_builds_the_same_command_alone():
    # tests/workflow_cli.py parses `ci` through ci.add_parser: the same table, the same Namespace
    top = cli._Parser(prog="imagegen")
    sub = top.add_subparsers(dest="command", metavar="COMMAND", parser_class=cli._Parser)
    ci.add_parser(sub)
    argv = ["ci", "github", "--windows", "sage", "--windows-torch", "2.8", "--timeout", "90", "-o", "-"]
    assert top.parse_args(argv) == cli.build_parser().parse_args(argv)
