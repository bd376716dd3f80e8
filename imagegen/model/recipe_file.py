"""One recipe file (YAML) into a Recipe: every value checked, every problem one line that names the
file and the key."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

from imagegen import safety, yamlio
from imagegen.errors import RecipeError, bounded
from imagegen.model.recipe_facts import by_version_ranges, by_version_raw, load_knob, pep440, version_facts
from imagegen.model.recipe_reader import (
    ARCH_KEYS,
    BUILD_KEYS,
    EXT_PARALLEL_KEYS,
    MAX_RECIPE_BYTES,
    MAX_SCRIPT,
    MAX_TEXT,
    OBSOLETE_PATCH_KEYS,
    SDIST_KEYS,
    SMOKE_KEYS,
    SOURCE_KEYS,
    TOP_KEYS,
    VERSION_KEYS,
    Reader,
    key_text,
    quoted,
    read_recipe_text,
    shown_path,
)
from imagegen.model.recipes import RECIPE_SCHEMA, CpuHours, MemoryWhenEnv, Recipe, RecipeVersion, Sdist, SmokeTest, ranges_text


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

    name = r.str("name", required=True, pattern=safety.RECIPE_NAME, numbers=False)
    source = r.sub("source", required=True, keys=SOURCE_KEYS)
    url = source.str("git", pattern=safety.GIT_URL)  # with a credential, refused by Reader.str as any text is
    local = source.str("path", max_len=400)
    if bool(url) == bool(local):
        raise source.error("give exactly one of git (a URL) or path (a local directory)")
    recipe_dir = path.parent
    source_path = _local_source(source, local, recipe_dir) if local else None

    arch = load_knob(r.sub("arch", required=True, keys=ARCH_KEYS))
    build = r.sub("build", keys=BUILD_KEYS)
    smoke_r = r.sub("smoke", required=True, keys=SMOKE_KEYS)
    smoke = SmokeTest(
        imports=smoke_r.str_list("imports", pattern=safety.MODULE_NAME),
        driver_imports=smoke_r.str_list("driver_imports", pattern=safety.MODULE_NAME),
        gpu_check=smoke_r.str("gpu_check", "", max_len=MAX_SCRIPT) or "",
        check_requires=smoke_r.str_list("check_requires", pattern=safety.PIP_REQUIREMENT),
    )
    if not smoke.imports:
        raise smoke_r.error("list at least one module to import", "imports")

    by_version = by_version_ranges(r, shown, recipe_dir, arch)
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
        said = pep440(source_version or key)
        if source_version is not None and said is None:
            raise pin.error(f"{quoted(source_version)} is not a PEP 440 version", "source_version")
        matched = next((i for i, (spec, _) in enumerate(by_version) if said is not None and spec.contains(said, True)),
                       None)
        facts = {k: v for k, v in pin.data.items() if k not in ("ref", "commit", "sdist", "source_version")}
        if matched is not None:
            facts = {**by_version_raw(r)[matched], **facts}
        elif "archs" not in facts:
            ranges = ranges_text(by_version)
            raise pin.error("list the archs this version supports (and its other facts), or add a by_version range"
                            f" that holds {said or quoted(key)}" + (f" (the ranges: {ranges})" if ranges else ""), "archs")
        version = version_facts(Reader(shown, facts, f"versions.{key}"), shown, recipe_dir, arch, key)
        versions[key] = replace(
            version,
            # A version that only PyPI has (its tag is not in the git mirror) is pinned by its sdist alone.
            ref=pin.str("ref", required=url is not None and pin.data.get("sdist") is None, pattern=safety.GIT_REF) or "",
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
        nvcc_host_gb=build.number("nvcc_host_gb", 1.0, low=0.05, high=64),
        memory_when_env=_memory_when_env(build),
        cpu_hours=_cpu_hours(build),
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
            raise figures.error(f"{quoted(key)} is not a relative source path like csrc/kernel_bwd.cu"
                                " (or a folder like third_party/hopper/)", key_text(key))
        out[key] = figures.number(key, 0.0, low=0.01, high=1024)
    return out


MAX_MEMORY_WHEN_ENV = 16


def _cpu_hours(build: Reader) -> CpuHours | None:
    """build.cpu_hours: a measured whole build (hours of CPU, its -gencode outputs, what was measured)."""
    if build.data.get("cpu_hours") is None:
        return None
    cost = build.sub("cpu_hours", keys=("hours", "wall_hours", "gencode_targets", "measured"))
    measured = cost.str("measured", required=True, max_len=300) or ""
    wall = cost.number("wall_hours", 0.0, low=0.001, high=10000) if cost.data.get("wall_hours") is not None else None
    return CpuHours(hours=cost.number("hours", 0.0, low=0.001, high=10000),
                    gencode_targets=int(cost.number("gencode_targets", 1, low=1, high=64, integer=True)),
                    measured=measured, wall_hours=wall)


def _memory_when_env(build: Reader) -> tuple[MemoryWhenEnv, ...]:
    """build.memory_when_env: a figure per nvcc thread for builds that set every variable of ``env``
    (a package's own knobs given with --env that make each kernel file lighter)."""
    entries = build.list("memory_when_env")
    if len(entries) > MAX_MEMORY_WHEN_ENV:
        raise build.error(f"at most {MAX_MEMORY_WHEN_ENV} entries", "memory_when_env")
    out = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise build.error(f"entry {i}: expected a mapping with env and memory_per_thread_gb", "memory_when_env")
        item = Reader(build.path, entry, f"{build.where}.memory_when_env[{i}]",
                      keys=("env", "memory_per_thread_gb"))
        env = item.env("env")
        if not env:
            raise item.error("name at least one variable (NAME: value) the figure is for", "env")
        out.append(MemoryWhenEnv(env=env, memory_per_thread_gb=item.number(
            "memory_per_thread_gb", 0.0, low=0.05, high=1024)))
    return tuple(out)


def _sdist(v: Reader) -> Sdist | None:
    if v.data.get("sdist") is None:
        return None
    sd = v.sub("sdist", keys=SDIST_KEYS)
    url = sd.str("url", required=True, pattern=safety.SDIST_URL) or ""
    sha256 = sd.str("sha256", required=True, pattern=safety.SHA256_HEX) or ""
    return Sdist(url=url, sha256=sha256)

