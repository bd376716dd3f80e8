"""The recipe catalogue: how to build one package, as data.

A recipe is a YAML file (one per package) shipped in ``imagegen/resources/recipes/`` or found in a
user's recipe directory. It is loaded into the typed :class:`Recipe` below and validated up front,
so that a broken file fails with ``<file>: <key>: <problem>`` instead of a traceback halfway through
a build. A local project (a directory with setup.py or pyproject.toml) becomes a recipe too, see
:func:`recipe_from_source_tree`.

Every string that later reaches a Dockerfile or a shell is checked here against a strict pattern
(see :mod:`imagegen.safety`); the builder script receives recipe values as JSON, never through a
shell, so a hostile value can at worst fail validation.
"""

from __future__ import annotations

import functools
import math
import os
import re
import stat
import unicodedata
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from imagegen import safety, yamlio
from imagegen.errors import ArchError, ImagegenError, RecipeError, bounded, printable
from imagegen.model.arch import ArchList, parse_arch_list

RECIPE_SCHEMA = 1

# How a package reads its target architectures (the "arch knob").
ARCH_STYLES = ("torch", "numeric", "dotted", "cmake", "gencode", "fixed")
# What a package does with a request for PTX: embeds it for the archs asked ("honoured"), only for
# the newest arch it compiles ("newest"), or never ("none").
PTX_POLICIES = ("honoured", "newest", "none")
# What a version's ``requires`` ranges constrain: the torch release, the cell's nvcc, the Python.
RULE_SUBJECTS = ("torch", "cuda", "python")
# Error messages quote at most this much of a bad value, so they stay one readable line.
_MAX_QUOTED = 60
# Recipe files and their patches are untrusted input: read only regular files, at most this big.
MAX_RECIPE_BYTES = 1 << 20
MAX_PATCH_BYTES = 8 << 20
# The longest string a recipe key takes (free text and the GPU check have their own, larger bounds).
MAX_STR = 1024
MAX_TEXT = 16 * 1024
MAX_SCRIPT = 64 * 1024


def _quoted(value: Any) -> str:
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


def _key_text(key: Any) -> str:
    """A mapping key as part of a key path in a message: bounded and escaped."""
    text = key if isinstance(key, str) else safety.describe(key, 40)
    return printable(bounded(text, 40))


def _shown_path(path: Any) -> str:
    """A file name as messages show it: escaped, and its tail only when it is very long."""
    text = printable(str(path))
    return text if len(text) <= 160 else "..." + text[-157:]


@dataclass(frozen=True)
class Rule:
    """A range one version (or the whole recipe) needs: torch, CUDA (the cell's nvcc) or Python.

    A clause written with two components (``>=2.10``, ``<12.5``) compares the series ``X.Y``, so the
    torch 2.10 series satisfies ``>=2.10`` and torch 2.9.1 does not satisfy ``>2.9``; a clause with
    more components (``>=2.9.1``) or a wildcard compares the exact release.
    """

    subject: str
    spec: SpecifierSet
    # Where the fact comes from ("requirements.txt"), shown in the plan's reason.
    why: str = ""

    def allows(self, series: Version, exact: Version | None = None) -> bool:
        exact = exact or series
        for clause in self.spec:
            wild = clause.version.endswith(".*")
            short = not wild and len(Version(clause.version).release) <= 2
            if not clause.contains(series if short else exact, prereleases=True):
                return False
        return True

    @property
    def text(self) -> str:
        """``>= 2.8, < 2.10``: the spec as a reason shows it."""
        order = {">=": 0, ">": 0, "~=": 0, "==": 1, "===": 1, "!=": 2, "<=": 3, "<": 3}
        clauses = sorted(self.spec, key=lambda c: (order.get(c.operator, 1), Version(c.version.rstrip(".*"))))
        return ", ".join(f"{c.operator} {c.version}" for c in clauses)


@dataclass(frozen=True)
class ArchKnob:
    """The environment variable a package reads its arch list from, and that variable's format."""

    env: str | None
    style: str
    # For style "fixed": what the package always compiles, keyed by the first nvcc that adds it.
    fixed: tuple[tuple[Version, ArchList], ...] = ()
    # Archs dropped from the fixed set from this nvcc on (e.g. Pascal/Volta once CUDA 13 drops them).
    fixed_dropped: tuple[tuple[Version, ArchList], ...] = ()
    ptx: str = "honoured"
    keep_variant: bool = False
    # Who parses a torch-style list: torch's cpp_extension ("torch", which rejects what that torch
    # release does not know) or the package's own setup.py ("package", e.g. SageAttention).
    parser: str = "torch"
    # Requested cc -> the cc the package compiles for it, for knobs that accept only some values of a
    # major and whose lowest cubin serves the rest (FLASH_ATTN_CUDA_ARCHS takes 80 but not 86/89;
    # the sm_80 cubin runs on 8.6/8.7/8.9). Not used by style "fixed", which covers by itself.
    runs_on: tuple[tuple[str, str], ...] = ()

    def compiles_for(self, cc: str) -> str:
        """The cc this knob compiles when asked for ``cc`` (itself unless ``runs_on`` maps it)."""
        return dict(self.runs_on).get(cc, cc)

    def fixed_for(self, cuda: Version) -> ArchList:
        """The archs a fixed-arch package compiles with nvcc ``cuda``."""
        out: list = []
        for since, archs in self.fixed:
            if cuda >= since:
                out.extend(archs)
        dropped = {a.cc for since, archs in self.fixed_dropped if cuda >= since for a in archs}
        return ArchList([a for a in out if a.cc not in dropped])


@dataclass(frozen=True)
class Patch:
    """A patch file shipped with the recipe, applied with ``git apply`` before building."""

    name: str
    text: str
    reason: str


@dataclass(frozen=True)
class Sdist:
    """A version's source distribution on PyPI (or any HTTPS host), pinned by its sha256: a source
    reachable where the git host is not (CI, a mirror of PyPI), selected with ``--fetch sdist``."""

    url: str
    sha256: str

    @property
    def filename(self) -> str:
        return self.url.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class RecipeVersion:
    """One pinned version of a package: the source ref and what that ref supports."""

    version: str
    ref: str
    commit: str | None
    archs: ArchList
    # What the package compiles when asked for an arch, where that differs (9.0 -> 9.0a).
    emits: Mapping[str, str]
    env: Mapping[str, str]
    patches: tuple[Patch, ...]
    min_cuda_by_arch: Mapping[str, Version]
    arch: ArchKnob
    notes: str = ""
    # Extension module -> the archs its kernels can target (SageAttention's _qattn_sm90: 9.0 only,
    # wgmma). The gencode audit refuses a build that compiles a listed extension for any other arch,
    # and does not count a requested arch it lacks as missing. Extensions not listed take any arch.
    extensions: Mapping[str, ArchList] = field(default_factory=dict)
    # Ranges this version needs beyond the recipe's (xformers 0.0.35: torch >= 2.10, CUDA >= 12.5).
    requires: tuple[Rule, ...] = ()
    sdist: Sdist | None = None

    @property
    def pinned_ref(self) -> str:
        """What the build checks out: the full commit when known, else the ref."""
        return self.commit or self.ref


@dataclass(frozen=True)
class SmokeTest:
    """What proves a wheel works: modules to import (CPU), modules that need a driver, a GPU check."""

    imports: tuple[str, ...]
    driver_imports: tuple[str, ...] = ()
    gpu_check: str = ""


@dataclass(frozen=True)
class Recipe:
    name: str
    aliases: tuple[str, ...]
    description: str
    distribution: str
    homepage: str
    source_kind: str  # "git" | "local" | "sdist" (a git recipe asked for with --fetch sdist: see fetched_from)
    source_url: str | None
    source_path: Path | None
    submodules: bool
    subdir: str
    default_version: str
    versions: Mapping[str, RecipeVersion]
    force_env: Mapping[str, str]
    local_version_env: str | None
    jobs_env: str
    threads_env: str | None
    # Packages that compile several extensions at once (SageAttention's EXT_PARALLEL): the variable
    # and the most extensions it builds side by side. imagegen splits one job budget between them.
    ext_parallel_env: str | None
    ext_parallel_max: int
    env: Mapping[str, str]
    build_requires: tuple[str, ...]
    system_requires: tuple[str, ...]
    min_cuda: Version
    min_torch: Version | None
    max_torch: Version | None
    python: SpecifierSet
    memory_per_thread_gb: float
    default_nvcc_threads: int
    links_libcuda: bool
    abi3: bool
    smoke: SmokeTest
    obsolete_patches: tuple[Mapping[str, str], ...]
    path: str  # where the recipe came from, for messages
    # GB per nvcc thread of named sources whose compile takes far more (or less) than
    # memory_per_thread_gb: path tail -> GB (causal-conv1d: csrc/causal_conv1d_bwd.cu).
    source_memory_gb: Mapping[str, float] = field(default_factory=dict)

    @property
    def heaviest_gb_per_thread(self) -> float:
        """The GB per nvcc thread to plan with when it is not known which sources run at once (no
        audit): the heaviest source's figure."""
        return max([self.memory_per_thread_gb, *self.source_memory_gb.values()])

    def rules(self, version: RecipeVersion) -> tuple[Rule, ...]:
        """Every range a cell of ``version`` must fall in: the recipe-wide ones, then the version's."""
        out = []
        if self.min_torch is not None:
            out.append(Rule("torch", SpecifierSet(f">={self.min_torch}"), "build.min_torch"))
        if self.max_torch is not None:
            out.append(Rule("torch", SpecifierSet(f"<={self.max_torch}"), "build.max_torch"))
        out.append(Rule("cuda", SpecifierSet(f">={self.min_cuda}"), "build.min_cuda"))
        if str(self.python):
            out.append(Rule("python", self.python, "build.python"))
        return tuple(out) + tuple(version.requires)

    def version(self, wanted: str | None) -> RecipeVersion:
        key = wanted or self.default_version
        if key not in self.versions:
            known = ", ".join(self.versions)
            raise RecipeError(f"{self.name} has no version {_quoted(key)}; known: {known}")
        return self.versions[key]


FETCH_KINDS = ("git", "sdist")


def fetched_from(recipe: Recipe, version: RecipeVersion, fetch: str | None) -> tuple[Recipe, RecipeVersion]:
    """``recipe`` and ``version`` as the build fetches them: from git (the default), or with
    ``fetch="sdist"`` from the version's pinned source distribution. The sdist carries the same
    recipe knowledge (arch knob, routing, patches, smoke test): the catalogue checks that its files
    are the tagged commit's (docs/recipes.md)."""
    if fetch in (None, "git"):
        return recipe, version
    if fetch != "sdist":
        raise RecipeError(f"--fetch {_quoted(fetch)}: use one of {', '.join(FETCH_KINDS)}")
    if recipe.source_kind == "local":
        raise RecipeError(f"{recipe.name} is a local source tree: --fetch sdist applies to recipes with a git source")
    if version.sdist is None:
        have = [k for k, v in recipe.versions.items() if v.sdist is not None]
        raise RecipeError(f"{recipe.name} {version.version} names no sdist in its recipe ({recipe.path}):"
                          + (f" versions with one: {', '.join(have)}" if have else " fetch it from git (--fetch git)"))
    sdist = version.sdist
    return (replace(recipe, source_kind="sdist", source_url=sdist.url, submodules=False),
            replace(version, ref=sdist.filename, commit=None))


# --------------------------------------------------------------------------------------------
# Loading and validation


class _Reader:
    """Reads one mapping of a recipe file, naming the file and the key path in every error."""

    def __init__(self, path: str, data: Any, where: str = "", *, keys: tuple[str, ...] | None = None) -> None:
        self.path = path
        self.where = where
        if not isinstance(data, dict):
            raise self.error(f"expected a mapping, got {_quoted(data)}")
        self.data = data
        if keys is not None:
            self.only(keys)

    def error(self, problem: str, key: Any = None) -> RecipeError:
        at = ".".join(p for p in (self.where, None if key is None else _key_text(key)) if p)
        return RecipeError(f"{_shown_path(self.path)}: {bounded(at, 120) or '<top>'}: {problem}")

    def only(self, keys: tuple[str, ...]) -> None:
        """Refuse a key this mapping does not take (a typo must not be silently ignored)."""
        for key in self.data:
            if key not in keys:
                known = bounded(", ".join(sorted(keys)), 260)
                raise self.error(f"unknown key (known: {known})", key)

    def sub(self, key: str, required: bool = False, *, keys: tuple[str, ...] | None = None) -> "_Reader":
        value = self.data.get(key)
        if value is None:
            if required:
                raise self.error("missing", key)
            value = {}
        return _Reader(self.path, value, ".".join(p for p in (self.where, key) if p), keys=keys)

    def list(self, key: str) -> list:
        """A list (absent or null: empty)."""
        value = self.data.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.error(f"expected a list, got {_quoted(value)}", key)
        return value

    def mapping(self, key: str, what: str = "a mapping") -> dict:
        """A mapping (absent or null: empty)."""
        value = self.data.get(key)
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.error(f"expected {what}, got {_quoted(value)}", key)
        return value

    def scalar_text(self, value: Any, key: Any) -> Any:
        """A number written where text is expected (a version 1.0, a flag 1) as that text; a
        non-finite or enormous number is refused rather than written as inf/nan/1e+30."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return value
        if isinstance(value, float) and not math.isfinite(value):
            raise self.error(f"expected text, got {_quoted(value)}", key)
        if abs(value) > 10**15:
            raise self.error(f"expected text, got {_quoted(value)} (numbers beyond 10^15 are refused)", key)
        return str(value)

    def str(self, key: str, default: str | None = None, *, required: bool = False,
            pattern: re.Pattern[str] | None = None, max_len: int = MAX_STR) -> str | None:
        value = self.data.get(key, default)
        if value is None:
            if required:
                raise self.error("missing", key)
            return None
        value = self.scalar_text(value, key)
        if not isinstance(value, str):
            raise self.error(f"expected a string, got {_quoted(value)}", key)
        if len(value) > max_len:
            raise self.error(f"{_quoted(value)} is {len(value)} characters long; at most {max_len}", key)
        self.no_hidden(value, key)
        if pattern is not None and not pattern.fullmatch(value):
            raise self.error(f"{_quoted(value)} is not allowed here (must match {pattern.pattern})", key)
        return value

    def no_hidden(self, value: str, key: Any) -> None:
        c = _hidden_character(value)
        if c is not None:
            raise self.error(f"{_quoted(value)} contains the control character {printable(c)}; write plain text", key)

    def bool(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            raise self.error(f"expected true or false, got {_quoted(value)}", key)
        return value

    def number(self, key: str, default: float, *, low: float, high: float, integer: bool = False) -> float:
        """A number in [low, high] (a whole one where ``integer``); NaN, inf and huge are refused."""
        value = self.data.get(key, default)
        what = "a whole number" if integer else "a number"
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or (isinstance(value, float) and not math.isfinite(value))
                or not low <= value <= high or (integer and value != int(value))):
            raise self.error(f"expected {what} from {low:g} to {high:g}, got {_quoted(value)}", key)
        return float(value)

    def str_list(self, key: str, *, pattern: re.Pattern[str] | None = None,
                 max_len: int = MAX_STR) -> tuple[str, ...]:
        value = self.data.get(key) or []
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list):
            raise self.error(f"expected a list, got {_quoted(value)}", key)
        out = []
        for item in value:
            item = self.scalar_text(item, key)
            if not isinstance(item, str):
                raise self.error(f"expected strings, got {_quoted(item)}", key)
            if len(item) > max_len:
                raise self.error(f"{_quoted(item)} is {len(item)} characters long; at most {max_len}", key)
            if pattern is not None and not pattern.fullmatch(item):
                raise self.error(f"{_quoted(item)} is not allowed here (must match {pattern.pattern})", key)
            out.append(item)
        return tuple(out)

    def env(self, key: str) -> dict[str, str]:
        value = self.mapping(key, "a mapping of VARIABLE: value")
        out = {}
        for name, val in value.items():
            if not isinstance(name, str) or not safety.ENV_NAME.fullmatch(name):
                raise self.error(f"bad environment variable name {_quoted(name)}", key)
            if isinstance(val, bool):
                val = "1" if val else "0"
            val = self.scalar_text(val, f"{key}.{name}")
            if not isinstance(val, str) or not safety.ENV_VALUE.fullmatch(val):
                raise self.error(f"bad value {_quoted(val)} for {name} (printable text, no quotes, $ or `)", key)
            out[name] = val
        return out

    def version(self, key: str, default: str | None = None) -> Version | None:
        text = self.str(key, default, max_len=64)
        if text is None:
            return None
        try:
            return Version(text)
        except InvalidVersion:
            raise self.error(f"{_quoted(text)} is not a version", key) from None

    def archs(self, key: str) -> ArchList:
        items = self.str_list(key, max_len=64)
        try:
            return parse_arch_list(list(items)) if items else ArchList([])
        except ArchError as exc:
            raise self.error(str(exc), key) from None


def _read_text(file: Path, limit: int, inside: Path) -> str:
    """A recipe's file as text: a regular UTF-8 file inside the recipe's directory (safety.Unreadable)."""
    data = safety.read_regular_file(file, limit=limit, inside=inside)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise safety.Unreadable(f"not UTF-8 text (byte {exc.start})") from None


def _load_patch(path: str, recipe_dir: Path, entry: Any, where: str) -> Patch:
    r = _Reader(path, entry, where, keys=("file", "reason"))
    name = r.str("file", required=True, pattern=safety.RELATIVE_PATH)
    reason = r.str("reason", "", max_len=MAX_TEXT) or ""
    file = recipe_dir / "patches" / name
    try:
        text = _read_text(file, MAX_PATCH_BYTES, recipe_dir)
    except safety.Unreadable as exc:
        raise r.error(f"cannot read patch {_shown_path(file)}: {exc}", "file") from None
    return Patch(name=name, text=text, reason=reason)


def _load_knob(r: _Reader, base: ArchKnob | None = None) -> ArchKnob:
    if base is not None and not r.data:
        return base
    style = r.str("style", base.style if base else None, required=True)
    if style not in ARCH_STYLES:
        raise r.error(f"unknown style {_quoted(style)}; one of {', '.join(ARCH_STYLES)}", "style")
    env = r.str("env", base.env if base else None, pattern=safety.ENV_NAME)
    if style != "fixed" and not env:
        raise r.error(f"style {style} needs the variable the package reads", "env")
    ptx = r.str("ptx", base.ptx if base else "honoured")
    if ptx not in PTX_POLICIES:
        raise r.error(f"unknown ptx policy {_quoted(ptx)}; one of {', '.join(PTX_POLICIES)}", "ptx")

    def by_nvcc(key: str) -> tuple[tuple[Version, ArchList], ...]:
        raw = r.data.get(key)
        if raw is None:
            return getattr(base, key) if base else ()
        sub = _Reader(r.path, raw, f"{r.where}.{key}")
        out: dict[Version, ArchList] = {}
        for since in sub.data:
            text = sub.scalar_text(since, since)
            try:
                if not isinstance(text, str) or len(text) > 64:
                    raise InvalidVersion(text)
                v = Version(text)
            except InvalidVersion:
                raise sub.error(f"{_quoted(since)} is not a CUDA version", since) from None
            if v in out:
                raise sub.error(f"CUDA {v} is listed twice", since)
            out[v] = sub.archs(since)
        return tuple(sorted(out.items(), key=lambda item: item[0]))

    fixed = by_nvcc("fixed")
    if style == "fixed" and not fixed:
        raise r.error("style fixed needs the `fixed` arch table (nvcc version -> archs)", "fixed")
    return ArchKnob(
        env=env,
        style=style,
        fixed=fixed,
        fixed_dropped=by_nvcc("fixed_dropped"),
        ptx=ptx,
        keep_variant=r.bool("keep_variant", base.keep_variant if base else False),
        parser=_parser(r, base),
        runs_on=_runs_on(r, base),
    )


def _single_cc(r: _Reader, text: Any, key: str) -> str:
    text = r.scalar_text(text, key)
    if not isinstance(text, str) or len(text) > 64:
        raise r.error(f"{_quoted(text)}: give one plain compute capability such as 8.6", key)
    try:
        parsed = parse_arch_list(text)
    except ArchError as exc:
        raise r.error(str(exc), key) from None
    if len(parsed) != 1 or parsed[0].variant or parsed[0].ptx or not parsed[0].sass:
        raise r.error(f"{_quoted(text)}: give one plain compute capability such as 8.6", key)
    return parsed[0].cc


def _runs_on(r: _Reader, base: ArchKnob | None) -> tuple[tuple[str, str], ...]:
    raw = r.data.get("runs_on")
    if raw is None:
        return base.runs_on if base else ()
    if not isinstance(raw, dict):
        raise r.error("expected a mapping of requested cc -> the cc compiled for it, e.g. {\"8.6\": \"8.0\"}", "runs_on")
    out = {}
    for want, got in raw.items():
        key = f"runs_on.{_key_text(want)}"
        w, g = _single_cc(r, want, key), _single_cc(r, got, key)
        wm, wn = (int(x) for x in w.split("."))
        gm, gn = (int(x) for x in g.split("."))
        # A cubin runs only on GPUs of its own major with an equal or higher minor.
        if wm != gm or gn >= wn:
            raise r.error(f"an sm_{gm}{gn} cubin does not serve a {w} GPU (same major, lower minor only)", key)
        out[w] = g
    return tuple(sorted(out.items()))


def _parser(r: _Reader, base: ArchKnob | None) -> str:
    value = r.str("parser", base.parser if base else "torch")
    if value not in ("torch", "package"):
        raise r.error(f"unknown parser {_quoted(value)}; one of torch, package", "parser")
    return value


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
PATCH_KEYS = _keys(_SCHEMA, "$defs", "patch")
OBSOLETE_PATCH_KEYS = _keys(_SCHEMA, "$defs", "obsolete_patch")
EXTENSION_KEYS = _keys(_SCHEMA, "$defs", "extension")
RULE_KEYS = _keys(_SCHEMA, "$defs", "rule")


def _read_recipe_text(path: Path) -> str:
    try:
        return _read_text(path, MAX_RECIPE_BYTES, path.parent)
    except safety.Unreadable as exc:
        raise RecipeError(f"{_shown_path(path)}: cannot read: {exc}") from None


def _local_source(source: _Reader, local: str, recipe_dir: Path) -> Path:
    """A recipe's ``source.path``: a directory inside the recipe's own directory, never elsewhere
    (an absolute path, ``..`` or a symlink out would make a host directory the build context)."""
    if not safety.LOCAL_PATH.fullmatch(local) or local.startswith(("/", "~")) or ".." in Path(local).parts:
        raise source.error(f"{_quoted(local)} is not allowed: give a relative path inside the recipe's directory"
                           " (no /, ~ or ..)", "path")
    try:
        root = recipe_dir.resolve()
        resolved = (recipe_dir / local).resolve()
    except (OSError, RuntimeError, ValueError) as exc:
        raise source.error(f"{_quoted(local)}: cannot resolve ({exc.__class__.__name__})", "path") from None
    if not resolved.is_relative_to(root):
        raise source.error(f"{_quoted(local)} leads outside the recipe's directory (a symlink to elsewhere?)", "path")
    return resolved


def load_recipe_file(path: Path, *, text: str | None = None) -> Recipe:
    """Load and validate one recipe file. Raises RecipeError naming the file, key and problem.

    The file is untrusted input: it is read only if it is a regular file of at most
    MAX_RECIPE_BYTES, YAML aliases and deep nesting are refused before anything walks the document,
    every mapping takes only its own keys, and the recipe reads patches (and names a local source)
    only inside its own directory.
    """
    shown = _shown_path(path)
    raw_text = text if text is not None else _read_recipe_text(path)
    if len(raw_text) > MAX_RECIPE_BYTES:
        raise RecipeError(f"{shown}: cannot read: {len(raw_text)} characters; at most {MAX_RECIPE_BYTES} are read")
    try:
        data = yamlio.load_untrusted(raw_text)
    except yamlio.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "?"
        problem = getattr(exc, "problem", None) or exc.__class__.__name__
        what = "refused" if isinstance(exc, yamlio.UntrustedYAMLError) else "not valid YAML"
        raise RecipeError(f"{shown}: {where}: {what} ({bounded(str(problem), 120)})") from None
    if data is None:
        raise RecipeError(f"{shown}: empty: a recipe is a mapping (schema, name, source, versions, ...)")
    r = _Reader(shown, data)
    schema = r.data.get("schema", RECIPE_SCHEMA)
    if isinstance(schema, bool) or schema != RECIPE_SCHEMA:
        raise r.error(f"schema {_quoted(schema)} is not supported (this imagegen reads {RECIPE_SCHEMA})", "schema")
    r.only(TOP_KEYS)

    name = r.str("name", required=True, pattern=safety.RECIPE_NAME)
    source = r.sub("source", required=True, keys=SOURCE_KEYS)
    url = source.str("git", pattern=safety.GIT_URL)
    local = source.str("path", max_len=400)
    if bool(url) == bool(local):
        raise source.error("give exactly one of git (a URL) or path (a local directory)")
    recipe_dir = path.parent
    source_path = _local_source(source, local, recipe_dir) if local else None

    arch = _load_knob(r.sub("arch", required=True, keys=ARCH_KEYS))
    build = r.sub("build", keys=BUILD_KEYS)
    smoke_r = r.sub("smoke", required=True, keys=SMOKE_KEYS)
    smoke = SmokeTest(
        imports=smoke_r.str_list("imports", pattern=safety.MODULE_NAME),
        driver_imports=smoke_r.str_list("driver_imports", pattern=safety.MODULE_NAME),
        gpu_check=smoke_r.str("gpu_check", "", max_len=MAX_SCRIPT) or "",
    )
    if not smoke.imports:
        raise smoke_r.error("list at least one module to import", "imports")

    versions_raw = r.data.get("versions")
    if not isinstance(versions_raw, dict) or not versions_raw:
        raise r.error("expected a mapping of version -> {ref, commit, archs, ...}", "versions")
    versions: dict[str, RecipeVersion] = {}
    for key, entry in versions_raw.items():
        if isinstance(key, float):  # YAML reads 1.10 as the number 1.1: the label would silently change
            raise r.error(f"version label {_quoted(key)} is a number in YAML (1.10 would read as 1.1):"
                          " quote it, e.g. \"1.10\"", "versions")
        key = r.scalar_text(key, "versions")
        if not isinstance(key, str) or not safety.VERSION_LABEL.fullmatch(key):
            raise r.error(f"bad version label {_quoted(key)}", "versions")
        v = _Reader(shown, entry, f"versions.{key}", keys=VERSION_KEYS)
        emits = _emits(v)
        min_by_arch = {}
        for cc, ver in v.mapping("min_cuda_by_arch", "a mapping of arch -> the first CUDA that builds it").items():
            at = f"min_cuda_by_arch.{_key_text(cc)}"
            ver = v.scalar_text(ver, at)
            try:
                if not isinstance(ver, str) or len(ver) > 64:
                    raise InvalidVersion(ver)
                min_by_arch[_single_cc(v, cc, at)] = Version(ver)
            except InvalidVersion:
                raise v.error(f"{_quoted(ver)} is not a CUDA version", at) from None
        patches = tuple(
            _load_patch(shown, recipe_dir, p, f"versions.{key}.patches[{i}]")
            for i, p in enumerate(v.list("patches"))
        )
        archs = v.archs("archs")
        if not archs:
            raise v.error("list the archs this version supports", "archs")
        knob = _load_knob(v.sub("arch", keys=ARCH_KEYS), arch)
        _check_runs_on(v, knob, archs)
        versions[key] = RecipeVersion(
            version=key,
            ref=v.str("ref", required=url is not None, pattern=safety.GIT_REF) or "",
            commit=v.str("commit", pattern=safety.GIT_SHA),
            archs=archs,
            emits=emits,
            env=v.env("env"),
            patches=patches,
            min_cuda_by_arch=min_by_arch,
            arch=knob,
            notes=v.str("notes", "", max_len=MAX_TEXT) or "",
            extensions=_extensions(v),
            requires=_requires(v),
            sdist=_sdist(v),
        )
    default_version = r.str("default_version", next(iter(versions)))
    if default_version not in versions:
        raise r.error(f"{_quoted(default_version)} is not one of the versions", "default_version")

    try:
        python = SpecifierSet(build.str("python", ">=3.9") or "")
    except InvalidSpecifier:
        raise build.error("not a version specifier like '>=3.9'", "python") from None
    threads_env = build.str("threads_env", None, pattern=safety.ENV_NAME)
    ext_parallel = build.sub("ext_parallel", keys=EXT_PARALLEL_KEYS)
    ext_parallel_env = ext_parallel.str("env", None, pattern=safety.ENV_NAME)
    ext_parallel_max = int(ext_parallel.number("max", 1, low=1, high=64, integer=True))
    obsolete = []
    for i, item in enumerate(r.list("obsolete_patches")):
        o = _Reader(shown, item, f"obsolete_patches[{i}]", keys=OBSOLETE_PATCH_KEYS)
        obsolete.append({"name": o.str("name", required=True, max_len=MAX_TEXT) or "",
                         "reason": o.str("reason", required=True, max_len=MAX_TEXT) or ""})

    return Recipe(
        name=name,
        aliases=r.str_list("aliases", pattern=safety.RECIPE_NAME),
        description=r.str("description", "", max_len=MAX_TEXT) or "",
        distribution=r.str("distribution", name, pattern=safety.DIST_NAME) or name,
        homepage=r.str("homepage", url or "", pattern=safety.URL_OR_EMPTY) or "",
        source_kind="git" if url else "local",
        source_url=url,
        source_path=source_path,
        submodules=source.bool("submodules", False),
        subdir=source.str("subdir", "", pattern=safety.RELATIVE_PATH_OR_EMPTY) or "",
        default_version=default_version,
        versions=versions,
        force_env=build.env("force_env"),
        local_version_env=build.str("local_version_env", None, pattern=safety.ENV_NAME),
        jobs_env=build.str("jobs_env", "MAX_JOBS", pattern=safety.ENV_NAME) or "MAX_JOBS",
        threads_env=threads_env,
        ext_parallel_env=ext_parallel_env,
        ext_parallel_max=ext_parallel_max if ext_parallel_env else 1,
        env=build.env("env"),
        build_requires=build.str_list("requires", pattern=safety.PIP_REQUIREMENT),
        system_requires=build.str_list("system_requires", pattern=safety.SYSTEM_PACKAGE),
        min_cuda=build.version("min_cuda", "11.8") or Version("11.8"),
        min_torch=build.version("min_torch"),
        max_torch=build.version("max_torch"),
        python=python,
        memory_per_thread_gb=build.number("memory_per_thread_gb", 2.0, low=0.05, high=1024),
        default_nvcc_threads=int(build.number("default_nvcc_threads", 4, low=1, high=256, integer=True)),
        links_libcuda=build.bool("links_libcuda", False),
        abi3=build.bool("abi3", False),
        smoke=smoke,
        obsolete_patches=tuple(obsolete),
        path=shown,
        source_memory_gb=_source_memory(build),
    )


MAX_SOURCE_FIGURES = 200


def _source_memory(build: _Reader) -> dict[str, float]:
    raw = build.mapping("source_memory_gb", "a mapping of source path (its tail) -> GB per nvcc thread")
    if len(raw) > MAX_SOURCE_FIGURES:
        raise build.error(f"at most {MAX_SOURCE_FIGURES} entries", "source_memory_gb")
    figures = build.sub("source_memory_gb")
    out = {}
    for key in raw:
        if not isinstance(key, str) or not safety.RELATIVE_PATH.fullmatch(key):
            raise figures.error(f"{_quoted(key)} is not a relative source path like csrc/kernel_bwd.cu", _key_text(key))
        out[key] = figures.number(key, 0.0, low=0.01, high=1024)
    return out


def _sdist(v: _Reader) -> Sdist | None:
    if v.data.get("sdist") is None:
        return None
    sd = v.sub("sdist", keys=SDIST_KEYS)
    url = sd.str("url", required=True, pattern=safety.SDIST_URL) or ""
    sha256 = sd.str("sha256", required=True, pattern=safety.SHA256_HEX) or ""
    return Sdist(url=url, sha256=sha256)


def _check_runs_on(v: _Reader, knob: ArchKnob, archs: ArchList) -> None:
    if knob.style == "fixed":
        return  # a fixed list serves higher minors by itself (plan.covers)
    supported = {a.cc for a in archs}
    for want, got in knob.runs_on:
        if got not in supported:
            raise v.error(f"{want} runs on {got}, which is not in this version's archs", f"arch.runs_on.{want}")
        if want in supported:
            raise v.error(f"{want} is in this version's archs, so it cannot also run on {got}", f"arch.runs_on.{want}")


def _requires(v: _Reader) -> tuple[Rule, ...]:
    """``requires: {torch: ">=2.10", cuda: {spec: ">=12.5", why: "..."}, python: ">=3.10"}``."""
    raw = v.mapping("requires", f"a mapping of {', '.join(RULE_SUBJECTS)} -> a version range such as '>=2.10'")
    out = []
    for subject, entry in raw.items():
        if subject not in RULE_SUBJECTS:
            raise v.error(f"unknown subject {_quoted(subject)}; one of {', '.join(RULE_SUBJECTS)}", "requires")
        key = f"requires.{subject}"
        why = ""
        if isinstance(entry, dict):
            e = _Reader(v.path, entry, f"{v.where}.{key}", keys=RULE_KEYS)
            why = e.str("why", "", max_len=MAX_TEXT) or ""
            if "\n" in why or len(why) > 200:
                raise e.error("one line of at most 200 characters, please", "why")
            entry = e.data.get("spec")
            key += ".spec"
        if not isinstance(entry, str) or not entry.strip():
            raise v.error(f"expected a version range such as '>=2.10', got {_quoted(entry)}", key)
        try:
            if len(entry) > 200:
                raise InvalidSpecifier(entry)
            spec = SpecifierSet(entry)
            for clause in spec:  # "===foo" parses but compares no version
                Version(clause.version.rstrip(".*"))
        except (InvalidSpecifier, InvalidVersion):
            raise v.error(f"{_quoted(entry)} is not a version range such as '>=2.10' or '>=2.8,<2.10'", key) from None
        out.append(Rule(subject, spec, why))
    return tuple(out)


def _extensions(v: _Reader) -> dict[str, ArchList]:
    raw = v.mapping("extensions", "a mapping of extension module -> {archs: [...]}")
    out = {}
    for module, entry in raw.items():
        if not isinstance(module, str) or len(module) > 200 or not safety.MODULE_NAME.fullmatch(module):
            raise v.error(f"bad extension module name {_quoted(module)}", "extensions")
        e = _Reader(v.path, entry, f"{v.where}.extensions.{module}", keys=EXTENSION_KEYS)
        archs = e.archs("archs")
        if not archs:
            raise e.error("list the archs this extension's kernels can target", "archs")
        out[module] = archs
    return out


def _emits(v: _Reader) -> dict[str, str]:
    raw = v.mapping("emits", "a mapping of requested arch -> compiled arch")
    out = {}
    for want, got in raw.items():
        at = f"emits.{_key_text(want)}"
        want, got = v.scalar_text(want, at), v.scalar_text(got, at)
        if not isinstance(want, str) or not isinstance(got, str) or len(want) > 64 or len(got) > 64:
            raise v.error(f"map one arch to one arch, got {_quoted(want)}: {_quoted(got)}", at)
        try:
            w = parse_arch_list(want)
            g = parse_arch_list(got)
        except ArchError as exc:
            raise v.error(str(exc), at) from None
        if len(w) != 1 or len(g) != 1:
            raise v.error("map one arch to one arch", at)
        out[next(iter(w)).cc] = str(next(iter(g)))
    return out


# --------------------------------------------------------------------------------------------
# The catalogue


def builtin_recipe_dir() -> Path:
    return Path(str(resources.files("imagegen") / "resources" / "recipes"))


@dataclass
class Catalogue:
    """All recipes known to this run: the built-in ones plus the user's directories."""

    recipes: dict[str, Recipe] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)

    def add(self, recipe: Recipe) -> None:
        # A user recipe with a built-in's name replaces it (that is how users patch a recipe).
        self.recipes[recipe.name] = recipe
        for alias in recipe.aliases:
            self.aliases[alias] = recipe.name

    def names(self) -> list[str]:
        return sorted(self.recipes)

    def get(self, name: str) -> Recipe:
        key = name.strip().lower().replace("_", "-")
        key = self.aliases.get(key, key)
        if key in self.recipes:
            return self.recipes[key]
        names = self.names()
        known = ", ".join(names[:20]) + (f" and {len(names) - 20} more (imagegen recipes lists them)" if len(names) > 20 else "")
        raise RecipeError(
            f"unknown recipe {_quoted(name)}: known recipes are {known}"
            " (or give a path to a local project, or add a recipe directory with --recipe-dir)"
        )


def load_catalogue(extra_dirs: tuple[Path, ...] = ()) -> Catalogue:
    cat = Catalogue()
    for recipe in _builtin_recipes():
        cat.add(recipe)
    for d in extra_dirs:
        for path in _recipe_files(d):
            cat.add(load_recipe_file(path))
    return cat


def _recipe_files(d: Path) -> list[Path]:
    """The ``*.yaml`` / ``*.yml`` files of a recipe directory; any problem with the directory itself
    (missing, not a directory, unreadable, a name the OS refuses) is a one-line RecipeError."""
    shown = _shown_path(d)
    try:
        st = d.stat()
        if not stat.S_ISDIR(st.st_mode):
            raise RecipeError(f"recipe directory {shown} is not a directory")
        names = sorted(os.listdir(d))
    except FileNotFoundError:
        raise RecipeError(f"recipe directory {shown} does not exist") from None
    except (OSError, ValueError) as exc:
        reason = safety.os_reason(exc) if isinstance(exc, OSError) else "not a usable path"
        raise RecipeError(f"recipe directory {shown}: {reason}") from None
    return [d / n for n in names if n.endswith(".yaml")] + [d / n for n in names if n.endswith(".yml")]


@functools.cache
def _builtin_recipes() -> tuple[Recipe, ...]:
    return tuple(load_recipe_file(p) for p in sorted(builtin_recipe_dir().glob("*.yaml")))


# --------------------------------------------------------------------------------------------
# A local project as a recipe (seed 003: a setup.py/pyproject project with its own kernels)


def looks_like_path(text: str) -> bool:
    if text.startswith((".", "/", "~")) or "/" in text:
        return True
    try:
        return Path(text).is_dir()
    except (OSError, ValueError):  # a NUL byte or an over-long name: not a path we can use
        return False


def recipe_from_source_tree(path: Path, *, archs_hint: ArchList | None = None) -> Recipe:
    """Treat a local setup.py / pyproject.toml project as a recipe.

    The project is sent to the build as the named context ``source``; its arch knob is
    TORCH_CUDA_ARCH_LIST (what torch's BuildExtension reads) unless the project passes its own
    -gencode flags, in which case verification tells the user what really got compiled.
    """
    try:
        root = path.expanduser().resolve()
        is_dir = root.is_dir()
    except (OSError, ValueError, RuntimeError):
        is_dir = False
        root = path
    if not is_dir:
        raise RecipeError(f"{path}: not a directory; give the root of a project with setup.py or pyproject.toml")
    if not (root / "setup.py").is_file() and not (root / "pyproject.toml").is_file():
        raise RecipeError(f"{path}: no setup.py or pyproject.toml here; is this the project root?")
    name, version = _project_name_version(root)
    safe_name = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-") or "local-project"
    if not safety.RECIPE_NAME.fullmatch(safe_name):
        safe_name = "local-project"
    modules = tuple(m for m in _top_level_modules(root) if safety.MODULE_NAME.fullmatch(m)) or (
        safe_name.replace("-", "_"),
    )
    from imagegen.model.arch import known_ccs  # every cc the arch table knows; nvcc rules prune it

    all_archs = parse_arch_list(list(known_ccs()))
    knob = ArchKnob(env="TORCH_CUDA_ARCH_LIST", style="torch", ptx="honoured")
    rv = RecipeVersion(
        version=version, ref="", commit=None, archs=all_archs, emits={}, env={}, patches=(),
        min_cuda_by_arch={}, arch=knob, notes="local source tree",
    )
    return Recipe(
        name=safe_name, aliases=(), description=f"local project at {root}",
        distribution=re.sub(r"[-_.]+", "_", safe_name),
        homepage="", source_kind="local", source_url=None, source_path=root, submodules=False,
        subdir="", default_version=version, versions={version: rv}, force_env={},
        local_version_env=None, jobs_env="MAX_JOBS", threads_env=None,
        ext_parallel_env=None, ext_parallel_max=1, env={},
        build_requires=("setuptools", "wheel", "ninja", "packaging"), system_requires=(),
        min_cuda=Version("11.8"), min_torch=None, max_torch=None, python=SpecifierSet(">=3.9"),
        memory_per_thread_gb=2.0, default_nvcc_threads=4, links_libcuda=False, abi3=False,
        smoke=SmokeTest(imports=modules), obsolete_patches=(), path=str(root),
    )


def _project_name_version(root: Path) -> tuple[str, str]:
    from imagegen.config import read_toml  # local import keeps tomllib optional here

    name, version = root.name, "0.0.0"
    pyproject = root / "pyproject.toml"
    if pyproject.is_file():
        try:
            project = read_toml(pyproject, inside=root).get("project", {})
        except ImagegenError:
            project = {}
        if not isinstance(project, dict):  # `project = 5`: not PEP 621 metadata
            project = {}
        name = str(project.get("name") or name)
        version = str(project.get("version") or version)
    setup = root / "setup.py"
    if setup.is_file():
        try:  # a regular file of this tree only (not a FIFO, nor a symlink to elsewhere)
            text = safety.read_regular_file(setup, limit=MAX_PATCH_BYTES, inside=root).decode("utf-8", "replace")
        except safety.Unreadable:
            text = ""
        m = re.search(r"""name\s*=\s*["']([A-Za-z0-9_.\-]+)["']""", text)
        if m and name == root.name:
            name = m.group(1)
        m = re.search(r"""version\s*=\s*["']([0-9][A-Za-z0-9_.+\-]*)["']""", text)
        if m and version == "0.0.0":
            version = m.group(1)
    try:
        version = str(Version(version))
    except InvalidVersion:
        version = "0.0.0"
    return name, version


def _top_level_modules(root: Path) -> list[str]:
    found = []
    for base in (root, root / "src"):
        if not base.is_dir():
            continue
        for child in sorted(base.iterdir()):
            if child.is_dir() and (child / "__init__.py").is_file() and child.name not in ("tests", "test"):
                found.append(child.name)
    return found
