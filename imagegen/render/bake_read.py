"""Read a bake file without docker, for ``imagegen ci github`` (which only writes a YAML file).

A JSON bake file is read as JSON; an HCL one as imagegen itself writes it (imagegen.render.bake.to_hcl:
``variable``, ``group`` and ``target`` blocks whose attributes are string literals, lists and objects of
them, and, in ``args``, the conditional expressions imagegen writes). In both forms a string is a bake
template: ``$${`` and ``%%{`` read back as ``${`` and ``%{``; an interpolation left in a string is an
expression imagegen does not evaluate.

What the workflow takes from a target (its local outputs, platforms and labels) must be literal; an
expression elsewhere (the ``args`` imagegen writes, a ``secret`` source) is left out, as the workflow never
reads it. A bake file that uses what imagegen does not write (``inherits``, ``matrix``, functions, heredocs,
an expression in an output or label) raises BakeReadError, with the line it stopped at.

read_bake resolves a selection of targets and groups as ``docker buildx bake --print`` does and, where the
docker CLI with buildx is there, also asks buildx and requires that both read the same (the check ``ci
github`` always made): a file only buildx can read is then taken from buildx.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from imagegen.errors import BakeReadError, EngineError, UsageError

# What the workflow reads of a target (imagegen.render.workflow_targets.targets_from_print): these must be
# literal values.
USED_KEYS = ("output", "platforms", "labels")
# Bake features imagegen never writes: a file using them is read by buildx only.
UNSUPPORTED_KEYS = ("inherits", "matrix", "name")
BLOCKS = ("variable", "group", "target")


class Expr(str):
    """An expression imagegen does not evaluate (its source text)."""


# --------------------------------------------------------------------------------------------
# Strings: HCL escapes, then bake's template escapes


_HCL_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", '"': '"', "\\": "\\"}


def _template(text: str) -> str | Expr:
    """A decoded string as bake reads it: ``$${`` -> ``${``, ``%%{`` -> ``%{``; an interpolation or
    directive left in it makes it an Expr."""
    out, i = [], 0
    while i < len(text):
        if text.startswith(("$${", "%%{"), i):
            out.append(text[i + 1:i + 3])
            i += 3
        elif text.startswith(("${", "%{"), i):
            return Expr(text)
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _from_json(value):
    if isinstance(value, str):
        return _template(value)
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    if isinstance(value, dict):
        return {k: _from_json(v) for k, v in value.items()}
    return value


# --------------------------------------------------------------------------------------------
# HCL, as imagegen writes it


class _Parser:
    IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
    NUMBER = re.compile(r"-?[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")

    def __init__(self, text: str):
        self.text = text
        self.i = 0

    def fail(self, what: str) -> BakeReadError:
        line = self.text.count("\n", 0, self.i) + 1
        return BakeReadError(f"line {line}: {what}")

    def peek(self) -> str:
        return self.text[self.i] if self.i < len(self.text) else ""

    def skip(self, newlines: bool) -> None:
        """Spaces and comments (and newlines, where ``newlines``)."""
        while self.i < len(self.text):
            c = self.text[self.i]
            if c in " \t\r" or (newlines and c == "\n"):
                self.i += 1
            elif c == "#" or self.text.startswith("//", self.i):
                end = self.text.find("\n", self.i)
                self.i = len(self.text) if end < 0 else end
            elif self.text.startswith("/*", self.i):
                end = self.text.find("*/", self.i + 2)
                if end < 0:
                    raise self.fail("a comment that does not end")
                self.i = end + 2
            else:
                return

    def string(self) -> str | Expr:
        assert self.peek() == '"'
        self.i += 1
        out = []
        while True:
            c = self.peek()
            if c in ("", "\n"):
                raise self.fail("a string that does not end on its line")
            self.i += 1
            if c == '"':
                return _template("".join(out))
            if c != "\\":
                out.append(c)
                continue
            e = self.peek()
            self.i += 1
            if e in _HCL_ESCAPES:
                out.append(_HCL_ESCAPES[e])
            elif e in ("u", "U"):
                n = 4 if e == "u" else 8
                digits = self.text[self.i:self.i + n]
                if not re.fullmatch(rf"[0-9A-Fa-f]{{{n}}}", digits):
                    raise self.fail(f"a bad \\{e} escape")
                out.append(chr(int(digits, 16)))
                self.i += n
            else:
                raise self.fail(f"an unknown escape \\{e}")

    def raw(self) -> Expr:
        """An expression's source, up to a newline, ',' or a closing bracket outside its own brackets."""
        start, depth = self.i, 0
        while self.i < len(self.text):
            c = self.text[self.i]
            if c == '"':
                self.string()
                continue
            if c in "([{":
                depth += 1
            elif c in ")]}":
                if depth == 0:
                    break
                depth -= 1
            elif depth == 0 and (c in ",\n#" or self.text.startswith("//", self.i)):
                break
            elif self.text.startswith("<<", self.i):
                raise self.fail("a heredoc")
            self.i += 1
        if depth:
            raise self.fail("an expression over several lines")
        text = self.text[start:self.i].strip()
        if not text:
            raise self.fail("a missing value")
        return Expr(text)

    def value(self):
        start = self.i
        c = self.peek()
        if c == '"':
            got = self.string()
        elif c == "[":
            got = self.sequence()
        elif c == "{":
            got = self.mapping()
        elif m := self.NUMBER.match(self.text, self.i):
            self.i = m.end()
            got = json.loads(m.group())
        elif (m := self.IDENT.match(self.text, self.i)) and m.group() in ("true", "false", "null"):
            self.i = m.end()
            got = {"true": True, "false": False, "null": None}[m.group()]
        else:
            return self.raw()
        self.skip(newlines=False)
        if self.peek() not in ("", "\n", ",", "]", "}"):  # the literal goes on into an expression
            self.i = start
            return self.raw()
        return got

    def sequence(self) -> list:
        self.i += 1
        items = []
        while True:
            self.skip(newlines=True)
            if self.peek() == "]":
                self.i += 1
                return items
            items.append(self.value())
            self.skip(newlines=True)
            if self.peek() == ",":
                self.i += 1
            elif self.peek() != "]":
                raise self.fail("a list without ',' between its items")

    def key(self) -> str:
        if self.peek() == '"':
            key = self.string()
            if isinstance(key, Expr):
                raise self.fail("an interpolation in a key")
            return key
        m = self.IDENT.match(self.text, self.i)
        if not m:
            raise self.fail(f"unexpected {self.peek()!r}")
        self.i = m.end()
        return m.group()

    def mapping(self) -> dict:
        self.i += 1
        out: dict = {}
        while True:
            self.skip(newlines=True)
            if self.peek() == "}":
                self.i += 1
                return out
            key = self.key()
            self.skip(newlines=False)
            if self.peek() not in ("=", ":"):
                raise self.fail(f"an object key {key!r} without '='")
            self.i += 1
            self.skip(newlines=False)
            out[key] = self.value()
            self.skip(newlines=False)
            if self.peek() == ",":
                self.i += 1

    def body(self, top: bool) -> tuple[dict, list]:
        """(attributes, blocks as (type, labels, body)) up to the closing brace (or the end, at the top)."""
        attributes: dict = {}
        blocks: list = []
        while True:
            self.skip(newlines=True)
            if self.peek() == "":
                if top:
                    return attributes, blocks
                raise self.fail("a block that does not end")
            if self.peek() == "}" and not top:
                self.i += 1
                return attributes, blocks
            name = self.key()
            self.skip(newlines=False)
            if self.peek() == "=":
                self.i += 1
                self.skip(newlines=False)
                attributes[name] = self.value()
                self.skip(newlines=False)
                if self.peek() not in ("", "\n", "}"):
                    raise self.fail(f"more after the value of {name}")
                continue
            labels = []
            while self.peek() == '"' or self.IDENT.match(self.text, self.i):
                label = self.key()
                labels.append(label)
                self.skip(newlines=False)
            if self.peek() != "{":
                raise self.fail(f"unexpected {self.peek()!r} after {name}")
            self.i += 1
            inner, nested = self.body(top=False)
            if nested:
                raise self.fail(f"a block inside {name}")
            blocks.append((name, labels, inner))


def parse_hcl(text: str) -> dict:
    """An HCL bake file as imagegen writes it -> the JSON form's structure (variable, group, target)."""
    parser = _Parser(text)
    attributes, blocks = parser.body(top=True)
    if attributes:
        raise BakeReadError(f"a top-level attribute {next(iter(attributes))} (imagegen writes variable blocks)")
    out: dict = {"variable": {}, "group": {}, "target": {}}
    for kind, labels, body in blocks:
        if kind not in BLOCKS:
            raise BakeReadError(f"a {kind} block (imagegen writes variable, group and target blocks only)")
        if len(labels) != 1:
            raise BakeReadError(f"a {kind} block with {len(labels)} labels")
        out[kind].setdefault(labels[0], {}).update(body)  # bake merges blocks of one name
    return out


# --------------------------------------------------------------------------------------------
# The definition, and a selection of it as buildx prints it


def load_definition(path: Path) -> dict:
    """``path`` (.json, else HCL) as the JSON form's structure. BakeReadError when imagegen cannot read it."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise BakeReadError("not UTF-8 text") from None
    if path.suffix == ".json":
        try:
            data = _from_json(json.loads(text))
        except json.JSONDecodeError as exc:
            raise BakeReadError(f"not JSON ({exc.msg} at line {exc.lineno})") from None
        if not isinstance(data, dict):
            raise BakeReadError("not a JSON object")
        unknown = sorted(set(data) - set(BLOCKS))
        if unknown:
            raise BakeReadError(f"a {unknown[0]!r} section (imagegen writes variable, group and target)")
    else:
        data = parse_hcl(text)
    for kind in ("group", "target"):
        section = data.get(kind) or {}
        if not isinstance(section, dict) or not all(isinstance(b, dict) for b in section.values()):
            raise BakeReadError(f"a {kind} section that is not an object of {kind}s")
    for name, body in (data.get("target") or {}).items():
        for key in UNSUPPORTED_KEYS:
            if key in body:
                raise BakeReadError(f"target {name} uses {key!r}, which imagegen does not write")
        for key in USED_KEYS:
            if _has_expr(body.get(key)):
                raise BakeReadError(f"target {name} has an expression in {key!r} ({_first_expr(body[key])})")
    for name, body in (data.get("group") or {}).items():
        targets = body.get("targets", [])
        if _has_expr(targets) or not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
            raise BakeReadError(f"group {name}'s targets are not a list of names")
    return data


def _has_expr(value) -> bool:
    return _first_expr(value) is not None


def _first_expr(value) -> Expr | None:
    if isinstance(value, Expr):
        return value
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return next((e for e in (_first_expr(v) for v in items) if e is not None), None)


def _literal(value):
    """``value`` without the expressions in it (the workflow reads none of them)."""
    if isinstance(value, dict):
        return {k: _literal(v) for k, v in value.items() if not isinstance(v, Expr) and v is not None}
    if isinstance(value, list):
        return [_literal(v) for v in value if not isinstance(v, Expr)]
    return value


def select(definition: dict, file: Path, names: list[str] | None) -> dict:
    """The targets of ``names`` (targets or groups; default: the group ``default``) as ``docker buildx bake
    --print`` lists them: the group ``default`` of the chosen targets, and each target by name (sorted, as
    buildx prints its map)."""
    groups = {n: list(g.get("targets", [])) for n, g in (definition.get("group") or {}).items()}
    defined = definition.get("target") or {}
    chosen: list[str] = []

    def resolve(name: str, seen: tuple[str, ...]) -> None:
        if name in groups and name not in seen:
            for member in groups[name]:
                resolve(member, (*seen, name))
        elif name in defined:
            if name not in chosen:
                chosen.append(name)
        elif name not in seen:
            raise UsageError(f"--bake-file {file}: no bake target or group named {name} (imagegen bake writes a group"
                             " per recipe, per recipe version and `default`)")

    for name in names or ["default"]:
        resolve(name, ())
    return {"group": {"default": {"targets": chosen}},
            "target": {name: _literal(defined[name]) for name in sorted(chosen)}}


def projection(printed: dict) -> dict:
    """What the workflow takes from each printed target (output folders, platforms, labels), to compare a
    reading with buildx's."""
    from imagegen.render.workflow_targets import local_output_dests

    return {name: (local_output_dests(body.get("output") or []), sorted(str(p) for p in body.get("platforms") or []),
                   {str(k): str(v) for k, v in (body.get("labels") or {}).items()})
            for name, body in (printed.get("target") or {}).items()}


def cannot_read(file: Path, problem: str) -> UsageError:
    return UsageError(f"--bake-file {file}: imagegen reads the bake files it writes without docker, and not this one"
                      f" ({problem}): give its JSON form (docker buildx bake --print -f FILE > FILE.json on a machine"
                      " with buildx, or imagegen bake -f FILE.json), or install the buildx plugin (sudo imagegen"
                      " setup engine)")


def read_bake(file: Path, cwd: Path, targets: list[str] | None = None) -> dict:
    """``file``'s ``targets`` as ``docker buildx bake --print`` prints them, read by imagegen itself and, where
    the docker CLI with buildx is there, checked against buildx's reading (which is taken for a file only
    buildx can read). No docker and a file imagegen cannot read: a UsageError saying what to do."""
    from imagegen.render import bakefiles

    path = file if file.is_absolute() else cwd / file
    try:
        definition, problem = load_definition(path), None
    except BakeReadError as exc:
        definition, problem = None, str(exc)
    try:
        printed = bakefiles.print_bake(file, cwd, targets)
    except EngineError as exc:
        if "not installed" not in str(exc):
            raise  # buildx is there and refuses the file (or a name in it), as it always did
        printed = None
    if printed is None and definition is None:
        raise cannot_read(file, problem)
    own = select(definition, file, targets) if definition is not None else None
    if printed is None:
        return own
    if own is not None:
        mine, theirs = projection(own), projection(printed)
        if sorted(mine) != sorted(theirs):
            raise EngineError(f"--bake-file {file}: imagegen reads targets {', '.join(sorted(mine)) or 'none'} but"
                              f" docker buildx bake --print {', '.join(sorted(theirs)) or 'none'}: write the file"
                              " again with imagegen bake")
        for name in mine:
            if mine[name] != theirs[name]:
                raise EngineError(f"--bake-file {file}: target {name} reads otherwise with imagegen than with docker"
                                  " buildx bake --print (outputs, platforms or labels): write the file again with"
                                  " imagegen bake")
    return printed
