"""One recipe file (YAML) into a Recipe: every value checked, every problem one line that names the
file and the key."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from imagegen import safety, yamlio
from imagegen.errors import ArchError, RecipeError, bounded
from imagegen.model.arch import ArchList
from imagegen.model.arch_parse import parse_arch_list
from imagegen.model.recipe_reader import (
    ARCH_KEYS,
    BUILD_KEYS,
    EXT_PARALLEL_KEYS,
    EXTENSION_KEYS,
    MAX_PATCH_BYTES,
    MAX_RECIPE_BYTES,
    MAX_SCRIPT,
    MAX_TEXT,
    OBSOLETE_PATCH_KEYS,
    RULE_KEYS,
    SDIST_KEYS,
    SMOKE_KEYS,
    SOURCE_KEYS,
    TOP_KEYS,
    VERSION_KEYS,
    VERSION_RANGE_KEYS,
    Reader,
    key_text,
    quoted,
    read_inside,
    read_recipe_text,
    shown_path,
)
from imagegen.model.recipes import (
    ARCH_STYLES,
    PTX_POLICIES,
    RECIPE_SCHEMA,
    RULE_SUBJECTS,
    ArchKnob,
    Patch,
    Recipe,
    RecipeVersion,
    Rule,
    Sdist,
    SmokeTest,
)


def _load_patch(path: str, recipe_dir: Path, entry: Any, where: str) -> Patch:
    r = Reader(path, entry, where, keys=("file", "reason"))
    name = r.str("file", required=True, pattern=safety.RELATIVE_PATH)
    reason = r.str("reason", "", max_len=MAX_TEXT) or ""
    file = recipe_dir / "patches" / name
    try:
        text = read_inside(file, MAX_PATCH_BYTES, recipe_dir)
    except safety.Unreadable as exc:
        raise r.error(f"cannot read patch {shown_path(file)}: {exc}", "file") from None
    return Patch(name=name, text=text, reason=reason)


def _load_knob(r: Reader, base: ArchKnob | None = None) -> ArchKnob:
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


def _single_cc(r: Reader, text: Any, key: str) -> str:
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
        w, g = _single_cc(r, want, key), _single_cc(r, got, key)
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


def _local_source(source: Reader, local: str, recipe_dir: Path) -> Path:
    """A recipe's ``source.path``: a directory inside the recipe's own directory, never elsewhere
    (an absolute path, ``..`` or a symlink out would make a host directory the build context)."""
    if not safety.LOCAL_PATH.fullmatch(local) or local.startswith(("/", "~")) or ".." in Path(local).parts:
        raise source.error(f"{quoted(local)} is not allowed: give a relative path inside the recipe's directory"
                           " (no /, ~ or ..)", "path")
    try:
        root = recipe_dir.resolve()
        resolved = (recipe_dir / local).resolve()
    except (OSError, RuntimeError, ValueError) as exc:
        raise source.error(f"{quoted(local)}: cannot resolve ({exc.__class__.__name__})", "path") from None
    if not resolved.is_relative_to(root):
        raise source.error(f"{quoted(local)} leads outside the recipe's directory (a symlink to elsewhere?)", "path")
    return resolved


def load_recipe_file(path: Path, *, text: str | None = None) -> Recipe:
    """Load and validate one recipe file. Raises RecipeError naming the file, key and problem.

    The file is untrusted input: it is read only if it is a regular file of at most
    MAX_RECIPE_BYTES, YAML aliases and deep nesting are refused before anything walks the document,
    every mapping takes only its own keys, and the recipe reads patches (and names a local source)
    only inside its own directory.
    """
    shown = shown_path(path)
    raw_text = text if text is not None else read_recipe_text(path)
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
    r = Reader(shown, data)
    schema = r.data.get("schema", RECIPE_SCHEMA)
    if isinstance(schema, bool) or schema != RECIPE_SCHEMA:
        raise r.error(f"schema {quoted(schema)} is not supported (this imagegen reads {RECIPE_SCHEMA})", "schema")
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

    by_version = _by_version(r, shown, recipe_dir, arch)
    versions_raw = r.data.get("versions")
    if not isinstance(versions_raw, dict) or not versions_raw:
        raise r.error("expected a mapping of version -> {ref, commit, archs, ...}", "versions")
    versions: dict[str, RecipeVersion] = {}
    for key, entry in versions_raw.items():
        if isinstance(key, float):  # YAML reads 1.10 as the number 1.1: the label would silently change
            raise r.error(f"version label {quoted(key)} is a number in YAML (1.10 would read as 1.1):"
                          " quote it, e.g. \"1.10\"", "versions")
        key = r.scalar_text(key, "versions")
        if not isinstance(key, str) or not safety.VERSION_LABEL.fullmatch(key):
            raise r.error(f"bad version label {quoted(key)}", "versions")
        pin = Reader(shown, entry, f"versions.{key}", keys=VERSION_KEYS)
        source_version = pin.str("source_version", None, pattern=safety.VERSION_LABEL)
        said = _pep440(source_version or key)
        if source_version is not None and said is None:
            raise pin.error(f"{quoted(source_version)} is not a PEP 440 version", "source_version")
        matched = next((i for i, (spec, _) in enumerate(by_version) if said is not None and spec.contains(said, True)),
                       None)
        facts = {k: v for k, v in pin.data.items() if k not in ("ref", "commit", "sdist", "source_version")}
        if matched is not None:
            facts = {**by_version_raw(r)[matched], **facts}
        elif "archs" not in facts:
            ranges = "; ".join(str(spec) for spec, _ in by_version)
            raise pin.error("list the archs this version supports (and its other facts), or add a by_version range"
                            f" that holds {said or quoted(key)}" + (f" (the ranges: {ranges})" if ranges else ""), "archs")
        version = _version_facts(Reader(shown, facts, f"versions.{key}"), shown, recipe_dir, arch, key)
        versions[key] = replace(
            version,
            ref=pin.str("ref", required=url is not None, pattern=safety.GIT_REF) or "",
            commit=pin.str("commit", pattern=safety.GIT_SHA),
            sdist=_sdist(pin),
            source_version=str(said) if said is not None else None,
            rules_from=f"by_version[{matched}] ({by_version[matched][0]})" if matched is not None else "",
        )
    default_version = r.str("default_version", next(iter(versions)))
    if default_version not in versions:
        raise r.error(f"{quoted(default_version)} is not one of the versions", "default_version")

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
        o = Reader(shown, item, f"obsolete_patches[{i}]", keys=OBSOLETE_PATCH_KEYS)
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
        by_version=tuple(by_version),
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


def _pep440(text: str) -> Version | None:
    try:
        return Version(text) if len(text) <= 64 else None
    except InvalidVersion:
        return None


def by_version_raw(r: Reader) -> list[dict]:
    """The facts of each ``by_version`` entry as written (without ``match``), for pins to start from."""
    return [{k: v for k, v in entry.items() if k != "match"} for entry in r.data.get("by_version") or []]


def _by_version(r: Reader, shown: str, recipe_dir: Path, knob: ArchKnob) -> list[tuple[SpecifierSet, RecipeVersion]]:
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
        out.append((spec, _version_facts(facts, shown, recipe_dir, knob, "")))
    return out


def _version_facts(v: Reader, shown: str, recipe_dir: Path, knob: ArchKnob, label: str) -> RecipeVersion:
    """What a version's build does (archs, emits, arch knob, patches, routing, ranges), without its source."""
    emits = _emits(v)
    min_by_arch = {}
    for cc, ver in v.mapping("min_cuda_by_arch", "a mapping of arch -> the first CUDA that builds it").items():
        at = f"min_cuda_by_arch.{key_text(cc)}"
        ver = v.scalar_text(ver, at)
        try:
            if not isinstance(ver, str) or len(ver) > 64:
                raise InvalidVersion(ver)
            min_by_arch[_single_cc(v, cc, at)] = Version(ver)
        except InvalidVersion:
            raise v.error(f"{quoted(ver)} is not a CUDA version", at) from None
    patches = tuple(_load_patch(shown, recipe_dir, p, f"{v.where}.patches[{i}]") for i, p in enumerate(v.list("patches")))
    archs = v.archs("archs")
    if not archs:
        raise v.error("list the archs this version supports", "archs")
    version_knob = _load_knob(v.sub("arch", keys=ARCH_KEYS), knob)
    _check_runs_on(v, version_knob, archs)
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
    )


MAX_SOURCE_FIGURES = 200


def _source_memory(build: Reader) -> dict[str, float]:
    raw = build.mapping("source_memory_gb", "a mapping of source path (its tail) -> GB per nvcc thread")
    if len(raw) > MAX_SOURCE_FIGURES:
        raise build.error(f"at most {MAX_SOURCE_FIGURES} entries", "source_memory_gb")
    figures = build.sub("source_memory_gb")
    out = {}
    for key in raw:
        if not isinstance(key, str) or not safety.RELATIVE_PATH.fullmatch(key):
            raise figures.error(f"{quoted(key)} is not a relative source path like csrc/kernel_bwd.cu", key_text(key))
        out[key] = figures.number(key, 0.0, low=0.01, high=1024)
    return out


def _sdist(v: Reader) -> Sdist | None:
    if v.data.get("sdist") is None:
        return None
    sd = v.sub("sdist", keys=SDIST_KEYS)
    url = sd.str("url", required=True, pattern=safety.SDIST_URL) or ""
    sha256 = sd.str("sha256", required=True, pattern=safety.SHA256_HEX) or ""
    return Sdist(url=url, sha256=sha256)


def _check_runs_on(v: Reader, knob: ArchKnob, archs: ArchList) -> None:
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
        out.append(Rule(subject, spec, why))
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
