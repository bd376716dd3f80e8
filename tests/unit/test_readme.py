"""The command lines and output excerpts of README.md and the manual (docs/, not the run records in
docs/records/), checked against the real CLI.

Every fenced ```console and ```bash block of those pages is read:

- In a ```console block a command starts at a ``$ `` prompt; a line ending in ``\\`` continues on the
  next line. The lines after it, up to the next prompt, are its output. ``PS> `` (PowerShell) is a
  prompt too: that command is not imagegen, and it ends the output of the one before. In a ```bash
  block every line is a command and no output is shown. An indented block (inside a list item) is
  read without its indentation.
- A command line is cut at an unquoted ``#`` that starts a word (a comment, as bash reads it), then
  split into words with shlex and into commands at ``&&``, ``||``, ``|``, ``;`` and ``&``. Leading
  ``NAME=VALUE`` words are environment assignments, and a leading ``sudo`` (with its options) is left
  out: ``sudo ~/.local/bin/imagegen setup engine`` is an imagegen command. A command whose program is ``imagegen`` (or a path
  ending in ``/imagegen``, or ``python -m imagegen``) is checked; ``docker buildx bake`` is checked
  against the committed docker-bake.hcl (its targets, groups and ``IMAGEGEN_*`` variables); the other
  programs of SHELL_PROGRAMS are not imagegen and are skipped, and any other program fails the test
  until it is classified there.
- Each imagegen command is either RUN or PARSE, by the first row of MODES that fits its subcommand
  and arguments (every subcommand of imagegen.cli has a row):
  RUN: imagegen.cli.main runs it in-process, in an empty temporary folder of its own (with
  ``./my-kernels``, the local setup.py project the README uses, copied there from
  tests/fixtures/tiny_kernel), with the command's environment assignments set. Its exit code must be
  0, unless the output shown in the README has an ``imagegen: error:`` line: then it must be one of
  the exit codes of imagegen.errors' failures (2 and up), not 0 and not an internal error. Every output line shown must
  appear in what it printed (stdout or stderr), compared exactly after trailing whitespace is
  removed (leading whitespace counts: tables are aligned). The README's convention for excerpts: a
  shown line that ends in ``...`` stands for any real line starting with the text before the dots
  (``@sha256:...``, a long error line cut short), and a line that is only ``...`` stands for lines
  left out. Blank lines are not compared. The order of the shown lines is not checked.
  PARSE: the command needs a Docker engine, a registry, the network, a GPU, this host's torch and nvcc
  or the wheels of a build the test does not run, so it is not run: imagegen.cli.build_parser() must
  accept its arguments (a renamed or removed flag, a bad choice), and the recipes it names must be in
  the catalogue. The output the README shows after it (a GPU check's figure, a registry digest) is
  not checked. Every command, RUN ones too, is parsed with argparse's abbreviations off, so a flag
  must exist under the name the README spells.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from imagegen import cli
from imagegen.errors import ImagegenError
from imagegen.model.catalogue import load_catalogue

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
# The pages whose commands are checked: the front door and the manual (the generated CLI reference has
# no command blocks; the run records show what ran then, not what runs now).
PAGES = [README, *sorted(p for p in (ROOT / "docs").rglob("*.md") if "records" not in p.relative_to(ROOT / "docs").parts)]
BAKE_FILE = ROOT / "docker-bake.hcl"
TINY_KERNEL = ROOT / "tests" / "fixtures" / "tiny_kernel"

RUN, PARSE = "run", "parse"


def _has(*flags: str):
    return lambda argv: any(a in flags or a.split("=", 1)[0] in flags for a in argv)


def _any(argv) -> bool:
    return True


def _windows_only(argv) -> bool:
    return _has("--windows")(argv) and not _has("--bake-file", "--targets", "--group")(argv)


# (subcommand, condition on its arguments, mode, why): the first row that fits decides.
MODES = [
    ("*", _has("-h", "--help"), RUN, "argparse prints the help and exits"),
    ("plan", _has("--audit"), PARSE, "the audit runs the package's build in the builder image (engine) or on this"
                                     " host's torch and nvcc"),
    ("plan", _has("--resolve"), PARSE, "uv asks the package indexes (network)"),
    ("plan", _any, RUN, "tables only: every cell and why, in well under a second"),
    ("render", _any, RUN, "writes a Dockerfile or a Windows script from the tables, nothing built"),
    ("archs", _any, RUN, "pure arch parsing and formatting"),
    ("recipes", _any, RUN, "lists the packaged catalogue"),
    ("bake", _has("--print"), PARSE, "--print runs docker buildx bake --print"),
    ("bake", _has("--repo"), RUN, "writes the repository's bake files and Dockerfiles, runs nothing"),
    ("bake", _any, PARSE, "checks the bake file it writes with docker buildx bake --print"),
    ("ci", _windows_only, RUN, "Windows jobs only: planned from the tables, no bake file read"),
    ("ci", _any, PARSE, "reads the bake file's targets with docker buildx bake --print"),
    ("build", _any, PARSE, "compiles: on the Docker engine, or with --native on this host's torch and nvcc"),
    ("push", _any, PARSE, "bakes builder images and pushes them to a registry"),
    ("pull", _any, PARSE, "pulls builder images from a registry and runs them"),
    ("lock", _any, PARSE, "asks a registry for the base images' digests"),
    ("verify", _any, PARSE, "needs the wheels of a build this test does not run"),
    ("check", _any, PARSE, "runs the recipe's check on a CUDA GPU"),
    ("collect", _any, PARSE, "needs the wheels and build records a builder image exported"),
    ("index", _any, PARSE, "needs a wheelhouse of built wheels"),
    ("repair", _any, PARSE, "needs built wheels (and auditwheel, torch)"),
    ("publish", _any, PARSE, "uploads to PyPI, the Hub, GitHub or S3 (network, credentials)"),
    ("doctor", _any, PARSE, "probes this host's docker, buildx, nvidia-smi, GPUs and torch"),
    ("cdi-spec", _any, PARSE, "reads this host's GPU device nodes and driver"),
    ("refresh", _any, PARSE, "reads PyPI (network)"),
    ("reuse", _any, PARSE, "needs a built wheel and another torch's libraries (an environment or a torch wheel)"),
    ("setup", _has("--print"), RUN, "prints the shipped set-up script, runs nothing"),
    ("setup", _any, PARSE, "installs a Docker engine and buildx on this machine (root, apt)"),
]

# Programs of README command lines that are not imagegen: skipped (docker buildx bake is checked below).
SHELL_PROGRAMS = {"docker", "ls", "pip", "python", "python3", "bash", "powershell", "PS>", "export", "git", "pipx",
                  "uv"}

# Local paths README commands use as projects, made in each command's folder from a test fixture.
LOCAL_PROJECTS = {"./my-kernels": TINY_KERNEL}



def _failure_codes() -> set[int]:
    """The exit codes of imagegen's known failures (docs/reference/cli.md's exit-code table); 1 (ImagegenError itself)
    and 70 (an unexpected exception) are internal errors, never what an example shows."""
    codes, todo = set(), [ImagegenError]
    while todo:
        cls = todo.pop()
        codes.add(cls.exit_code)
        todo.extend(cls.__subclasses__())
    return codes - {1}


FAILURE_CODES = _failure_codes()


@dataclass
class Command:
    line: int  # line number of the command's first line in its page
    text: str  # as written, continuations joined
    env: dict[str, str]
    words: list[str]  # program and arguments, environment assignments removed
    output: list[str] = field(default_factory=list)
    page: str = "README.md"  # the page, relative to the repository

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def imagegen_argv(self) -> list[str] | None:
        w = self.words
        if w and (w[0] == "imagegen" or w[0].endswith("/imagegen")):
            return w[1:]
        if len(w) >= 3 and Path(w[0]).name.startswith("python") and w[1:3] == ["-m", "imagegen"]:
            return w[3:]
        return None


def strip_comment(line: str) -> str:
    """``line`` without its ``# comment`` as bash reads it: a ``#`` that starts a word, outside quotes and
    not escaped."""
    quote, i = None, 0
    while i < len(line):
        c = line[i]
        if c == "\\" and quote != "'":
            i += 2  # the escaped character is literal
            continue
        if quote:
            if c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
        i += 1
    return line.rstrip()


def split_commands(line: str) -> list[list[str]]:
    """The words of each command of a shell line, split at control operators."""
    lex = shlex.shlex(line, posix=True, punctuation_chars=";&|")
    lex.whitespace_split = True
    lex.commenters = ""
    commands: list[list[str]] = [[]]
    for word in lex:
        if word and set(word) <= set(";&|"):
            commands.append([])
        else:
            commands[-1].append(word)
    return [c for c in commands if c]


ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


def fenced_blocks(text: str):
    """(language, [(line number, line)]) of every fenced block, its indentation removed."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^(\s*)```(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        indent, lang, body = len(m.group(1)), m.group(2), []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append((i + 1, lines[i][indent:] if lines[i][:indent].isspace() else lines[i].lstrip()))
            i += 1
        i += 1
        yield lang, body


def readme_commands(text: str | None = None, page: Path = README) -> list[Command]:
    text = page.read_text(encoding="utf-8") if text is None else text
    name = page.relative_to(ROOT).as_posix()
    commands: list[Command] = []
    for lang, body in fenced_blocks(text):
        if lang not in ("console", "bash"):
            continue
        current: list[Command] = []  # the commands of the last prompt line, whose output follows
        k = 0
        while k < len(body):
            number, line = body[k]
            is_prompt = lang == "bash" or line.startswith(("$ ", "PS> "))
            if not is_prompt:
                if line.strip() and current:
                    current[-1].output.append(line.rstrip())
                k += 1
                continue
            joined = line[2:] if line.startswith("$ ") else line
            while joined.rstrip().endswith("\\") and k + 1 < len(body):
                k += 1
                joined = joined.rstrip()[:-1] + " " + body[k][1].strip()
            k += 1
            joined = strip_comment(joined)
            if not joined.strip():
                continue
            if joined.startswith("PS> "):  # PowerShell: not imagegen, never split as a POSIX line
                current = [Command(number, joined, {}, ["PS>"], page=name)]
                commands.extend(current)
                continue
            current = []
            for words in split_commands(joined):
                env = {}
                while words and ASSIGNMENT.match(words[0]):
                    var, _, value = words.pop(0).partition("=")
                    env[var] = value
                if words and words[0] == "sudo":  # root runs the command that follows
                    words.pop(0)
                    while words and words[0].startswith("-"):
                        words.pop(0)
                current.append(Command(number, joined, env, words, page=name))
            commands.extend(current)
    return commands


def mode_of(argv: list[str]) -> tuple[str, str]:
    sub = next((a for a in argv if not a.startswith("-")), None)
    for name, fits, mode, why in MODES:
        if name in ("*", sub) and fits(argv):
            return mode, why
    raise AssertionError(f"imagegen {sub}: no row in MODES says whether the test runs it (add one, with why)")


COMMANDS = [c for page in PAGES for c in readme_commands(page=page)]
IMAGEGEN = [c for c in COMMANDS if c.imagegen_argv is not None]


def _id(c: Command) -> str:
    return f"{c.page}:{c.line}:" + " ".join(c.imagegen_argv or c.words)[:70]


def strict_parser() -> argparse.ArgumentParser:
    """imagegen's parser, every subcommand's included, without argparse's abbreviations: a flag the
    README spells out must exist under that name (`--flat` must not pass as an abbreviation of a
    renamed `--flatten`)."""
    parser = cli.build_parser()
    todo = [parser]
    while todo:
        p = todo.pop()
        p.allow_abbrev = False
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                todo.extend(action.choices.values())
    return parser


def parse_strictly(command: Command) -> argparse.Namespace:
    try:
        return strict_parser().parse_args(command.imagegen_argv)
    except ImagegenError as exc:
        pytest.fail(f"{command.where}: {command.text}\n{exc}")


def run_main(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(list(argv))
        except SystemExit as exc:  # --help
            code = exc.code if isinstance(exc.code, int) else 0
    return code, out.getvalue(), err.getvalue()


def shown_lines_missing(shown: list[str], printed: str) -> list[str]:
    real = [line.rstrip() for line in printed.splitlines()]
    missing = []
    for line in shown:
        line = line.rstrip()
        if not line.strip() or line.strip() == "...":
            continue
        if line.endswith("..."):
            head = line[:-3]
            if not any(r.startswith(head) for r in real):
                missing.append(line)
        elif line not in real:
            missing.append(line)
    return missing


# --------------------------------------------------------------------------------------------


def test_the_readme_has_commands_of_both_kinds():
    modes = [mode_of(c.imagegen_argv)[0] for c in IMAGEGEN]
    assert modes.count(RUN) >= 8 and modes.count(PARSE) >= 15, modes


def test_every_subcommand_has_a_mode():
    subcommands = set(cli.COMMANDS)
    assert subcommands <= {name for name, *_ in MODES}, subcommands - {name for name, *_ in MODES}


def test_every_readme_program_is_imagegen_or_known():
    unknown = [f"{c.where}: {c.words[0]}" for c in COMMANDS
               if c.imagegen_argv is None and Path(c.words[0]).name not in SHELL_PROGRAMS]
    assert not unknown, "classify these programs in SHELL_PROGRAMS (or fix the extraction): " + ", ".join(unknown)


@pytest.mark.parametrize("command", [c for c in IMAGEGEN if mode_of(c.imagegen_argv)[0] == RUN], ids=_id)
def test_readme_command_runs_as_shown(command: Command, tmp_path, monkeypatch):
    argv = command.imagegen_argv
    if not _has("-h", "--help")(argv):
        parse_strictly(command)
    for name, value in command.env.items():
        monkeypatch.setenv(name, value)
    for path, fixture in LOCAL_PROJECTS.items():
        if path in argv:
            shutil.copytree(fixture, tmp_path / path)
    monkeypatch.chdir(tmp_path)
    code, out, err = run_main(argv)
    where = f"{command.where}: {command.text}\n--- stdout\n{out[-3000:]}\n--- stderr\n{err[-3000:]}"
    if any(line.startswith("imagegen: error: ") for line in command.output):
        assert code in FAILURE_CODES, where
    else:
        assert code == 0, where
    missing = shown_lines_missing(command.output, out + "\n" + err)
    assert not missing, "output lines the CLI does not print:\n" + "\n".join(missing) + "\n" + where


@pytest.mark.parametrize("command", [c for c in IMAGEGEN if mode_of(c.imagegen_argv)[0] == PARSE], ids=_id)
def test_readme_command_parses(command: Command):
    args = parse_strictly(command)
    catalogue = load_catalogue()
    named = []
    for attr in ("recipe", "recipes", "windows"):
        value = getattr(args, attr, None)
        named += [value] if isinstance(value, str) else list(value or [])
    for name in (n for v in named for n in v.split(",")):
        if "/" not in name and not name.startswith("."):
            catalogue.get(name)  # RecipeError names the recipe


# --------------------------------------------------------------------------------------------
# docker buildx bake in a clone: the committed bake file has what the README bakes


def _bake_file_names() -> tuple[set[str], set[str]]:
    text = BAKE_FILE.read_text(encoding="utf-8")
    targets = set(re.findall(r'^(?:target|group) "([^"]+)"', text, re.M))
    variables = set(re.findall(r'^variable "([^"]+)"', text, re.M))
    return targets, variables


BAKES = [c for c in COMMANDS if c.words[:3] == ["docker", "buildx", "bake"]]


@pytest.mark.parametrize("command", BAKES, ids=lambda c: f"{c.where}:" + " ".join(c.words)[:70])
def test_readme_bake_names_committed_targets(command: Command):
    targets, variables = _bake_file_names()
    names, words = [], iter(command.words[3:])
    for w in words:
        if w in ("--set", "-f", "--file", "--progress", "--builder"):
            next(words, None)
        elif not w.startswith("-"):
            names.append(w)
    assert set(names) <= targets, f"{command.where}: not in docker-bake.hcl: {set(names) - targets}"
    ours = {n for n in command.env if n.startswith("IMAGEGEN_")}
    assert ours <= variables, f"{command.where}: no such bake variable: {ours - variables}"


def test_readme_has_bake_lines():
    assert len(BAKES) >= 3


def test_the_front_door_keeps_its_two_set_up_lines():
    """On a fresh Debian/Ubuntu machine one line installs imagegen from the clone and runs the headline, and
    one line runs the tests as CI does (.ci/run calls scripts/test.sh)."""
    text = README.read_text(encoding="utf-8")
    assert "python3 -m venv .venv && .venv/bin/pip install -q . && .venv/bin/imagegen render sage --arch 12.0+PTX" in text
    assert "\nbash scripts/test.sh\n" in text
    assert len(text.splitlines()) <= 260, "README.md is the front door: the details belong in docs/"


# --------------------------------------------------------------------------------------------
# the reader itself


def test_reader_handles_shell_lines():
    text = "\n".join([
        "```console",
        "$ imagegen plan x --arch '8.0;9.0' # a comment with 'quotes'",
        "out line",
        "$ A=1 B='x y' imagegen render y \\",
        "    --arch 9.0   # more",
        "$ docker buildx bake t && imagegen collect w | tee log",
        "PS> powershell -File build.ps1   # Windows",
        "not output of the collect",
        "```",
        "  ```bash",
        "  .venv/bin/imagegen archs 'a#b' \"x\\\" #y\" && ls \\# # c",
        "  ```",
        "```bash",
        "sudo -E ~/.local/bin/imagegen setup engine   # root",
        "```",
    ])
    got = [(c.line, c.env, c.words, c.output) for c in readme_commands(text)]
    assert got == [
        (2, {}, ["imagegen", "plan", "x", "--arch", "8.0;9.0"], ["out line"]),
        (4, {"A": "1", "B": "x y"}, ["imagegen", "render", "y", "--arch", "9.0"], []),
        (6, {}, ["docker", "buildx", "bake", "t"], []),
        (6, {}, ["imagegen", "collect", "w"], []),
        (6, {}, ["tee", "log"], []),
        (7, {}, ["PS>"], ["not output of the collect"]),
        (11, {}, [".venv/bin/imagegen", "archs", "a#b", 'x" #y'], []),
        (11, {}, ["ls", "#"], []),
        (14, {}, ["~/.local/bin/imagegen", "setup", "engine"], []),
    ]
    assert [c.page for c in readme_commands(text)] == ["README.md"] * 9  # an assignment does not rename the page


def test_excerpt_convention():
    printed = "a table\n  row one  \nimagegen: error: cannot build x: because\n"
    assert shown_lines_missing(["a table", "  row one", "...", "imagegen: error: cannot build x: ..."], printed) == []
    assert shown_lines_missing(["row one"], printed) == ["row one"]  # leading whitespace counts
    cut = "imagegen: error: cannot build y: ..."
    assert shown_lines_missing([cut], printed) == [cut]
