"""Command line: parse (the commands and options are data, in imagegen.commands.cli_commands) and dispatch
to imagegen.commands (one module per group of commands).

Every known failure is an :class:`~imagegen.errors.ImagegenError` and ends as one line on stderr
with its exit code; an unexpected exception is reported the same way (with a hint to re-run with
IMAGEGEN_DEBUG=1 for the traceback) so a user never gets a wall of Python.
"""

from __future__ import annotations

import argparse
import os
import sys
import unicodedata
from typing import Sequence

from imagegen.commands import cli_commands, cli_spec
from imagegen.errors import ImagegenError, UsageError


# The parser is built from the tables in imagegen.commands.cli_commands (every command and its options
# as data); _Parser is its argparse class (one-line usage errors, single-valued options given once), by
# the name tests/workflow_cli.py builds a parser of `ci` alone with.
_Parser = cli_spec.Parser


def build_parser() -> argparse.ArgumentParser:
    return cli_spec.build(cli_commands.PROGRAM, cli_commands.COMMANDS)


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """What a command gets: its options, and the command line as given (``argv``, which render and bake
    write into their files' headers)."""
    args = build_parser().parse_args(argv)
    args.argv = tuple(argv)
    return args


def _handler(target: str):
    """The command ``target`` ("module.function" in imagegen.commands) names, its module imported only
    when it runs (some load heavy client libraries)."""
    def run(args: argparse.Namespace) -> int:
        return cli_spec.resolve(target)(args)
    return run


# Each command is a function (args) -> exit code, in imagegen.commands by group.
COMMANDS = {command.name: _handler(command.handler) for command in cli_commands.COMMANDS}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        for a in argv:  # argparse drops a value of '--' (`--torch=--` becomes an empty list): refuse it
            if a.startswith("-") and a.endswith("=--"):
                raise UsageError(f"{a.split('=', 1)[0]}: '--' is not a value")
        args = parse(argv)
        return COMMANDS[args.command](args)
    except ImagegenError as exc:
        print(f"imagegen: error: {error_line(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("imagegen: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # a bug: still one line, with a way to get the details
        if isinstance(exc, FileNotFoundError) and "No usable temporary directory" in str(exc):
            # tempfile found no folder it can write (TMPDIR, /tmp, /var/tmp, the current folder): the
            # machine's, not a bug
            print("imagegen: error: no folder for temporary files can be written here (TMPDIR, /tmp, /var/tmp, the"
                  " current folder): set TMPDIR to a folder of your own", file=sys.stderr)
            return UsageError.exit_code
        if os.environ.get("IMAGEGEN_DEBUG"):
            raise
        print("imagegen: internal error: " + error_line(f"{exc.__class__.__name__}: {exc}", MAX_ERROR - 100)
              + " (re-run with IMAGEGEN_DEBUG=1 for the traceback, and please report it)", file=sys.stderr)
        return 70


MAX_ERROR = 380  # characters of a message after "imagegen: error: " (the whole line stays under 400)


def error_line(message: str, limit: int = MAX_ERROR) -> str:
    """``message`` as one terminal-safe line: whitespace runs become one space, every other control
    or format character (ESC, NUL, U+202E right-to-left override, ...) is shown escaped, and the
    whole is cut to ``limit`` characters (a 100 kB argument is not echoed back)."""
    from imagegen.safety import redact

    out = []
    for c in " ".join(redact(message).split()):
        if c.isprintable() or c == " ":
            out.append(c)
        elif unicodedata.category(c) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"):
            out.append(c.encode("unicode_escape").decode("ascii"))
        else:
            out.append(c)
        if len(out) > limit:
            break
    text = "".join(out)
    return text if len(text) <= limit else text[:limit - 3].rstrip() + "..."
