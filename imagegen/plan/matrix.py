"""The matrix: expand a request into cells (imagegen.model.cell) and decide, before anything compiles,
which can build; an axis nobody gave is filled by the default policy."""

from __future__ import annotations

import functools
import itertools
from dataclasses import replace
from importlib import resources
from typing import Iterable, Sequence

from packaging.version import Version

from imagegen import safety, yamlio
from imagegen.model.cell_rules import (
    FLAGS,
    HOST,
    FixWords,
    base_problems,
    compiled_archs,
    cxx_std_problems,
    fmt_version,
    nvcc_problems_for,
    python_problems,
    recipe_problems,
    rule_problems,
    runs_on_device,
    stated_flag_notes,
    torch_cuda_problems,
)
from imagegen.errors import CompatError, NoBaseImage
from imagegen.model import base_images, compat
from imagegen.model.arch import ArchList
from imagegen.model.arch_parse import parse_arch_list
from imagegen.model.arch_rules import nvcc_problems
from imagegen.model.base_images import BaseImage
from imagegen.model.compat import CudaVariant, TorchSeries
from imagegen.model.layout import DEFAULT_LAYOUT
from imagegen.model.cell import BUILDABLE, DEFAULT_PLATFORM, REJECTED, SKIPPED, WINDOWS_BASE_REF, Cell, HostToolchain, MatrixRequest, Plan, WindowsHost
from imagegen.model.recipes import Recipe, RecipeVersion


@functools.cache
def defaults() -> dict:
    return yamlio.load((resources.files("imagegen") / "resources" / "defaults.yaml").read_text())


# --------------------------------------------------------------------------------------------
# Checks. Each returns reasons; a reason says what is wrong and what to do instead.


# --------------------------------------------------------------------------------------------
# Making cells


def make_cell(recipe: Recipe, version: RecipeVersion, torch: str, cuda: str, python: str, archs: ArchList,
              flavor: str, base_image: str | None = None, torch_index_override: str | None = None) -> Cell:
    series, torch_version = compat.torch_series(torch)
    variant = compat.cuda_variant(cuda)
    py = compat.validate_python(python)
    return _cell(recipe, version, series, torch_version, variant, py, archs, flavor, base_image, torch_index_override)


def _cell(recipe: Recipe, version: RecipeVersion, series: TorchSeries, torch_version: str, cuda: CudaVariant,
          python: str, archs: ArchList, flavor: str, base_image: str | None, torch_index_override: str | None,
          host_base: BaseImage | None = None, fixes: FixWords = FLAGS) -> Cell:
    problems: list[str] = []
    notes: list[str] = []
    fl = base_images.flavor(flavor)
    base: BaseImage | None = host_base
    base_problem: list[str] = []
    if host_base is None:
        try:
            base = _resolve_base(fl, series, torch_version, cuda, python, base_image)
        except NoBaseImage as exc:
            base_problem.append(str(exc))
    nvcc = base.nvcc if base is not None and base.nvcc is not None else Version(cuda.toolkit if fl.toolkit == "image" else (cuda.pypi_toolkit or cuda.toolkit))
    nvcc = Version(fmt_version(nvcc))
    if version.resolved:
        notes.append(version.resolved)
    # The version as this torch builds it: a by_torch entry's patches and variables only where its
    # range holds the cell's torch (every other cell keeps its exact build and inputs hash).
    pinned, version = version, version.for_torch(Version(series.series), Version(torch_version))
    if version.torch_rules:
        added = ", ".join(p.name for p in version.patches[len(pinned.patches):]) or "no patch"
        notes.append(f"torch {torch_version}: the recipe's {version.torch_rules} applies (adds {added})")
    requested = archs
    archs, mapped = compiled_archs(version, requested)
    if mapped:
        notes.append(mapped)
    problems += python_problems(series, python)
    problems += torch_cuda_problems(series, cuda)
    problems += rule_problems(recipe, version, series, torch_version, cuda, nvcc, python, fixes)
    std_problems, std_notes = cxx_std_problems(recipe, version, series, msvc=_msvc(base), fixes=fixes)
    problems += std_problems
    notes += std_notes
    problems += nvcc_problems_for(archs, nvcc, cuda, fixes)
    # An arch nvcc cannot compile is reported once, by the nvcc rule; the recipe checks see the rest.
    compilable = ArchList([a for a in archs if not nvcc_problems(ArchList([a]), nvcc)])
    problems += recipe_problems(recipe, version, series, cuda, compilable, nvcc, fixes)
    if base is not None:
        problems += base_problems(base, cuda, archs)
        if base.fallbacks:
            notes.append(f"fallback base image: {', then '.join(base.fallbacks)} (if {base.ref} cannot be pulled)")
        if base.deadsnakes:
            notes.append(f"Python {python} comes from the deadsnakes PPA on this Ubuntu image")
    problems += base_problem
    # The recipe's list, said only of the recipe's own source: a tree nobody checked (a fork) may compile
    # another (version.unchecked says what the plan knows of it).
    if version.unchecked:
        notes += stated_flag_notes(version, series, nvcc, requested, msvc=_msvc(base))
    if version.arch.style == "fixed" and not problems and not version.unchecked:
        notes.append(f"{recipe.name} compiles a fixed arch list: {version.arch.fixed_for(nvcc)}")
    index = None
    try:
        if base is not None and base.torch_index and not torch_index_override:
            index = base.torch_index  # the JetPack's own index (jetson flavor)
        else:
            index = compat.torch_index_url(series, cuda, torch_index_override)
    except Exception as exc:  # an unsafe override is a problem of the cell, not a crash
        problems.append(str(exc))
    return Cell(
        recipe=recipe, version=version, torch=series, torch_version=torch_version, cuda=cuda, python=python,
        archs=archs, requested_archs=requested, flavor=flavor, base=base, torch_index_url=index,
        problems=tuple(_dedupe(problems)), notes=tuple(notes), status=REJECTED if problems else BUILDABLE,
    )


def _msvc(base: BaseImage | None) -> bool:
    """Does this cell compile with MSVC (a Windows script's cell)?"""
    return base is not None and base.ref == WINDOWS_BASE_REF and base.flavor.name == "native"


def on_fallback(cell: Cell, ref: str, why: str) -> Cell:
    """``cell`` built on its fallback base image ``ref`` (one of ``cell.base.fallbacks``) because ``why``: what
    `imagegen build` does when the primary cannot be pulled (executors/bases.py), and what the bake file's
    ``<target>-fallback`` targets and the CI jobs that pick them build (render/bake.py)."""
    assert cell.base is not None and ref in cell.base.fallbacks
    notes = tuple(n for n in cell.notes if not n.startswith("fallback base image:"))
    return replace(cell, base=base_images.on_fallback(cell.base, ref, cell.python),
                   notes=notes + (f"built on the fallback base image {ref}: {why}",))


def image_for(base_image: str | dict[str, str] | None, cuda: CudaVariant) -> str | None:
    """The --base-image of a cell of ``cuda``: one image for all, or the one given for that CUDA version."""
    if isinstance(base_image, dict):
        return base_image.get(cuda.name, base_image.get("*"))
    return base_image


@functools.lru_cache(maxsize=4096)
def _resolve_base(fl, series, torch_version, cuda, python, base_image):
    return base_images.resolve_base_image(fl, series, torch_version, cuda, python, base_image)


def _dedupe(items: Iterable[str]) -> list[str]:
    seen: dict[str, None] = {}
    for i in items:
        seen.setdefault(i, None)
    return list(seen)


def offline_problems(cell: Cell) -> list[str]:
    """Why ``cell`` cannot build without a network: each input it would download."""
    problems = []
    if cell.recipe.source_kind != "local":
        problems.append(f"--offline: the {cell.recipe.source_kind} source would be downloaded: build a tree on this"
                        " machine with --source DIR (a checkout or unpacked sdist of the package: its recipe's"
                        " rules apply)")
    if cell.base is not None and cell.base.toolkit == "pypi":
        problems.append("--offline: the CUDA toolkit would come from PyPI: use a base image that has nvcc (--flavor"
                        " cuda or runpod, or your own --base-image)")
    if cell.torch_from == "venv":
        problems.append(f"--offline: torch {cell.torch_version} ({cell.cuda.name}) is not in {cell.base.ref if cell.base else 'the image'}"
                        " and would be downloaded: use a base image whose Python has it")
    return problems


def offline(cell: Cell) -> Cell:
    """``cell`` built without a network: marked so, and rejected where it needs a download."""
    problems = offline_problems(cell) if cell.status == BUILDABLE else []
    return replace(cell, offline=True, problems=cell.problems + tuple(problems),
                   status=REJECTED if problems else cell.status)


def with_offline(plan: "Plan") -> "Plan":
    """``plan`` built without a network (offline, per cell)."""
    return plan.each(offline)


# `RUN --device` is in the Dockerfile frontend's labs channel only (1.14.0-labs and later; the
# frontend built into dockerd is not a labs build), so a build that uses it names one.
DEFAULT_DOCKERFILE_FRONTEND = "docker/dockerfile:1.19-labs"


def gpu_checked(cell: Cell, device: str, frontend: str | None = None) -> Cell:
    """``cell`` with its wheel checked on the GPU inside the build: the recipe's smoke.gpu_check runs in a
    build step given the CDI ``device``. A recipe without a gpu_check builds as before, with a note saying
    so."""
    safety.validate(device, safety.CDI_DEVICE, "--gpu-check-device")
    frontend = safety.validate(DEFAULT_DOCKERFILE_FRONTEND if frontend is None else frontend, safety.IMAGE_REF,
                               "--dockerfile-frontend")
    if not cell.recipe.smoke.gpu_check.strip():
        return replace(cell, notes=cell.notes + (f"--gpu-check-device: recipe {cell.recipe.name} has no"
                                                 " smoke.gpu_check, so nothing runs on the GPU in this cell's build",))
    return replace(cell, gpu_check_device=device, dockerfile_frontend=frontend)


def with_gpu_check(plan: "Plan", device: str, frontend: str | None = None) -> "Plan":
    """``plan`` with each cell's wheel checked on the GPU inside the build (gpu_checked, per cell)."""
    # refused even for a plan without cells
    safety.validate(device, safety.CDI_DEVICE, "--gpu-check-device")
    safety.validate(DEFAULT_DOCKERFILE_FRONTEND if frontend is None else frontend, safety.IMAGE_REF, "--dockerfile-frontend")
    return plan.each(lambda c: gpu_checked(c, device, frontend))


def with_layout(plan: "Plan", layout: str) -> "Plan":
    """``plan`` with every cell's wheels in ``layout`` (checked by validate_layout)."""
    return plan.each(lambda c: replace(c, layout=layout))


def device_rows(flavor: str) -> list:
    """The device rows of a flavor whose images each serve one device (jetson: its JetPacks); []."""
    return list(base_images.flavor(flavor).raw.get("jetpacks") or ())


def device_requests(req: MatrixRequest, *, torch: bool, cuda: bool, python: bool, arch: bool) -> list[MatrixRequest]:
    """``req`` as one request per device row of its flavor (jetson: a JetPack each) on the axes the user
    left open (``torch``/``cuda``/``python``/``arch``: given by a flag or the config): the row's CUDA,
    Python, newest torch on its index and its GPUs, instead of the generic matrix, whose other
    combinations no such image has. Rows are kept where they fit what was given; where none fits a
    given CUDA or Python, the plain request stands (its plan says why), and where none runs a given
    arch, every row is planned with it (each says so). A flavor without device rows: [req]."""
    rows = device_rows(req.flavor)
    if not rows or (torch and cuda and python and arch):
        return [req]
    if cuda:
        wanted = {compat.cuda_variant(c).dotted for c in req.cuda}
        rows = [r for r in rows if str(r["cuda"]) in wanted]
    if python:
        rows = [r for r in rows if str(r["python"]) in {compat.validate_python(p) for p in req.python}]
    if not rows:
        return [req]
    if arch:
        fits = [r for r in rows if all(any(runs_on_device(a, str(cc)) for cc in r["archs"])
                                       for archs in req.archs for a in archs)]
        rows = fits or rows
    return [replace(req, torch=list(req.torch) if torch else [str(r["torch"][-1])], cuda=[str(r["cuda"])],
                    python=[str(r["python"])],
                    archs=list(req.archs) if arch else [parse_arch_list(";".join(str(a) for a in r["archs"]))])
            for r in rows]


def expand(req: MatrixRequest) -> Plan:
    """Every combination of the values given, each decided; an axis nobody gave (an empty list) is
    filled per combination by choose_cell's default policy, so a request that names nothing is one cell
    per recipe and arch list, the one `render` makes. Python-independent (abi3) wheels build once per
    torch x CUDA."""
    plan = Plan()
    # choose_cell parses each value (a bad one is its error); None: the axis is the policy's
    torches, variants, pythons = list(req.torch) or [None], list(req.cuda) or [None], list(req.python) or [None]
    for (recipe, version), torch, cuda, archs in itertools.product(req.recipes, torches, variants, req.archs):
        built_for: dict[tuple, str] = {}
        for py in pythons:
            cell = choose_cell(recipe, version, archs, torch=torch, cuda=cuda, python=py, flavor=req.flavor,
                               base_image=req.base_image, torch_index_override=req.torch_index_override,
                               flavor_given=req.flavor_given, strict=False, windows=req.windows,
                               platforms=req.platforms)
            key = (cell.torch_version, cell.cuda.name, cell.flavor)
            if cell.buildable and recipe.abi3:
                if key in built_for:
                    cell = replace(cell, status=SKIPPED, notes=cell.notes + (
                        f"{recipe.name} {version.version} wheels do not depend on the Python version;"
                        f" built once with Python {built_for[key]}",))
                else:
                    built_for[key] = cell.python
            plan.cells.append(cell)
    return plan


def windows_plan(recipes: Sequence[tuple[Recipe, RecipeVersion]], archs: Sequence[ArchList], host: WindowsHost, *,
                 torch: Sequence[str] = (), cuda: Sequence[str] = (), python: Sequence[str] = (),
                 torch_index_override: str | None = None, layout: str = DEFAULT_LAYOUT) -> Plan:
    """The cells of Windows scripts (render --shell, ci github --windows): expand's matrix on ``host``,
    each cell once (two open-axis combinations can choose the same cell)."""
    req = MatrixRequest(recipes=recipes, torch=torch, cuda=cuda, python=python, archs=archs, flavor="native",
                        torch_index_override=torch_index_override, windows=host)
    seen: set = set()
    cells = [c for c in expand(req).cells
             if (c.name, str(c.archs), c.status) not in seen and not seen.add((c.name, str(c.archs), c.status))]
    return with_layout(Plan(cells=cells), layout)


def native_cell(recipe: Recipe, version: RecipeVersion, archs: ArchList, host_base: BaseImage, torch_version: str,
                torch_cuda: str | None, python: str, fixes: FixWords = FLAGS) -> Cell:
    """The cell of a native build: the torch, CUDA and Python of this host (or a Windows script's cell),
    checked the same way; ``fixes``: how its reasons say what to change (cell_rules.HOST on this host)."""
    series, _ = compat.torch_series(torch_version)
    if not torch_cuda:
        raise CompatError(f"the installed torch {torch_version} is a CPU-only build: install a CUDA build of torch")
    cuda = compat.cuda_variant(torch_cuda)
    return _cell(recipe, version, series, torch_version, cuda, python, archs, "native", None, None, host_base=host_base,
                 fixes=fixes)


POLICY_AXES = ("torch", "CUDA", "Python", "flavor", "archs")


def preflight(recipe: Recipe, version: RecipeVersion, archs: ArchList, host: HostToolchain) -> Cell:
    """The cell this host would build, or a one-line CompatError saying what to fix."""
    if host.torch is None:
        raise CompatError(f"torch is not importable by {host.python_exe}: install the torch you build for first")
    if host.nvcc is None:
        raise CompatError("nvcc not found (looked in CUDA_HOME/bin and PATH): install the CUDA toolkit"
                          " (or `pip install cuda-toolkit[nvcc,cudart,cccl]` matching torch's CUDA) and set CUDA_HOME")
    base = BaseImage(ref="native", flavor=base_images.flavor("native"), python=host.python_exe, toolkit="host",
                     nvcc=host.nvcc, image_torch_cuda=None)
    cell = native_cell(recipe, version, archs, base, host.torch, host.torch_cuda, host.python, HOST)
    if cell.problems:
        raise CompatError(f"cannot build {cell.describe()} here: " + "; ".join(cell.problems))
    return cell


def policy_clauses() -> dict[str, str]:
    """What the one default policy (resources/defaults.yaml) gives each axis nobody named."""
    d = defaults()
    fallbacks = " or ".join(str(f) for f in d.get("flavor_fallbacks") or ())
    return {
        "torch": "the newest torch the recipe can build",
        "CUDA": "that torch's PyPI CUDA",
        "Python": f"Python {d['python']} (else the torch's newest)",
        "flavor": f"flavor {d['flavor']}" + (f" (else {fallbacks} where {d['flavor']} has no image for that CUDA)"
                                            if fallbacks else ""),
        "archs": f"archs {d['arch']}",
    }


def default_policy(axes: Sequence[str] = POLICY_AXES) -> str:
    """The one default policy in a sentence, for ``axes`` (all of them: `--help` and docs/reference/configuration.md say it; the
    axes a plan left open: its trailer line)."""
    clauses = policy_clauses()
    return "an axis not named takes one value per cell: " + ", ".join(clauses[a] for a in axes)


def fallback_flavors(flavor: str, flavor_given: bool, base_image) -> list[str]:
    """The flavors a cell may be planned on, in order: the one given (--flavor, the config), else the
    default and then defaults.yaml's ``flavor_fallbacks`` (a flavor whose images lack the cell's CUDA
    gives way to one that has it). A base image of the user's keeps its flavor."""
    if flavor_given or base_image is not None:
        return [flavor]
    return list(dict.fromkeys([flavor, *(str(f) for f in defaults().get("flavor_fallbacks") or ())]))


def choose_cell(recipe: Recipe, version: RecipeVersion, archs: ArchList, *, torch: str | None, cuda: str | None,
                python: str | None, flavor: str, base_image: str | dict[str, str] | None = None,
                torch_index_override: str | None = None, flavor_given: bool = True, strict: bool = True,
                windows: WindowsHost | None = None, platforms: Sequence[str] = ()) -> Cell:
    """The one cell of what was given, the axes not given filled by imagegen's one default policy
    (resources/defaults.yaml): the newest torch series the recipe version can build (its newest
    release), that series' PyPI default CUDA (else its other variants, newest first), Python 3.12 where
    the series has it (else its newest), on the given flavor, else the default one and then its
    fallbacks. render builds this cell; plan, bake, build, push, pull and lock fill every combination of
    the values given the same way. The cell's notes say what was passed over and why. Raises
    CompatError with the closest candidate's reasons when nothing can build (``strict``), else returns
    that candidate (rejected). ``windows``: the cell of a Windows script, compiled on that host (no flavor,
    no image), by the same policy and rules. ``platforms``: those the cell is planned for beyond linux/amd64
    (--platform linux/arm64): a fallback flavor is taken only where it can build on each of them."""
    given_series = compat.torch_series(torch) if torch else None
    given_cuda = compat.cuda_variant(cuda) if cuda else None
    given_py = compat.validate_python(python) if python else None
    flavors = ["native"] if windows else fallback_flavors(flavor, flavor_given, base_image)
    first: Cell | None = None
    first_on_default: Cell | None = None  # this combination on the default flavor: why a fallback was used
    passed_over: dict[str, str] = {}  # newer torch releases that cannot build: the first reason of each
    for s, tv, cv, py in candidates(given_series, given_cuda, given_py):
        for fl in flavors:
            if windows:
                cell = _cell(recipe, version, s, tv, cv, py, archs, fl, None, torch_index_override,
                             host_base=windows.base(cv, py), fixes=windows.fixes)
            else:
                cell = _cell(recipe, version, s, tv, cv, py, archs, fl, image_for(base_image, cv), torch_index_override)
            if cell.buildable and len(flavors) > 1 and any(p != DEFAULT_PLATFORM for p in platforms):
                from imagegen.plan.platforms import with_platforms
                elsewhere = [q for c in with_platforms(Plan(cells=[cell]), platforms).cells for q in c.problems]
                if elsewhere:
                    cell = replace(cell, problems=tuple(elsewhere), status=REJECTED)
            if cell.buildable:
                # each reason up to its advice: the cell's own problems say what to do
                newer = [f"torch {t}: {why.split(': use ')[0]}" for t, why in passed_over.items() if t != tv and not torch]
                return _chosen(cell, newer, first_on_default, flavor)
            if fl == flavor:
                first_on_default = cell
            if first is None or len(cell.problems) < len(first.problems):
                first = cell  # the candidate nearest to building: its reasons, not a torch never shipped for that CUDA
            passed_over.setdefault(tv, cell.problems[0] if cell.problems else "no cell")
    assert first is not None
    if not strict:
        return first
    raise CompatError(f"cannot build {first.describe()}: " + "; ".join(first.problems))


def candidates(torch: tuple[TorchSeries, str] | None, cuda: CudaVariant | None, python: str | None):
    """(series, torch release, CUDA variant, Python) in the default policy's order for one combination
    of the axes given: the ones not given filled newest torch first, then the series' PyPI default CUDA
    before its other variants (newest first), then the default Python before the series' others
    (newest first). choose_cell walks it, for the Windows scripts' cells too."""
    series = [torch] if torch else [(s, s.latest) for s in reversed(list(compat.torch_table().values()))]
    default_py = str(defaults()["python"])
    for s, tv in series:
        if cuda:
            variants = [cuda]
        else:
            others = sorted((c for c in s.cuda if c != s.pypi_default), reverse=True)
            variants = [compat.cuda_table()[c] for c in [s.pypi_default, *others] if c in compat.cuda_table()]
        pys = [python] if python else ([default_py] if s.supports_python(default_py) else []) + list(reversed(s.pythons))
        for cv in variants:
            for py in dict.fromkeys(pys):
                yield s, tv, cv, py


def _chosen(cell: Cell, passed_over: list[str], on_default: Cell | None, default_flavor: str) -> Cell:
    """``cell`` with notes saying why the default policy did not pick something newer or the default flavor."""
    notes = list(cell.notes)
    if cell.flavor != default_flavor and on_default is not None and on_default.problems:
        notes.append(f"flavor {cell.flavor} (no --flavor given): {default_flavor} cannot build it"
                     f" ({on_default.problems[0]})")
    if passed_over:
        notes.append(f"newest torch {cell.recipe.name} {cell.version.version} can build; newer ones cannot: "
                     + "; ".join(passed_over))
    return replace(cell, notes=tuple(notes))


def parse_archs(values: Sequence[str] | None, fallback: str) -> list[ArchList]:
    if not values:
        return [parse_arch_list(fallback)]
    return [parse_arch_list(v) for v in values]


__all__ = [
    "DEFAULT_DOCKERFILE_FRONTEND", "POLICY_AXES", "candidates", "choose_cell", "default_policy", "defaults", "device_requests",
    "device_rows", "expand", "fallback_flavors", "gpu_checked", "image_for", "make_cell", "native_cell", "offline", "offline_problems", "on_fallback", "parse_archs",
    "policy_clauses", "windows_plan", "with_gpu_check", "with_layout", "with_offline",
]
