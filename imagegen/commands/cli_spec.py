"""The command line as data: what an option, a group of options and a command are, and the one builder
that turns them into imagegen's argparse parser. The options themselves are in cli_options (those
several commands share) and cli_commands (every command, in the order ``imagegen --help`` lists them).

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
    options take (see Opt.many); ``epilog`` becomes the command's epilog."""

    options: tuple["Opt | Group", ...]
    many: bool | None = None
    once_hint: str = ""
    epilog: str | Later | None = None


@dataclass(frozen=True)
class Command:
    """A subcommand: its help line, its --help description, its arguments in --help order, and its
    handler, "module.function" in imagegen.commands (imported when the command runs: some modules load
    heavy client libraries). ``add_parser``, also "module.function", adds a command that builds its own
    parser (ci, with subcommands of its own) instead of ``args``."""

    name: str
    handler: str
    help: str = ""
    description: str = ""
    args: tuple[Opt | Group, ...] = ()
    add_parser: str | None = None


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


def add_option(parser: Parser, opt: Opt, group: Group | None = None) -> argparse.Action:
    kwargs = {name: value(getattr(opt, name)) for name in _FIELDS if getattr(opt, name) is not UNSET}
    help = value(opt.help)
    if opt.many is not None:
        form = group.many if group is not None else None
        if form is None:
            raise TypeError(f"{opt.flags[0]} is a cell option: add it through a Group with many=True or False")
        if form:
            kwargs.setdefault("action", "append")
        help = help.replace("{many}", opt.many if form else "")
    action = parser.add_argument(*opt.flags, help=help, **kwargs)
    if opt.many is not None and group is not None and not group.many:
        parser.once_hints[action.dest] = group.once_hint
    return action


def add_arguments(parser: Parser, items: Sequence[Opt | Group], group: Group | None = None) -> None:
    for item in items:
        if isinstance(item, Group):
            if item.epilog is not None:
                parser.epilog = value(item.epilog)
            add_arguments(parser, item.options, item if item.many is not None else group)
        else:
            add_option(parser, item, group)


def build(program: Program, commands: Sequence[Command]) -> Parser:
    """The parser of ``program`` with one subcommand per entry of ``commands``, in their order."""
    parser = Parser(prog=program.prog, description=program.description)
    parser.add_argument("--version", action="version", version=program.version)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    for command in commands:
        if command.add_parser is not None:
            resolve(command.add_parser)(sub)
            continue
        p = sub.add_parser(command.name, help=command.help, description=command.description)
        add_arguments(p, command.args)
    return parser
