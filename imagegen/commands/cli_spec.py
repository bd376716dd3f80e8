"""The command line as data: what an option, a group of options and a command are, and the one builder
that turns them into imagegen's argparse parser. The options themselves are in cli_options (those
several commands share), cli_commands (every command, in the order ``imagegen --help`` lists them)
and cli_ci (`imagegen ci` and its providers).

Two things argparse does not do are done here, once for every command: a usage error is one line
(exit 2) like every other error, and an option that takes one value refuses a second, different one
(_Once) instead of silently keeping the last."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from imagegen.errors import UsageError


@dataclass(frozen=True)
class Later:
    """A help text, choices or default computed when the parser is built, not when this module is
    imported: it reads the compatibility tables (which `imagegen refresh`'s overlay changes) or the
    environment."""

    make: Callable[[], Any]


UNSET: Any = object()  # the field was not given: argparse's own default for it applies


@dataclass(frozen=True)
class Opt:
    """One option or positional argument as ``add_argument`` takes it; a field left UNSET is not passed.
    ``action`` UNSET means one value, given once (_Once).

    ``many``: a cell option (--torch, --arch, ...), which a matrix command takes repeated and render
    once. In a Group with ``many=True`` it is ``append`` and ``many`` replaces ``{many}`` in its help;
    with ``many=False`` ``{many}`` is dropped and a second value gets the group's ``once_hint``."""

    flags: tuple[str, ...]
    help: str | Later
    dest: str = UNSET
    action: str | type[argparse.Action] = UNSET
    type: Callable[[str], Any] = UNSET
    default: Any = UNSET
    choices: Sequence[str] | Later = UNSET
    metavar: str = UNSET
    nargs: str = UNSET
    required: bool = UNSET
    many: str | None = None

    def but(self, **changes: Any) -> "Opt":
        """This option with other fields (the same flag, told another command's way)."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class Group:
    """Options several commands take together, added in this order. ``many`` says which form its cell
    options take (see Opt.many); ``epilog`` becomes the command's epilog. With a ``title`` the options
    are a titled section of --help; ``exclusive``: at most one of them may be given."""

    options: tuple["Opt | Group", ...]
    many: bool | None = None
    once_hint: str = ""
    epilog: str | Later | None = None
    title: str | None = None
    description: str | None = None
    exclusive: bool = False


@dataclass(frozen=True)
class Command:
    """A subcommand: its help line, its --help description, its arguments in --help order, and its
    handler, "module.function" in imagegen.commands (imported when the command runs: some modules load
    heavy client libraries). A command with ``subcommands`` (ci: one per CI provider) needs one of them,
    named in ``subcommand_dest``; its handler runs them all (theirs is None)."""

    name: str
    handler: str | None
    help: str = ""
    description: str = ""
    args: tuple[Opt | Group, ...] = ()
    epilog: str | None = None
    subcommands: tuple["Command", ...] = ()
    subcommand_dest: str | None = None
    subcommand_metavar: str | None = None


@dataclass(frozen=True)
class Program:
    prog: str
    description: str
    version: str


def resolve(target: str) -> Callable[..., Any]:
    """The function "module.function" names in imagegen.commands."""
    module, name = target.rsplit(".", 1)
    return getattr(importlib.import_module(f"imagegen.commands.{module}"), name)


def value(field: Any) -> Any:
    return field.make() if isinstance(field, Later) else field


def options(items: Sequence[Opt | Group]) -> list[Opt]:
    """Every Opt of ``items``, groups opened, in order."""
    found: list[Opt] = []
    for item in items:
        found.extend(options(item.options) if isinstance(item, Group) else [item])
    return found


# --------------------------------------------------------------------------------------------
# The parser


class _Once(argparse._StoreAction):
    """A single-valued option (argparse's plain ``store``): given twice with different values it is a
    usage error, where argparse would keep the last one and drop the first without a word."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = parser.given_once.setdefault(id(namespace), {})
        if option_string is not None and self.dest in given and given[self.dest] != values:
            first = given[self.dest]
            parser.error(f"{option_string} given twice ({first} and {values}): it takes one value"
                         + getattr(parser, "once_hints", {}).get(self.dest, ""))
        given[self.dest] = values
        super().__call__(parser, namespace, values, option_string)


class Parser(argparse.ArgumentParser):
    """argparse, but usage errors are one line (plus exit code 2) like every other error, and an option
    that takes one value refuses a second one (_Once) instead of keeping the last."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # Every option of this parser and its groups without an explicit action is a _Once.
        self.register("action", None, _Once)
        self.register("action", "store", _Once)
        self.given_once: dict[int, dict[str, object]] = {}
        self.once_hints: dict[str, str] = {}

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        self.given_once = {}
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")


_FIELDS = ("dest", "action", "type", "default", "choices", "metavar", "nargs", "required")


def add_option(parser: Parser, opt: Opt, group: Group | None = None, container: Any = None) -> argparse.Action:
    """Add ``opt`` to ``container`` (the parser, or a section or exclusive group of it); ``group`` is
    the cell group it came through, if any."""
    kwargs = {name: value(getattr(opt, name)) for name in _FIELDS if getattr(opt, name) is not UNSET}
    help = value(opt.help)
    if opt.many is not None:
        form = group.many if group is not None else None
        if form is None:
            raise TypeError(f"{opt.flags[0]} is a cell option: add it through a Group with many=True or False")
        if form:
            kwargs.setdefault("action", "append")
        help = help.replace("{many}", opt.many if form else "")
    action = (container or parser).add_argument(*opt.flags, help=help, **kwargs)
    if opt.many is not None and group is not None and not group.many:
        parser.once_hints[action.dest] = group.once_hint
    return action


def add_arguments(parser: Parser, items: Sequence[Opt | Group], group: Group | None = None,
                  container: Any = None) -> None:
    container = container or parser
    for item in items:
        if isinstance(item, Group):
            if item.epilog is not None:
                parser.epilog = value(item.epilog)
            inner = container if item.title is None else container.add_argument_group(item.title, item.description)
            inner = inner.add_mutually_exclusive_group() if item.exclusive else inner
            add_arguments(parser, item.options, item if item.many is not None else group, inner)
        else:
            add_option(parser, item, group, container)


def add_subcommands(parser: Parser, commands: Sequence[Command], dest: str, metavar: str) -> None:
    """``commands`` as the subcommands of ``parser``, one of which must be given."""
    sub = parser.add_subparsers(dest=dest, metavar=metavar, parser_class=Parser)
    sub.required = True
    for command in commands:
        add_command(sub, command)


def add_command(subparsers: Any, command: Command) -> Parser:
    """The parser of ``command`` (and of its subcommands), added to ``subparsers``."""
    parser = subparsers.add_parser(command.name, help=command.help, description=command.description,
                                   epilog=command.epilog)
    add_arguments(parser, command.args)
    if command.subcommands:
        add_subcommands(parser, command.subcommands, command.subcommand_dest, command.subcommand_metavar)
    return parser


def build(program: Program, commands: Sequence[Command]) -> Parser:
    """The parser of ``program`` with one subcommand per entry of ``commands``, in their order."""
    parser = Parser(prog=program.prog, description=program.description)
    parser.add_argument("--version", action="version", version=program.version)
    add_subcommands(parser, commands, "command", "COMMAND")
    return parser
