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

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from imagegen.errors import RecipeError
from imagegen.model.arch import ArchList
from imagegen.model.recipe_reader import quoted

RECIPE_SCHEMA = 1

# How a package reads its target architectures (the "arch knob").
ARCH_STYLES = ("torch", "numeric", "dotted", "cmake", "gencode", "fixed")
# What a package does with a request for PTX: embeds it for the archs asked ("honoured"), only for
# the newest arch it compiles ("newest"), or never ("none").
PTX_POLICIES = ("honoured", "newest", "none")
# What a version's ``requires`` ranges constrain: the torch release, the cell's nvcc, the Python.
RULE_SUBJECTS = ("torch", "cuda", "python")


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
class TorchFacts:
    """A version's facts for the cells of some torch releases (``by_torch``): the patches, variables
    and C++ standard a build needs there and nowhere else (flash-attn 2.8.3 hard-codes -std=c++17,
    which torch 2.14's headers refuse: its C++20 patch applies from torch 2.12 on)."""

    match: Rule  # subject "torch"
    patches: tuple[Patch, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cxx_std: int | None = None
    notes: str = ""


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
class BuildFlags:
    """The nvcc targets and C++ standard a tree's setup.py states as string constants, read with ast, never
    run (source_tree.build_flags): what a plan can say of the tree before an audit (a list computed at build
    time, or chosen by an ``if``, is not known here; the gencode audit runs the build and knows)."""

    gencode: tuple[str, ...] = ()  # sm_80, compute_90: every code= target named, in order, once
    cxx_std: tuple[int, ...] = ()  # 17 for -std=c++17

    def said(self) -> str:
        """What its setup.py names, for a plan's note ("" where it names neither)."""
        parts = ([f"-gencode {', '.join(self.gencode)}"] if self.gencode else []) + [
            f"-std=c++{n}" for n in self.cxx_std]
        return " and ".join(parts)


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
    # False where this version predates the recipe's ext_parallel variable (extensions built one after
    # another): the variable is not set and MAX_JOBS not divided by it (Recipe.ext_parallel_for).
    ext_parallel: bool = True
    sdist: Sdist | None = None
    # The version the source says it is (PEP 440), where known: the label, or the entry's
    # source_version (main -> 2.8.4.dev0); the recipe's by_version ranges are matched against it.
    source_version: str | None = None
    # Which by_version range gave this version its facts ("" where the entry gives them itself).
    rules_from: str = ""
    # For a --ref/--git/--src-dir source: what it resolved to and which rules apply (the plan says it).
    resolved: str = ""
    # The C++ standard the package's build passes itself (17 for a setup.py with -std=c++17); None
    # where it lets torch choose. The plan refuses a cell whose torch needs a newer one.
    cxx_std: int | None = None
    # Facts for the cells of some torch releases, the first whose range holds the cell's torch
    # applies (for_torch); a cell's own version has them applied and this empty.
    by_torch: tuple[TorchFacts, ...] = ()
    # Which by_torch entry a cell's version took its facts from ("" where none applies).
    torch_rules: str = ""
    # Where these facts are not the source's own but assumed for a tree nobody checked (a local project, a
    # fork, a changed checkout): what the plan says of it until `plan --audit` reads what it compiles.
    unchecked: str = ""
    # What such a tree's setup.py states as string constants (source_tree.build_flags): the plan judges
    # them against each cell (a -std below its torch's, a -gencode its nvcc dropped or the list leaves out).
    stated: BuildFlags | None = None

    @property
    def pinned_ref(self) -> str:
        """What the build checks out: the full commit when known, else the ref."""
        return self.commit or self.ref

    def for_torch(self, series: Version, exact: Version | None = None) -> "RecipeVersion":
        """This version as a cell of torch ``series`` (``exact``: the release) builds it: the first
        ``by_torch`` entry that holds it adds its patches (after the version's own) and variables and
        sets the standard; no entry holding it leaves the version exactly as it is, so the cells of
        other torch releases keep their build (and inputs hash). Applied once: the result has no
        by_torch left."""
        for i, facts in enumerate(self.by_torch):
            if facts.match.allows(series, exact):
                return replace(self, patches=self.patches + facts.patches, env={**self.env, **facts.env},
                               cxx_std=self.cxx_std if facts.cxx_std is None else facts.cxx_std,
                               by_torch=(), torch_rules=f"by_torch[{i}] (torch {facts.match.text})")
        return self


@dataclass(frozen=True)
class SmokeTest:
    """What proves a wheel works: modules to import (CPU), modules that need a driver, a GPU check."""

    imports: tuple[str, ...]
    driver_imports: tuple[str, ...] = ()
    gpu_check: str = ""
    # What the GPU check imports beyond torch and the wheel (the wheel is installed alone, --no-deps):
    # mamba-ssm's interface imports einops. Installed before the check, torch pinned.
    check_requires: tuple[str, ...] = ()


@dataclass(frozen=True)
class MemoryWhenEnv:
    """A figure per nvcc thread for a build that sets every variable of ``env`` to its value: a package's
    own knobs (given with --env) that make each kernel file lighter (flash-attn-3's
    FLASH_ATTENTION_DISABLE_VARLEN and its kin turn paths off inside every file)."""
    env: Mapping[str, str]
    memory_per_thread_gb: float

    def holds_for(self, env: Mapping[str, str]) -> bool:
        return all(env.get(name) == value for name, value in self.env.items())


@dataclass(frozen=True)
class CpuHours:
    """A whole build of the package that was measured: its CPU time (user + system of the build and every
    compiler it ran), the -gencode outputs it compiled, and where and on what (a version, an arch list, a
    host, the record's folder)."""
    hours: float
    gencode_targets: int
    measured: str
    # Its wall time on the measured host (all of its cores free): the least a runner can take, whatever its
    # cores (a build whose one big file compiles alone is as slow on 4 cores as on 16). None: not recorded.
    wall_hours: float | None = None


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
    # Build facts by the source's version: (PEP 440 range, facts), the first match applies.
    by_version: tuple[tuple[SpecifierSet, RecipeVersion], ...]
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
    # memory_per_thread_gb: path tail -> GB (causal-conv1d: csrc/causal_conv1d_bwd.cu), or a folder
    # (a key ending in /) -> GB for every source under it.
    source_memory_gb: Mapping[str, float] = field(default_factory=dict)
    # Each nvcc's host part (nvcc, cudafe++, the host compiler on torch's headers), GB: the model's
    # 1.0 unless the recipe measured another (xformers 0.0.35 on torch's stable headers: 0.25).
    nvcc_host_gb: float = 1.0
    # Figures for builds with some of the package's own knobs set (the first that holds wins);
    # with_memory_for resolves it once, when the user's --env is known.
    memory_when_env: tuple[MemoryWhenEnv, ...] = ()
    # The CPU time of one whole build that was measured, to size a farm's runners (imagegen.model.build_cost).
    cpu_hours: CpuHours | None = None

    @property
    def heaviest_gb_per_thread(self) -> float:
        """The GB per nvcc thread to plan with when it is not known which sources run at once (no
        audit): the heaviest source's figure."""
        return max([self.memory_per_thread_gb, *self.source_memory_gb.values()])

    def ext_parallel_for(self, version: RecipeVersion) -> tuple[str | None, int]:
        """The variable that builds several extensions side by side and its most, for ``version``:
        (None, 1) where the recipe has none or the version predates it (ext_parallel: false)."""
        if self.ext_parallel_env and version.ext_parallel:
            return self.ext_parallel_env, self.ext_parallel_max
        return None, 1

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

    def facts_for(self, source_version: str) -> RecipeVersion | None:
        """The build facts for a source that says it is ``source_version`` (a ref, fork or local tree
        the catalogue does not pin): the first ``by_version`` range that holds it, else None."""
        try:
            said = Version(source_version)
        except InvalidVersion:
            return None
        for i, (spec, facts) in enumerate(self.by_version):
            if spec.contains(said, prereleases=True):
                return replace(facts, version=str(said), source_version=str(said), rules_from=f"by_version[{i}] ({spec})")
        return None

    def version(self, wanted: str | None) -> RecipeVersion:
        key = wanted or self.default_version
        if key not in self.versions:
            known = ", ".join(self.versions)
            raise RecipeError(f"{self.name} has no version {quoted(key)}; known: {known}")
        return self.versions[key]


def ranges_text(by_version: tuple[tuple[SpecifierSet, RecipeVersion], ...] | list) -> str:
    """A recipe's by_version ranges as messages show them: ``>=2.0; <2.0,>=1.0`` ("" where there are none)."""
    return "; ".join(str(spec) for spec, _ in by_version)


FETCH_KINDS = ("git", "sdist")


def fetched_from(recipe: Recipe, version: RecipeVersion, fetch: str | None) -> tuple[Recipe, RecipeVersion]:
    """``recipe`` and ``version`` as the build fetches them: from git (the default), or with
    ``fetch="sdist"`` from the version's pinned source distribution. The sdist carries the same
    recipe knowledge (arch knob, routing, patches, smoke test): the catalogue checks that its files
    are the tagged commit's (docs/recipes.md)."""
    sdist_only = not version.ref and version.sdist is not None and recipe.source_kind == "git"
    if fetch is None and sdist_only:
        fetch = "sdist"  # pinned by its sdist alone: PyPI has it, the git mirror does not
    if fetch == "git" and sdist_only:
        raise RecipeError(f"{recipe.name} {version.version} is pinned by its sdist only (no git ref in its recipe):"
                          " drop --fetch git, or build a ref with --ref")
    if fetch in (None, "git"):
        return recipe, version
    if fetch != "sdist":
        raise RecipeError(f"--fetch {quoted(fetch)}: use one of {', '.join(FETCH_KINDS)}")
    if recipe.source_kind == "local":
        raise RecipeError(f"{recipe.name} is a local source tree: --fetch sdist applies to recipes with a git source")
    if version.sdist is None:
        have = [k for k, v in recipe.versions.items() if v.sdist is not None]
        raise RecipeError(f"{recipe.name} {version.version} names no sdist in its recipe ({recipe.path}):"
                          + (f" versions with one: {', '.join(have)}" if have else " fetch it from git (--fetch git)"))
    sdist = version.sdist
    return (replace(recipe, source_kind="sdist", source_url=sdist.url, submodules=False),
            replace(version, ref=sdist.filename, commit=None))


JOB_FLAGS = ("use --max-jobs", "use --nvcc-threads")


def with_env(recipe: Recipe, version: RecipeVersion, env: Mapping[str, str],
             job_fix: tuple[str, str] = JOB_FLAGS) -> RecipeVersion:
    """``version`` with the user's ``--env`` variables on top of the recipe's: a package's own
    switches (FLASH_ATTENTION_DISABLE_BACKWARD=TRUE, NVCC_APPEND_FLAGS, ...). The variables imagegen
    sets itself are refused, each with the flag that sets it: they would be overwritten or would
    turn the build into something else (a download of a prebuilt wheel). ``job_fix``: how the command
    at hand sets MAX_JOBS and NVCC_THREADS (its flags, or where a command without them takes them)."""
    if not env:
        return version
    arch, (jobs, threads) = "use --arch", job_fix
    owned = {"TORCH_CUDA_ARCH_LIST": arch, recipe.jobs_env: jobs, "NVCC_THREADS": threads}
    if version.arch.env:
        owned[version.arch.env] = arch
    if recipe.threads_env:
        owned[recipe.threads_env] = threads
    if recipe.ext_parallel_env:
        owned[recipe.ext_parallel_env] = jobs
    for name in recipe.force_env:
        owned[name] = "it forces a compile from source, which imagegen always does"
    if recipe.local_version_env:
        owned[recipe.local_version_env] = "it is the wheel's local version, which imagegen sets"
    for name in env:
        if name in owned:
            raise RecipeError(f"--env {name}: imagegen sets {name} for {recipe.name}: {owned[name]}")
        if name.startswith(("IMAGEGEN_", "PIP_")) or name in ("CUDA_HOME", "PATH", "PYTHONPATH", "LD_LIBRARY_PATH"):
            raise RecipeError(f"--env {name}: imagegen sets {name} itself for the build (the toolchain, the index,"
                              " its own steps); give a package's own variables only")
    return replace(version, env={**version.env, **env})


def with_memory_for(recipe: Recipe, env: Mapping[str, str]) -> Recipe:
    """``recipe`` with the GB per nvcc thread of a build whose environment is ``env`` (the version's and
    the user's --env): the first ``memory_when_env`` entry whose variables all hold, else unchanged. Every
    step after this (jobs, the cell document, the in-build script) reads ``memory_per_thread_gb``."""
    for when in recipe.memory_when_env:
        if when.holds_for(env):
            return replace(recipe, memory_per_thread_gb=when.memory_per_thread_gb)
    return recipe


# --------------------------------------------------------------------------------------------
# Loading and validation


# --------------------------------------------------------------------------------------------
# The catalogue


# --------------------------------------------------------------------------------------------
# A local project as a recipe (a team's own kernels package: a setup.py/pyproject project)


