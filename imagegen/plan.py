"""Plan: expand a request into matrix cells and decide, before anything compiles, which can build.

A cell is one (recipe version, torch, CUDA variant, Python, arch list, flavor). Each cell is
``buildable``, ``rejected`` (with every reason, each naming its fix) or ``skipped`` (buildable but
redundant, e.g. a Python-independent abi3 wheel already built for another Python).
"""

from __future__ import annotations

import functools
import itertools
import re
from dataclasses import dataclass, field, replace
from importlib import resources
from typing import Iterable, Sequence

from packaging.version import Version

from imagegen import yamlio
from imagegen.errors import ArchError, CompatError, NothingToDoError
from imagegen.model import compat
from imagegen.model.arch import ArchList, CudaArch
from imagegen.model.arch_format import as_tuples
from imagegen.model.arch_parse import parse_arch_list
from imagegen.model.arch_rules import nvcc_problems, torch_problems
from imagegen.model.compat import BaseImage, CudaVariant, NoBaseImage, TorchSeries
from imagegen.model.recipes import Recipe, RecipeVersion, Rule
from imagegen.resources.builder import imagegen_rules as rules

BUILDABLE, REJECTED, SKIPPED = "buildable", "rejected", "skipped"


@functools.cache
def defaults() -> dict:
    return yamlio.load((resources.files("imagegen") / "resources" / "defaults.yaml").read_text())


@dataclass(frozen=True)
class Cell:
    recipe: Recipe
    version: RecipeVersion
    torch: TorchSeries
    torch_version: str
    cuda: CudaVariant
    python: str
    archs: ArchList
    flavor: str
    base: BaseImage | None
    torch_index_url: str | None
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    status: str = BUILDABLE
    # What the user asked for when the package compiles something else for it (8.0;8.6;8.9;9.0 ->
    # 8.0;9.0 for flash-attn: see compiled_archs); None when ``archs`` is the request itself.
    requested_archs: ArchList | None = None

    @property
    def buildable(self) -> bool:
        return self.status == BUILDABLE

    @property
    def name(self) -> str:
        """Bake target name: only [a-zA-Z0-9_-] (bake rejects dots)."""
        ver = "".join(c if c.isalnum() else "_" for c in self.version.version)
        short = min((self.recipe.name, *self.recipe.aliases), key=len)  # sage, fa2, bsa, natten
        return (f"{short}-{ver}-torch{self.torch.series.replace('.', '_')}-{self.cuda.name}"
                f"-py{self.python.replace('.', '')}")

    @property
    def local_version(self) -> str:
        """PEP 440 local version label added to the wheel: ``cu128torch2.8``."""
        return f"{self.cuda.name}torch{self.torch.series}"

    @property
    def wheel_dir(self) -> str:
        """Where the wheel lands under the output folder: <pkg>-<ver>/torch<X.Y>/cu<XYZ>/."""
        return f"{self.recipe.name}-{self.version.version}/torch{self.torch.series}/{self.cuda.name}"

    @property
    def expected_archs(self) -> ArchList:
        """What the built .so must carry: the request mapped through the recipe's ``emits``."""
        return expected_archs(self.version, self.archs, self.cuda.version if self.base is None or self.base.nvcc is None else self.base.nvcc)

    def describe(self) -> str:
        asked = self.requested_archs
        archs = f"{asked} (compiled as {self.archs})" if asked is not None and asked != self.archs else str(self.archs)
        return (f"{self.recipe.name} {self.version.version} torch {self.torch_version} {self.cuda.name}"
                f" py{self.python} arch {archs} [{self.flavor}]")


def compiled_archs(version: RecipeVersion, archs: ArchList) -> tuple[ArchList, str]:
    """The list the package really compiles for ``archs``, and a note naming what was mapped.

    A knob with ``runs_on`` (flash-attn, Block-Sparse-Attention: 80/90/100/120 only) silently
    ignores 86/89; their GPUs run the sm_80 cubin. So 8.0;8.6;8.9;9.0 becomes 8.0;9.0 (the knob
    gets 80;90, verify expects sm_80) with the note "8.6, 8.9 run the sm_80 cubin". Flags merge:
    8.6+PTX becomes 8.0+PTX, which a package that never embeds PTX still refuses.
    """
    knob = version.arch
    if knob.style == "fixed" or not knob.runs_on:
        return archs, ""
    # The in-build script maps the same way (imagegen_rules.map_families), so the knob it writes is
    # the list verify expects.
    mapped, moved = rules.map_families(as_tuples(archs), dict(knob.runs_on))
    if not moved:
        return archs, ""
    return ArchList(CudaArch(*t) for t in mapped), rules.family_note(moved)


def expected_archs(version: RecipeVersion, archs: ArchList, nvcc: Version) -> ArchList:
    knob = version.arch
    if knob.style == "fixed":
        fixed = knob.fixed_for(nvcc)
        return ArchList([a for a in fixed if any(covers(a, want) for want in archs)])
    out = []
    for a in archs:
        got = version.emits.get(a.cc)
        if got is not None:
            g = parse_arch_list(got)[0]
            out.append(CudaArch(g.major, g.minor, g.variant, a.sass, a.ptx))
        else:
            out.append(a)
    return ArchList(out)


def covers(have: CudaArch, want: CudaArch) -> bool:
    """Does compiled target ``have`` run on a GPU of ``want``'s compute capability?

    Plain SASS runs on the same major with an equal or higher minor; ``a`` targets only on
    exactly their cc; ``f`` targets within the family (same major).
    """
    if want.variant == "f":
        return have.major == want.major and have.variant in ("f", "")
    if have.variant == "a":
        return (have.major, have.minor) == (want.major, want.minor)
    return have.major == want.major and have.minor <= want.minor


# --------------------------------------------------------------------------------------------
# Checks. Each returns reasons; a reason says what is wrong and what to do instead.


def _python_problems(series: TorchSeries, python: str) -> list[str]:
    if not series.supports_python(python):
        lo, hi = series.python
        return [f"torch {series.series} supports Python {lo}-{hi}; Python {python} selected"]
    return []


_SUBJECT = {"torch": "torch", "cuda": "CUDA", "python": "Python"}


def _rule_value(subject: str, series: TorchSeries, torch_version: str, nvcc: Version,
                python: str) -> tuple[Version, Version]:
    """(series X.Y, exact release) of the cell for one rule subject."""
    if subject == "torch":
        return Version(series.series), Version(Version(torch_version).public)
    if subject == "cuda":
        return nvcc, nvcc
    return Version(python), Version(python)


def _rule_problems(recipe: Recipe, version: RecipeVersion, series: TorchSeries, torch_version: str,
                   cuda: CudaVariant, nvcc: Version, python: str) -> list[str]:
    """One reason per torch/CUDA/Python range (recipe-wide or the version's) the cell is outside of."""
    out = []
    shown = {"torch": f"torch {series.series}", "cuda": f"CUDA {_fmt(nvcc)} ({cuda.name})", "python": f"Python {python}"}
    for rule in recipe.rules(version):
        if rule.allows(*_rule_value(rule.subject, series, torch_version, nvcc, python)):
            continue
        why = f" ({rule.why})" if rule.why else ""
        out.append(f"{recipe.name} {version.version} needs {_SUBJECT[rule.subject]} {rule.text}{why};"
                   f" {shown[rule.subject]} selected: {_rule_fix(recipe, version, rule, series, torch_version, nvcc, python)}")
    return out


def _rule_fix(recipe: Recipe, version: RecipeVersion, rule: Rule, series: TorchSeries, torch_version: str,
              nvcc: Version, python: str) -> str:
    """``use --torch 2.10 or newer, or --version 0.0.33.post2``: the values that pass, and another pin that takes this one."""
    if rule.subject == "torch":
        universe = [(s.series, Version(s.series), Version(s.latest)) for s in compat.torch_table().values()]
    elif rule.subject == "cuda":
        table = compat.cuda_table()
        universe = [(c, table[c].version, table[c].version) for c in series.cuda if c in table]
        if not any(rule.allows(v, e) for _, v, e in universe):  # none with this torch: any torch's
            universe = [(c, v.version, v.version) for c, v in table.items()]
        universe = [(str(v), v, e) for _, v, e in universe]
    else:
        universe = [(p, Version(p), Version(p)) for p in series.pythons]
    ok = [label for label, v, e in universe if rule.allows(v, e)]
    labels = [label for label, _, _ in universe]
    parts = []
    if ok:
        flag = f"--{rule.subject}"
        if len(ok) > 1 and labels[-len(ok):] == ok:
            parts.append(f"use {flag} {ok[0]} or newer")
        elif len(ok) > 1 and labels[:len(ok)] == ok:
            parts.append(f"use {flag} {ok[-1]} or older")
        else:
            parts.append(f"use {flag} " + " or ".join(ok[:4]) + (" (or another listed by imagegen plan)" if len(ok) > 4 else ""))
    value = _rule_value(rule.subject, series, torch_version, nvcc, python)
    for other in recipe.versions.values():
        if other is not version and all(r.allows(*value) for r in recipe.rules(other) if r.subject == rule.subject):
            parts.append(("or " if parts else "use ") + f"--version {other.version}")
            break
    return ", ".join(parts) if parts else f"no {_SUBJECT[rule.subject]} in imagegen's tables satisfies it"


def _torch_cuda_problems(series: TorchSeries, cuda: CudaVariant) -> list[str]:
    if cuda.name not in series.cuda:
        return [f"torch {series.series} has no {cuda.name} build (it has {', '.join(series.cuda)})"]
    return []


def _recipe_problems(recipe: Recipe, version: RecipeVersion, series: TorchSeries, cuda: CudaVariant,
                     archs: ArchList, nvcc: Version) -> list[str]:
    out: list[str] = []
    knob = version.arch
    if knob.style == "fixed":
        fixed = knob.fixed_for(nvcc)
        for a in archs:
            if not any(covers(f, a) for f in fixed):
                out.append(f"{recipe.name} {version.version} does not compile sm_{a.code} with CUDA {_fmt(nvcc)}"
                           f" (it always builds its own list: {fixed or 'nothing'})")
        if archs.has_ptx and knob.ptx == "none":
            out.append(f"{recipe.name} {version.version} never embeds PTX; drop +PTX")
        return out
    supported = {a.cc: a for a in version.archs}
    for a in archs:
        s = supported.get(a.cc)
        if s is None:
            out.append(f"{recipe.name} {version.version} does not support sm_{a.number}"
                       f" (it supports {', '.join(sorted(supported, key=cc_key))}){_other_versions_hint(recipe, version, a)}")
        elif a.variant == "f" and s.variant != "f":
            out.append(f"{recipe.name} {version.version} cannot build family target {a}; ask for {a.cc} instead")
        if a.sass is False and a.ptx and knob.style in ("numeric", "dotted"):
            out.append(f"{recipe.name} reads {knob.env} as SASS targets; a PTX-only entry {a} cannot be expressed")
        min_cuda = version.min_cuda_by_arch.get(a.cc)
        if min_cuda and nvcc < min_cuda:
            out.append(f"{recipe.name} {version.version} needs CUDA >= {min_cuda} for sm_{a.number}; CUDA {_fmt(nvcc)} selected")
    if archs.has_ptx:
        if knob.ptx == "none":
            out.append(f"{recipe.name} {version.version} never embeds PTX ({knob.env} takes SASS targets only); drop +PTX")
        elif knob.ptx == "newest" and any(a.ptx for a in archs if a.key != archs.newest.key):
            out.append(f"{recipe.name} {version.version} embeds PTX only for the newest arch ({archs.newest.cc}); ask +PTX only there")
    if archs and knob.style == "torch" and knob.env == "TORCH_CUDA_ARCH_LIST" and knob.parser == "torch":
        out.extend(torch_problems(archs, series.latest))
    return out


def _other_versions_hint(recipe: Recipe, version: RecipeVersion, a: CudaArch) -> str:
    others = [v.version for v in recipe.versions.values() if v is not version and any(x.cc == a.cc for x in v.archs)]
    return f"; version {others[0]} does (--version {others[0]})" if others else ""


def cc_key(cc: str) -> tuple[int, int]:
    major, minor = cc.split(".")
    return int(major), int(minor)


def _fmt(v: Version) -> str:
    return f"{v.major}.{v.minor}"


def _nvcc_problems(archs: ArchList, nvcc: Version, cuda: CudaVariant) -> list[str]:
    out = []
    for p in nvcc_problems(archs, nvcc):
        p = p.replace(f"CUDA {_fmt(nvcc)} selected", f"CUDA {_fmt(nvcc)} ({cuda.name}) selected")
        need = _NEEDS.search(p)
        if need and "(" not in p.split("selected", 1)[-1]:
            p += f": use --cuda {need.group(1)} or newer"
        out.append(p)
    return out


_NEEDS = re.compile(r"needs CUDA >= (\d+\.\d+)")


def _base_problems(base: BaseImage, cuda: CudaVariant) -> list[str]:
    out = []
    if base.nvcc is not None and base.nvcc.major != cuda.major:
        extra = ""
        if base.image_torch_cuda and base.image_torch_cuda != cuda.name:
            extra = f" (its preinstalled torch is a {base.image_torch_cuda} build)"
        where = "this host" if base.flavor.name == "native" else base.ref
        out.append(
            f"{where} has nvcc {_fmt(base.nvcc)}{extra}, but torch {cuda.name} needs nvcc {cuda.major}.x"
            f" (nvcc's major must equal torch's CUDA major); use a CUDA {cuda.major}.x image or --cuda {base.nvcc.major}.x"
        )
    return out


# --------------------------------------------------------------------------------------------
# Making cells


def make_cell(recipe: Recipe, version: RecipeVersion, torch: str, cuda: str, python: str, archs: ArchList,
              flavor: str, base_image: str | None = None, torch_index_override: str | None = None) -> Cell:
    series, torch_version = compat.torch_series(torch)
    variant = compat.cuda_variant(cuda)
    py = compat.check_python(python)
    return _cell(recipe, version, series, torch_version, variant, py, archs, flavor, base_image, torch_index_override)


def _cell(recipe: Recipe, version: RecipeVersion, series: TorchSeries, torch_version: str, cuda: CudaVariant,
          python: str, archs: ArchList, flavor: str, base_image: str | None, torch_index_override: str | None,
          host_base: BaseImage | None = None) -> Cell:
    problems: list[str] = []
    notes: list[str] = []
    fl = compat.flavor(flavor)
    base: BaseImage | None = host_base
    base_problem: list[str] = []
    if host_base is None:
        try:
            base = _resolve_base(fl, series, torch_version, cuda, python, base_image)
        except NoBaseImage as exc:
            base_problem.append(str(exc))
    nvcc = base.nvcc if base is not None and base.nvcc is not None else Version(cuda.toolkit if fl.toolkit == "image" else (cuda.pypi_toolkit or cuda.toolkit))
    nvcc = Version(_fmt(nvcc))
    requested = archs
    archs, mapped = compiled_archs(version, requested)
    if mapped:
        notes.append(mapped)
    problems += _python_problems(series, python)
    problems += _torch_cuda_problems(series, cuda)
    problems += _rule_problems(recipe, version, series, torch_version, cuda, nvcc, python)
    problems += _nvcc_problems(archs, nvcc, cuda)
    # An arch nvcc cannot compile is reported once, by the nvcc rule; the recipe checks see the rest.
    compilable = ArchList([a for a in archs if not nvcc_problems(ArchList([a]), nvcc)])
    problems += _recipe_problems(recipe, version, series, cuda, compilable, nvcc)
    if base is not None:
        problems += _base_problems(base, cuda)
        if base.fallback:
            notes.append(f"fallback base image: {base.fallback}")
        if base.deadsnakes:
            notes.append(f"Python {python} comes from the deadsnakes PPA on this Ubuntu image")
    problems += base_problem
    if version.arch.style == "fixed" and not problems:
        notes.append(f"{recipe.name} compiles a fixed arch list: {version.arch.fixed_for(nvcc)}")
    index = None
    try:
        index = compat.torch_index_url(series, cuda, torch_index_override)
    except Exception as exc:  # an unsafe override is a problem of the cell, not a crash
        problems.append(str(exc))
    return Cell(
        recipe=recipe, version=version, torch=series, torch_version=torch_version, cuda=cuda, python=python,
        archs=archs, flavor=flavor, base=base, torch_index_url=index, problems=tuple(_dedupe(problems)),
        notes=tuple(notes), status=REJECTED if problems else BUILDABLE,
        requested_archs=requested if requested != archs else None,
    )


@functools.lru_cache(maxsize=4096)
def _resolve_base(fl, series, torch_version, cuda, python, base_image):
    return compat.resolve_base_image(fl, series, torch_version, cuda, python, base_image)


def _dedupe(items: Iterable[str]) -> list[str]:
    seen: dict[str, None] = {}
    for i in items:
        seen.setdefault(i, None)
    return list(seen)


@dataclass(frozen=True)
class MatrixRequest:
    recipes: Sequence[tuple[Recipe, RecipeVersion]]
    torch: Sequence[str]
    cuda: Sequence[str]
    python: Sequence[str]
    archs: Sequence[ArchList]
    flavor: str
    base_image: str | None = None
    torch_index_override: str | None = None


@dataclass
class Plan:
    cells: list[Cell] = field(default_factory=list)

    @property
    def buildable(self) -> list[Cell]:
        return [c for c in self.cells if c.status == BUILDABLE]

    @property
    def rejected(self) -> list[Cell]:
        return [c for c in self.cells if c.status == REJECTED]

    @property
    def skipped(self) -> list[Cell]:
        return [c for c in self.cells if c.status == SKIPPED]


def expand(req: MatrixRequest) -> Plan:
    """Every combination, each decided. Python-independent (abi3) wheels build once per torch x CUDA."""
    plan = Plan()
    series = [compat.torch_series(t) for t in req.torch]
    variants = [compat.cuda_variant(c) for c in req.cuda]
    pythons = [compat.check_python(p) for p in req.python]
    for (recipe, version), (s, tv), cuda, archs in itertools.product(req.recipes, series, variants, req.archs):
        built_for: str | None = None
        for py in pythons:
            cell = _cell(recipe, version, s, tv, cuda, py, archs, req.flavor, req.base_image, req.torch_index_override)
            if cell.buildable and recipe.abi3:
                if built_for is not None:
                    cell = replace(cell, status=SKIPPED, notes=cell.notes + (
                        f"{recipe.name} {version.version} wheels do not depend on the Python version;"
                        f" built once with Python {built_for}",))
                else:
                    built_for = py
            plan.cells.append(cell)
    return plan


def native_cell(recipe: Recipe, version: RecipeVersion, archs: ArchList, host_base: BaseImage, torch_version: str,
                torch_cuda: str | None, python: str) -> Cell:
    """The cell of a native build: the torch, CUDA and Python of this host, checked the same way."""
    series, _ = compat.torch_series(torch_version)
    if not torch_cuda:
        raise CompatError(f"the installed torch {torch_version} is a CPU-only build: install a CUDA build of torch")
    cuda = compat.cuda_variant(torch_cuda)
    return _cell(recipe, version, series, torch_version, cuda, python, archs, "native", None, None, host_base=host_base)


def choose_cell(recipe: Recipe, version: RecipeVersion, archs: ArchList, *, torch: str | None, cuda: str | None,
                python: str | None, flavor: str, base_image: str | None = None,
                torch_index_override: str | None = None) -> Cell:
    """The one cell ``render`` builds: what was given, the rest filled with the newest combination
    that can build. Raises CompatError with the reasons of the closest candidate when none can."""
    table = compat.torch_table()
    if torch:
        series_list = [compat.torch_series(torch)]
    else:
        series_list = [(s, s.latest) for s in reversed(list(table.values()))]
    given_cuda = compat.cuda_variant(cuda) if cuda else None
    given_py = compat.check_python(python) if python else None
    default_py = str(defaults()["python"])
    first: Cell | None = None
    for s, tv in series_list:
        if given_cuda:
            variants = [given_cuda]
        else:
            others = sorted((c for c in s.cuda if c != s.pypi_default), reverse=True)
            variants = [compat.cuda_table()[c] for c in [s.pypi_default, *others] if c in compat.cuda_table()]
        if given_py:
            pys = [given_py]
        else:
            pys = ([default_py] if s.supports_python(default_py) else []) + list(reversed(s.pythons))
        for cv in variants:
            for py in pys:
                cell = _cell(recipe, version, s, tv, cv, py, archs, flavor, base_image, torch_index_override)
                if cell.buildable:
                    return cell
                if first is None:
                    first = cell
    assert first is not None
    raise CompatError(f"cannot build {first.describe()}: " + "; ".join(first.problems))


def parse_archs(values: Sequence[str] | None, fallback: str) -> list[ArchList]:
    if not values:
        return [parse_arch_list(fallback)]
    return [parse_arch_list(v) for v in values]


__all__ = [
    "BUILDABLE", "REJECTED", "SKIPPED", "Cell", "MatrixRequest", "Plan", "choose_cell", "compiled_archs", "defaults",
    "expand", "expected_archs", "make_cell", "parse_archs", "ArchError", "NothingToDoError",
]
