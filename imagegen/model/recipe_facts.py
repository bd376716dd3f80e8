"""A recipe's build facts, as the loader reads them: what one version's build does (archs, emits, the
arch knob, patches, per-extension routing, version ranges) and the ``by_version`` ranges that give
those facts to every source whose PEP 440 version they hold. Every value checked, every problem one
line naming the file and the key (imagegen.model.recipe_file loads the whole file)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from imagegen import safety
from imagegen.errors import ArchError
from imagegen.model.arch import ArchList
from imagegen.model.arch_parse import parse_arch_list
from imagegen.model.recipe_reader import (
    ARCH_KEYS,
    CXX_STDS,
    EXTENSION_KEYS,
    MAX_PATCH_BYTES,
    MAX_TEXT,
    RULE_KEYS,
    TORCH_FACTS_KEYS,
    VERSION_RANGE_KEYS,
    Reader,
    key_text,
    quoted,
    read_inside,
    shown_path,
)
from imagegen.model.recipes import ARCH_STYLES, PTX_POLICIES, RULE_SUBJECTS, ArchKnob, Patch, RecipeVersion, Rule, TorchFacts


def version_facts(v: Reader, shown: str, recipe_dir: Path, knob: ArchKnob, label: str) -> RecipeVersion:
    """What a version's build does (archs, emits, arch knob, patches, routing, ranges), without its source."""
    emits = _emits(v)
    min_by_arch = {}
    for cc, ver in v.mapping("min_cuda_by_arch", "a mapping of arch -> the first CUDA that builds it").items():
        at = f"min_cuda_by_arch.{key_text(cc)}"
        ver = v.scalar_text(ver, at)
        try:
            if not isinstance(ver, str) or len(ver) > 64:
                raise InvalidVersion(ver)
            min_by_arch[single_cc(v, cc, at)] = Version(ver)
        except InvalidVersion:
            raise v.error(f"{quoted(ver)} is not a CUDA version", at) from None
    patches = tuple(load_patch(shown, recipe_dir, p, f"{v.where}.patches[{i}]") for i, p in enumerate(v.list("patches")))
    archs = v.archs("archs")
    if not archs:
        raise v.error("list the archs this version supports", "archs")
    version_knob = load_knob(v.sub("arch", keys=ARCH_KEYS), knob)
    _validate_runs_on(v, version_knob, archs)
    return RecipeVersion(
        version=label,
        ref="",
        commit=None,
        archs=archs,
        emits=emits,
        env=v.env("env"),
        patches=patches,
        min_cuda_by_arch=min_by_arch,
        arch=version_knob,
        notes=v.str("notes", "", max_len=MAX_TEXT) or "",
        extensions=_extensions(v),
        requires=_requires(v),
        ext_parallel=v.bool("ext_parallel", True),
        cxx_std=cxx_std(v),
        by_torch=_by_torch(v, shown, recipe_dir),
    )


def cxx_std(v: Reader) -> int | None:
    """``cxx_std: 17``: the standard the package's build hard-codes (None: it lets torch choose)."""
    value = v.data.get("cxx_std")
    if value is None:
        return None
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or value not in CXX_STDS:
        raise v.error(f"{quoted(value)} is not a C++ standard; one of {', '.join(map(str, CXX_STDS))}"
                      " (17 for -std=c++17)", "cxx_std")
    return int(value)


def _by_torch(v: Reader, shown: str, recipe_dir: Path) -> tuple[TorchFacts, ...]:
    """``by_torch: [{match: ">=2.12", patches: [...], env: {...}, cxx_std: 20}]``: facts for the cells
    of those torch releases only."""
    out = []
    for i, entry in enumerate(v.list("by_torch")):
        where = f"{v.where}.by_torch[{i}]" if v.where else f"by_torch[{i}]"
        e = Reader(shown, entry, where, keys=TORCH_FACTS_KEYS)
        spec = _spec(e, e.data.get("match"), "match")
        patches = tuple(load_patch(shown, recipe_dir, p, f"{where}.patches[{j}]") for j, p in enumerate(e.list("patches")))
        facts = TorchFacts(match=Rule("torch", spec, f"by_torch[{i}]"), patches=patches, env=e.env("env"),
                           cxx_std=cxx_std(e), notes=e.str("notes", "", max_len=MAX_TEXT) or "")
        if not (facts.patches or facts.env or facts.cxx_std is not None):
            raise e.error("give what changes for that torch: patches, env or cxx_std")
        out.append(facts)
    return tuple(out)


def _spec(v: Reader, entry: Any, key: str) -> SpecifierSet:
    """A version range such as '>=2.10' or '>=2.8,<2.10' (every clause a real version)."""
    if not isinstance(entry, str) or not entry.strip():
        raise v.error(f"expected a version range such as '>=2.10', got {quoted(entry)}", key)
    try:
        if len(entry) > 200:
            raise InvalidSpecifier(entry)
        spec = SpecifierSet(entry)
        for clause in spec:  # "===foo" parses but compares no version
            Version(clause.version.rstrip(".*"))
    except (InvalidSpecifier, InvalidVersion):
        raise v.error(f"{quoted(entry)} is not a version range such as '>=2.10' or '>=2.8,<2.10'", key) from None
    return spec


def by_version_raw(r: Reader) -> list[dict]:
    """The facts of each ``by_version`` entry as written (without ``match``), for pins to start from."""
    return [{k: v for k, v in entry.items() if k != "match"} for entry in r.data.get("by_version") or []]


def by_version_ranges(r: Reader, shown: str, recipe_dir: Path, knob: ArchKnob) -> list[tuple[SpecifierSet, RecipeVersion]]:
    """``by_version``: build facts by the source's version (PEP 440 ranges, the first match applies), for
    the pinned versions and for any ref, fork or local tree of the package."""
    out = []
    for i, entry in enumerate(r.list("by_version")):
        e = Reader(shown, entry, f"by_version[{i}]", keys=VERSION_RANGE_KEYS)
        text = e.str("match", required=True, max_len=200) or ""
        try:
            spec = SpecifierSet(text)
            for clause in spec:  # "===foo" parses but compares no version
                Version(clause.version.rstrip(".*"))
        except (InvalidSpecifier, InvalidVersion):
            raise e.error(f"{quoted(text)} is not a PEP 440 range such as '>=2.8.0,<2.9'", "match") from None
        if not str(spec):
            raise e.error("give a range such as '>=2.8.0,<2.9'", "match")
        facts = Reader(shown, {k: v for k, v in e.data.items() if k != "match"}, f"by_version[{i}]")
        out.append((spec, version_facts(facts, shown, recipe_dir, knob, "")))
    return out


def pep440(text: str) -> Version | None:
    try:
        return Version(text) if len(text) <= 64 else None
    except InvalidVersion:
        return None


def load_patch(path: str, recipe_dir: Path, entry: Any, where: str) -> Patch:
    r = Reader(path, entry, where, keys=("file", "reason"))
    name = r.str("file", required=True, pattern=safety.RELATIVE_PATH)
    reason = r.str("reason", "", max_len=MAX_TEXT) or ""
    file = recipe_dir / "patches" / name
    try:
        text = read_inside(file, MAX_PATCH_BYTES, recipe_dir)
    except safety.Unreadable as exc:
        raise r.error(f"cannot read patch {shown_path(file)}: {exc}", "file") from None
    return Patch(name=name, text=text, reason=reason)


def load_knob(r: Reader, base: ArchKnob | None = None) -> ArchKnob:
    if base is not None and not r.data:
        return base
    style = r.str("style", base.style if base else None, required=True)
    if style not in ARCH_STYLES:
        raise r.error(f"unknown style {quoted(style)}; one of {', '.join(ARCH_STYLES)}", "style")
    env = r.str("env", base.env if base else None, pattern=safety.ENV_NAME)
    if style != "fixed" and not env:
        raise r.error(f"style {style} needs the variable the package reads", "env")
    ptx = r.str("ptx", base.ptx if base else "honoured")
    if ptx not in PTX_POLICIES:
        raise r.error(f"unknown ptx policy {quoted(ptx)}; one of {', '.join(PTX_POLICIES)}", "ptx")

    def by_nvcc(key: str) -> tuple[tuple[Version, ArchList], ...]:
        raw = r.data.get(key)
        if raw is None:
            return getattr(base, key) if base else ()
        sub = Reader(r.path, raw, f"{r.where}.{key}")
        out: dict[Version, ArchList] = {}
        for since in sub.data:
            text = sub.scalar_text(since, since)
            try:
                if not isinstance(text, str) or len(text) > 64:
                    raise InvalidVersion(text)
                v = Version(text)
            except InvalidVersion:
                raise sub.error(f"{quoted(since)} is not a CUDA version", since) from None
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


def single_cc(r: Reader, text: Any, key: str) -> str:
    text = r.scalar_text(text, key)
    if not isinstance(text, str) or len(text) > 64:
        raise r.error(f"{quoted(text)}: give one plain compute capability such as 8.6", key)
    try:
        parsed = parse_arch_list(text)
    except ArchError as exc:
        raise r.error(str(exc), key) from None
    if len(parsed) != 1 or parsed[0].variant or parsed[0].ptx or not parsed[0].sass:
        raise r.error(f"{quoted(text)}: give one plain compute capability such as 8.6", key)
    return parsed[0].cc


def _runs_on(r: Reader, base: ArchKnob | None) -> tuple[tuple[str, str], ...]:
    raw = r.data.get("runs_on")
    if raw is None:
        return base.runs_on if base else ()
    if not isinstance(raw, dict):
        raise r.error("expected a mapping of requested cc -> the cc compiled for it, e.g. {\"8.6\": \"8.0\"}", "runs_on")
    out = {}
    for want, got in raw.items():
        key = f"runs_on.{key_text(want)}"
        w, g = single_cc(r, want, key), single_cc(r, got, key)
        wm, wn = (int(x) for x in w.split("."))
        gm, gn = (int(x) for x in g.split("."))
        # A cubin runs only on GPUs of its own major with an equal or higher minor.
        if wm != gm or gn >= wn:
            raise r.error(f"an sm_{gm}{gn} cubin does not serve a {w} GPU (same major, lower minor only)", key)
        out[w] = g
    return tuple(sorted(out.items()))


def _parser(r: Reader, base: ArchKnob | None) -> str:
    value = r.str("parser", base.parser if base else "torch")
    if value not in ("torch", "package"):
        raise r.error(f"unknown parser {quoted(value)}; one of torch, package", "parser")
    return value


def _validate_runs_on(v: Reader, knob: ArchKnob, archs: ArchList) -> None:
    if knob.style == "fixed":
        return  # a fixed list serves higher minors by itself (cell_rules.covers)
    supported = {a.cc for a in archs}
    for want, got in knob.runs_on:
        if got not in supported:
            raise v.error(f"{want} runs on {got}, which is not in this version's archs", f"arch.runs_on.{want}")
        if want in supported:
            raise v.error(f"{want} is in this version's archs, so it cannot also run on {got}", f"arch.runs_on.{want}")


def _requires(v: Reader) -> tuple[Rule, ...]:
    """``requires: {torch: ">=2.10", cuda: {spec: ">=12.5", why: "..."}, python: ">=3.10"}``."""
    raw = v.mapping("requires", f"a mapping of {', '.join(RULE_SUBJECTS)} -> a version range such as '>=2.10'")
    out = []
    for subject, entry in raw.items():
        if subject not in RULE_SUBJECTS:
            raise v.error(f"unknown subject {quoted(subject)}; one of {', '.join(RULE_SUBJECTS)}", "requires")
        key = f"requires.{subject}"
        why = ""
        if isinstance(entry, dict):
            e = Reader(v.path, entry, f"{v.where}.{key}", keys=RULE_KEYS)
            why = e.str("why", "", max_len=MAX_TEXT) or ""
            if "\n" in why or len(why) > 200:
                raise e.error("one line of at most 200 characters, please", "why")
            entry = e.data.get("spec")
            key += ".spec"
        out.append(Rule(subject, _spec(v, entry, key), why))
    return tuple(out)


def _extensions(v: Reader) -> dict[str, ArchList]:
    raw = v.mapping("extensions", "a mapping of extension module -> {archs: [...]}")
    out = {}
    for module, entry in raw.items():
        if not isinstance(module, str) or len(module) > 200 or not safety.MODULE_NAME.fullmatch(module):
            raise v.error(f"bad extension module name {quoted(module)}", "extensions")
        e = Reader(v.path, entry, f"{v.where}.extensions.{module}", keys=EXTENSION_KEYS)
        archs = e.archs("archs")
        if not archs:
            raise e.error("list the archs this extension's kernels can target", "archs")
        out[module] = archs
    return out


def _emits(v: Reader) -> dict[str, str]:
    raw = v.mapping("emits", "a mapping of requested arch -> compiled arch")
    out = {}
    for want, got in raw.items():
        at = f"emits.{key_text(want)}"
        want, got = v.scalar_text(want, at), v.scalar_text(got, at)
        if not isinstance(want, str) or not isinstance(got, str) or len(want) > 64 or len(got) > 64:
            raise v.error(f"map one arch to one arch, got {quoted(want)}: {quoted(got)}", at)
        try:
            w = parse_arch_list(want)
            g = parse_arch_list(got)
        except ArchError as exc:
            raise v.error(str(exc), at) from None
        if len(w) != 1 or len(g) != 1:
            raise v.error("map one arch to one arch", at)
        out[next(iter(w)).cc] = str(next(iter(g)))
    return out
