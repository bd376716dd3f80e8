"""Reading untrusted recipe files: bounded reads and messages, the key paths in every error, and the
allowed keys of every mapping (taken from resources/recipe.schema.json)."""

from __future__ import annotations

import math
import re
import unicodedata
from importlib import resources
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from imagegen import safety
from imagegen.errors import ArchError, RecipeError, bounded, printable
from imagegen.model.arch import ArchList
from imagegen.model.arch_parse import parse_arch_list

# Error messages quote at most this much of a bad value, so they stay one readable line.
_MAX_QUOTED = 60


# Recipe files and their patches are untrusted input: read only regular files, at most this big.
MAX_RECIPE_BYTES = 1 << 20


MAX_PATCH_BYTES = 8 << 20


# The longest string a recipe key takes (free text and the GPU check have their own, larger bounds).
MAX_STR = 1024


MAX_TEXT = 16 * 1024


MAX_SCRIPT = 64 * 1024


def quoted(value: Any) -> str:
    """A value as an error message shows it: bounded, escaped, never expanded (safety.describe)."""
    return safety.describe(value, _MAX_QUOTED)


def _hidden_character(text: str) -> str | None:
    """The first control or format character of ``text`` (ESC, NUL, a bidi override, a zero-width
    character), other than tab, newline and carriage return: recipe text that a terminal would obey
    or display reordered (``imagegen recipes`` prints descriptions as they are)."""
    if text.isascii() and text.isprintable():
        return None
    for c in text:
        if c not in "\t\n\r" and unicodedata.category(c) in ("Cc", "Cf"):
            return c
    return None


def key_text(key: Any) -> str:
    """A mapping key as part of a key path in a message: bounded and escaped."""
    text = key if isinstance(key, str) else safety.describe(key, 40)
    return printable(bounded(text, 40))


def shown_path(path: Any) -> str:
    """A file name as messages show it: escaped, and its tail only when it is very long."""
    text = printable(str(path))
    return text if len(text) <= 160 else "..." + text[-157:]


class Reader:
    """Reads one mapping of a recipe file, naming the file and the key path in every error."""

    def __init__(self, path: str, data: Any, where: str = "", *, keys: tuple[str, ...] | None = None) -> None:
        self.path = path
        self.where = where
        if not isinstance(data, dict):
            raise self.error(f"expected a mapping, got {quoted(data)}")
        self.data = data
        if keys is not None:
            self.only(keys)

    def error(self, problem: str, key: Any = None) -> RecipeError:
        at = ".".join(p for p in (self.where, None if key is None else key_text(key)) if p)
        return RecipeError(f"{shown_path(self.path)}: {bounded(at, 120) or '<top>'}: {problem}")

    def only(self, keys: tuple[str, ...]) -> None:
        """Refuse a key this mapping does not take (a typo must not be silently ignored)."""
        for key in self.data:
            if key not in keys:
                known = bounded(", ".join(sorted(keys)), 260)
                raise self.error(f"unknown key (known: {known})", key)

    def sub(self, key: str, required: bool = False, *, keys: tuple[str, ...] | None = None) -> "Reader":
        value = self.data.get(key)
        if value is None:
            if required:
                raise self.error("missing", key)
            value = {}
        return Reader(self.path, value, ".".join(p for p in (self.where, key) if p), keys=keys)

    def list(self, key: str) -> list:
        """A list (absent or null: empty)."""
        value = self.data.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.error(f"expected a list, got {quoted(value)}", key)
        return value

    def mapping(self, key: str, what: str = "a mapping") -> dict:
        """A mapping (absent or null: empty)."""
        value = self.data.get(key)
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.error(f"expected {what}, got {quoted(value)}", key)
        return value

    def scalar_text(self, value: Any, key: Any) -> Any:
        """A number written where text is expected (a version 1.0, a flag 1) as that text; a
        non-finite or enormous number is refused rather than written as inf/nan/1e+30."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return value
        if isinstance(value, float) and not math.isfinite(value):
            raise self.error(f"expected text, got {quoted(value)}", key)
        if abs(value) > 10**15:
            raise self.error(f"expected text, got {quoted(value)} (numbers beyond 10^15 are refused)", key)
        return str(value)

    def str(self, key: str, default: str | None = None, *, required: bool = False,
            pattern: re.Pattern[str] | None = None, max_len: int = MAX_STR, numbers: bool = True) -> str | None:
        """A text value. ``numbers``: a number written there is taken as its text (a version 1.0);
        without, it is refused (a name: `name: 5` is a mistake, not the recipe "5")."""
        value = self.data.get(key, default)
        if value is None:
            if required:
                raise self.error("missing", key)
            return None
        if not numbers and not isinstance(value, str):
            raise self.error(f"expected text, got {quoted(value)} (quote it if it is meant as text)", key)
        value = self.scalar_text(value, key)
        if not isinstance(value, str):
            raise self.error(f"expected a string, got {quoted(value)}", key)
        if len(value) > max_len:
            raise self.error(f"{quoted(value)} is {len(value)} characters long; at most {max_len}", key)
        self.no_hidden(value, key)
        self.no_credential(value, key)
        if pattern is not None and not pattern.fullmatch(value):
            raise self.error(f"{quoted(value)} is not allowed here (must match {pattern.pattern})", key)
        return value

    def no_hidden(self, value: str, key: Any) -> None:
        c = _hidden_character(value)
        if c is not None:
            raise self.error(f"{quoted(value)} contains the control character {printable(c)}; write plain text", key)

    def no_credential(self, value: str, key: Any) -> None:
        # A recipe's text reaches the Dockerfile (the homepage as the image's source label), the cell
        # document in the builder image (a patch's reason) and the manifest: no place for a credential.
        if safety.has_credentials(value):
            raise self.error(f"{quoted(value)} carries a credential (user:password@ or a token), which every builder"
                             " image would carry: write it without, and put the credential in ~/.netrc (the netrc"
                             " BuildKit secret)", key)

    def bool(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            raise self.error(f"expected true or false, got {quoted(value)}", key)
        return value

    def number(self, key: str, default: float, *, low: float, high: float, integer: bool = False) -> float:
        """A number in [low, high] (a whole one where ``integer``); NaN, inf and huge are refused."""
        value = self.data.get(key, default)
        what = "a whole number" if integer else "a number"
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or (isinstance(value, float) and not math.isfinite(value))
                or not low <= value <= high or (integer and value != int(value))):
            raise self.error(f"expected {what} from {low:g} to {high:g}, got {quoted(value)}", key)
        return float(value)

    def str_list(self, key: str, *, pattern: re.Pattern[str] | None = None,
                 max_len: int = MAX_STR) -> tuple[str, ...]:
        value = self.data.get(key) or []
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list):
            raise self.error(f"expected a list, got {quoted(value)}", key)
        out = []
        for item in value:
            item = self.scalar_text(item, key)
            if not isinstance(item, str):
                raise self.error(f"expected strings, got {quoted(item)}", key)
            if len(item) > max_len:
                raise self.error(f"{quoted(item)} is {len(item)} characters long; at most {max_len}", key)
            self.no_credential(item, key)
            if pattern is not None and not pattern.fullmatch(item):
                raise self.error(f"{quoted(item)} is not allowed here (must match {pattern.pattern})", key)
            out.append(item)
        return tuple(out)

    def env(self, key: str) -> dict[str, str]:
        value = self.mapping(key, "a mapping of VARIABLE: value")
        out = {}
        for name, val in value.items():
            if not isinstance(name, str) or not safety.ENV_NAME.fullmatch(name):
                raise self.error(f"bad environment variable name {quoted(name)}", key)
            if isinstance(val, bool):
                val = "1" if val else "0"
            val = self.scalar_text(val, f"{key}.{name}")
            if not isinstance(val, str) or not safety.ENV_VALUE.fullmatch(val):
                raise self.error(f"bad value {quoted(val)} for {name} (printable text, no quotes, $ or `)", key)
            secret = safety.env_secret(name, val)
            if secret:
                raise self.error(f"{secret}; {safety.ENV_SECRET_INSTEAD}", key)
            out[name] = val
        return out

    def version(self, key: str, default: str | None = None) -> Version | None:
        text = self.str(key, default, max_len=64)
        if text is None:
            return None
        try:
            return Version(text)
        except InvalidVersion:
            raise self.error(f"{quoted(text)} is not a version", key) from None

    def archs(self, key: str) -> ArchList:
        items = self.str_list(key, max_len=64)
        try:
            return parse_arch_list(list(items)) if items else ArchList([])
        except ArchError as exc:
            raise self.error(str(exc), key) from None


def read_inside(file: Path, limit: int, inside: Path) -> str:
    """A recipe's file as text: a regular UTF-8 file inside the recipe's directory (safety.Unreadable)."""
    data = safety.read_regular_file(file, limit=limit, inside=inside)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise safety.Unreadable(f"not UTF-8 text (byte {exc.start})") from None


# The keys each mapping of a recipe takes; anything else is refused with its key path.
def _schema() -> dict:
    """resources/recipe.schema.json: the keys a recipe may have (users' editors validate against it)."""
    import json

    return json.loads((resources.files("imagegen") / "resources" / "recipe.schema.json").read_text(encoding="utf-8"))


def _keys(schema: dict, *path: str) -> tuple[str, ...]:
    node = schema
    for step in path:
        node = node[step]
    return tuple(node["properties"])


# Every mapping's allowed keys come from the schema file, so the loader and the schema cannot differ.
_SCHEMA = _schema()


TOP_KEYS = _keys(_SCHEMA)


SOURCE_KEYS = _keys(_SCHEMA, "$defs", "source")


ARCH_KEYS = _keys(_SCHEMA, "$defs", "arch")


BUILD_KEYS = _keys(_SCHEMA, "$defs", "build")


EXT_PARALLEL_KEYS = _keys(_SCHEMA, "$defs", "build", "properties", "ext_parallel")


SMOKE_KEYS = _keys(_SCHEMA, "$defs", "smoke")


SDIST_KEYS = _keys(_SCHEMA, "$defs", "sdist")


VERSION_KEYS = _keys(_SCHEMA, "$defs", "version")


VERSION_RANGE_KEYS = _keys(_SCHEMA, "$defs", "version_range")


PATCH_KEYS = _keys(_SCHEMA, "$defs", "patch")


OBSOLETE_PATCH_KEYS = _keys(_SCHEMA, "$defs", "obsolete_patch")


EXTENSION_KEYS = _keys(_SCHEMA, "$defs", "extension")


RULE_KEYS = _keys(_SCHEMA, "$defs", "rule")


TORCH_FACTS_KEYS = _keys(_SCHEMA, "$defs", "torch_facts")


# The C++ standards a recipe may say a build passes (cxx_std: 17).
CXX_STDS = tuple(_SCHEMA["$defs"]["cxx_std"]["enum"])


def read_recipe_text(path: Path) -> str:
    try:
        return read_inside(path, MAX_RECIPE_BYTES, path.parent)
    except safety.Unreadable as exc:
        raise RecipeError(f"{shown_path(path)}: cannot read: {exc}") from None
