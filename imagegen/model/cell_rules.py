"""The rules a cell must pass, each failure a reason said before anything compiles: torch x CUDA x
Python, the recipe's own version rules, nvcc x arch, package x arch, the base image x CUDA; and
which archs a package really compiles for a request."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from packaging.version import Version

from imagegen.model import compat
from imagegen.model.arch import ArchList, CudaArch
from imagegen.model.arch_format import as_tuples
from imagegen.model.arch_parse import parse_arch_list
from imagegen.model.arch_rules import nvcc_problems, torch_problems
from imagegen.model.base_images import BaseImage
from imagegen.model.compat import CudaVariant, TorchSeries
from imagegen.model.cxx_std import CxxStd, judge, standard_year
from imagegen.model.recipes import Recipe, RecipeVersion, Rule, SmokeTest
from imagegen.shipped.builder import imagegen_rules as rules


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


def extension_routes(version: RecipeVersion) -> dict[str, list[str]]:
    """The recipe's per-extension routing as the build applies it: extension module -> the compute
    capabilities its kernels target (SageAttention 2.2.0: _qattn_sm90 -> 9.0, _qattn_sm89 -> 8.9,
    9.0, 12.0). A module the recipe does not route takes every arch."""
    return {module: sorted({a.cc for a in archs}, key=cc_key) for module, archs in version.extensions.items()}


def builds_extension(version: RecipeVersion, module: str, expected: ArchList) -> bool:
    """Does a build whose .so must carry ``expected`` (expected_archs) build ``module`` at all? A
    routed extension only where one of its ccs is asked for (the package leaves it out otherwise:
    SageAttention builds _qattn_sm90 only for 9.0); every other one always. The gencode audit
    judges coverage by this rule and the smoke test imports by it (imagegen_rules.routed_builds)."""
    route = extension_routes(version).get(module)
    return route is None or rules.routed_builds(route, [a.cc for a in expected])


def smoke_for(version: RecipeVersion, smoke: SmokeTest, expected: ArchList) -> SmokeTest:
    """``smoke`` with only the modules a build for ``expected`` installs: a routed extension the
    list leaves out is not imported (SageAttention's ``--arch 12.0+PTX`` has no _qattn_sm90). The
    plan resolves it once per cell (Cell.smoke); every smoke step takes that."""
    routes = extension_routes(version)
    if not routes:
        return smoke
    ccs = [a.cc for a in expected]
    return replace(smoke, imports=tuple(rules.smoke_modules(smoke.imports, routes, ccs)),
                   driver_imports=tuple(rules.smoke_modules(smoke.driver_imports, routes, ccs)))


def routed_smoke_modules(version: RecipeVersion, smoke: SmokeTest) -> list[dict]:
    """The recipe's smoke modules whose extension it routes (SageAttention's _qattn_sm90: 9.0 only), each
    with the ccs its kernels target and whether it needs the driver: what the builder's smoke step resolves
    again, by the same rule, for a build of another list than the planned one (a bake --set, the GPUs
    `docker run --gpus all` sees; imagegen_check.smoke_lists). Empty where nothing is routed."""
    routes = extension_routes(version)
    return [{"module": m, "driver": driver, "ccs": routes[m]}
            for driver, modules in ((False, smoke.imports), (True, smoke.driver_imports))
            for m in modules if m in routes]


def compiled_targets(version: RecipeVersion, archs: ArchList, nvcc: Version) -> int:
    """How many -gencode outputs (SASS + PTX) a build of ``version`` for ``archs`` compiles with ``nvcc``.

    A fixed-arch package compiles its whole list whatever was asked (flash-attn 3: sm_80 and sm_90a for
    ``--arch 9.0``), where ``expected_archs`` keeps only what covers the request; every other package
    compiles ``archs`` as compiled_archs left it (``emits`` renames a target, it adds none)."""
    knob = version.arch
    return knob.fixed_for(nvcc).gencode_targets if knob.style == "fixed" else archs.gencode_targets


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


def python_problems(series: TorchSeries, python: str) -> list[str]:
    if not series.supports_python(python):
        lo, hi = series.python
        return [f"torch {series.series} supports Python {lo}-{hi}; Python {python} selected"]
    return []


_SUBJECT = {"torch": "torch", "cuda": "CUDA", "python": "Python"}


@dataclass(frozen=True)
class FixWords:
    """How a cell's reasons say their fix, in the words of the command that planned the cell: the flags
    it takes for the torch, CUDA and Python axes ("use --torch {}"), or, for a native build whose torch,
    CUDA and Python are this host's, what to install. ``arch``: offer the archs that would build
    (--arch) where an arch needs a newer CUDA."""

    torch: str = "use --torch {}"
    cuda: str = "use --cuda {}"
    python: str = "use --python {}"
    version: str = "--version"
    arch: bool = False

    def use(self, subject: str, values: str) -> str:
        return getattr(self, subject).format(values)


FLAGS = FixWords()  # plan, bake, build, render (--shell too): the axes are flags
# `imagegen build --native` / `plan --audit --native`: torch, CUDA and Python are the host's (the
# --torch/--cuda/--python given must match them); --python-exe picks another interpreter.
HOST = FixWords(torch="install torch {} (a native build uses this host's torch)",
                cuda="install CUDA {} (its nvcc, and a torch built for it)",
                python="use --python-exe with a Python {}", arch=True)


def _rule_value(subject: str, series: TorchSeries, torch_version: str, nvcc: Version,
                python: str) -> tuple[Version, Version]:
    """(series X.Y, exact release) of the cell for one rule subject."""
    if subject == "torch":
        return Version(series.series), Version(Version(torch_version).public)
    if subject == "cuda":
        return nvcc, nvcc
    return Version(python), Version(python)


def rule_problems(recipe: Recipe, version: RecipeVersion, series: TorchSeries, torch_version: str,
                   cuda: CudaVariant, nvcc: Version, python: str, fixes: FixWords = FLAGS) -> list[str]:
    """One reason per torch/CUDA/Python range (recipe-wide or the version's) the cell is outside of."""
    out = []
    shown = {"torch": f"torch {series.series}", "cuda": f"CUDA {fmt_version(nvcc)} ({cuda.name})", "python": f"Python {python}"}
    for rule in recipe.rules(version):
        if rule.allows(*_rule_value(rule.subject, series, torch_version, nvcc, python)):
            continue
        why = f" ({rule.why})" if rule.why else ""
        out.append(f"{recipe.name} {version.version} needs {_SUBJECT[rule.subject]} {rule.text}{why};"
                   f" {shown[rule.subject]} selected: {_rule_fix(recipe, version, rule, series, torch_version, nvcc, python, fixes)}")
    return out


def _rule_fix(recipe: Recipe, version: RecipeVersion, rule: Rule, series: TorchSeries, torch_version: str,
              nvcc: Version, python: str, fixes: FixWords = FLAGS) -> str:
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
        if len(ok) > 1 and labels[-len(ok):] == ok:
            parts.append(fixes.use(rule.subject, f"{ok[0]} or newer"))
        elif len(ok) > 1 and labels[:len(ok)] == ok:
            parts.append(fixes.use(rule.subject, f"{ok[-1]} or older"))
        else:
            parts.append(fixes.use(rule.subject, " or ".join(ok[:4])
                                   + (" (or another listed by imagegen plan)" if len(ok) > 4 else "")))
    value = _rule_value(rule.subject, series, torch_version, nvcc, python)
    for other in recipe.versions.values():
        # By label: a cell's version is the pin with its torch's facts applied (RecipeVersion.for_torch).
        if other.version != version.version and all(r.allows(*value) for r in recipe.rules(other) if r.subject == rule.subject):
            parts.append(("or " if parts else "use ") + f"{fixes.version} {other.version}")
            break
    return ", ".join(parts) if parts else f"no {_SUBJECT[rule.subject]} in imagegen's tables satisfies it"


def cxx_std_problems(recipe: Recipe, version: RecipeVersion, series: TorchSeries, *,
                     msvc: bool = False, fixes: FixWords = FLAGS) -> tuple[list[str], list[str]]:
    """Whether the C++ standard ``version``'s build hard-codes (recipe: ``cxx_std``, with the cell's
    by_torch facts applied) compiles ``series``' headers: (problems, notes). Below the series' minimum
    the cell is refused, naming the torch releases that still take it; below torch's own default it
    builds, with a note. ``msvc``: a Windows cell (MSVC's minimum)."""
    if version.cxx_std is None:
        return [], []
    flag = f"/std:c++{version.cxx_std}" if msvc else f"-std=c++{version.cxx_std}"
    std = CxxStd(standard_year(version.cxx_std), flag)
    fits = [s.series for s in compat.torch_table().values() if not std.below(s.min_cxx_std(msvc))]
    older = fixes.use("torch", f"{fits[-1]} or older") + ", or " if fits and cc_key(fits[-1]) < series.key else ""
    fix = (f"{older}give the recipe's version a by_torch entry for torch {series.series} with a patch that"
           f" raises the standard (and cxx_std: {series.min_cxx_std(msvc)})")
    found = judge(f"{recipe.name} {version.version} (recipe: cxx_std {version.cxx_std})", std, series, msvc=msvc, fix=fix)
    if found is None:
        return [], []
    return ([found.text], []) if found.kind == "refuse" else ([], [found.text])


def torch_cuda_problems(series: TorchSeries, cuda: CudaVariant) -> list[str]:
    if cuda.name not in series.cuda:
        return [f"torch {series.series} has no {cuda.name} build (it has {', '.join(series.cuda)})"]
    return []


def recipe_problems(recipe: Recipe, version: RecipeVersion, series: TorchSeries, cuda: CudaVariant,
                     archs: ArchList, nvcc: Version, fixes: FixWords = FLAGS) -> list[str]:
    out: list[str] = []
    knob = version.arch
    if knob.style == "fixed":
        fixed = knob.fixed_for(nvcc)
        for a in archs:
            if not any(covers(f, a) for f in fixed):
                out.append(f"{recipe.name} {version.version} does not compile sm_{a.code} with CUDA {fmt_version(nvcc)}"
                           f" (it always builds its own list: {fixed or 'nothing'})")
        if archs.has_ptx and knob.ptx == "none":
            out.append(f"{recipe.name} {version.version} never embeds PTX; drop +PTX")
        return out
    supported = {a.cc: a for a in version.archs}
    for a in archs:
        s = supported.get(a.cc)
        if s is None:
            out.append(f"{recipe.name} {version.version} does not support sm_{a.number}"
                       f" (it supports {', '.join(sorted(supported, key=cc_key))}){_other_versions_hint(recipe, version, a, fixes)}")
        elif a.variant == "f" and s.variant != "f":
            out.append(f"{recipe.name} {version.version} cannot build family target {a}; ask for {a.cc} instead")
        if a.sass is False and a.ptx and knob.style in ("numeric", "dotted"):
            out.append(f"{recipe.name} reads {knob.env} as SASS targets; a PTX-only entry {a} cannot be expressed")
        min_cuda = version.min_cuda_by_arch.get(a.cc)
        if min_cuda and nvcc < min_cuda:
            out.append(f"{recipe.name} {version.version} needs CUDA >= {min_cuda} for sm_{a.number}; CUDA {fmt_version(nvcc)} selected")
    if archs.has_ptx:
        if knob.ptx == "none":
            out.append(f"{recipe.name} {version.version} never embeds PTX ({knob.env} takes SASS targets only); drop +PTX")
        elif knob.ptx == "newest" and any(a.ptx for a in archs if a.key != archs.newest.key):
            out.append(f"{recipe.name} {version.version} embeds PTX only for the newest arch ({archs.newest.cc}); ask +PTX only there")
    if archs and knob.style == "torch" and knob.env == "TORCH_CUDA_ARCH_LIST" and knob.parser == "torch":
        out.extend(torch_problems(archs, series.latest))
    return out


def _other_versions_hint(recipe: Recipe, version: RecipeVersion, a: CudaArch, fixes: FixWords = FLAGS) -> str:
    others = [v.version for v in recipe.versions.values() if v.version != version.version and any(x.cc == a.cc for x in v.archs)]
    return f"; version {others[0]} does ({fixes.version} {others[0]})" if others else ""


def cc_key(cc: str) -> tuple[int, int]:
    major, minor = cc.split(".")
    return int(major), int(minor)


def fmt_version(v: Version) -> str:
    return f"{v.major}.{v.minor}"


def nvcc_problems_for(archs: ArchList, nvcc: Version, cuda: CudaVariant, fixes: FixWords = FLAGS) -> list[str]:
    out = []
    # With fixes.arch: the archs this CUDA compiles, offered as the --arch that builds here.
    rest = ArchList([a for a in archs if not nvcc_problems(ArchList([a]), nvcc)])
    for p in nvcc_problems(archs, nvcc):
        p = p.replace(f"CUDA {fmt_version(nvcc)} selected", f"CUDA {fmt_version(nvcc)} ({cuda.name}) selected")
        need = _NEEDS.search(p)
        if need and "(" not in p.split("selected", 1)[-1]:
            p += ": " + fixes.use("cuda", f"{need.group(1)} or newer")
            if fixes.arch and len(rest):
                p += f", or build the others: --arch '{rest}'"
        out.append(p)
    return out


_NEEDS = re.compile(r"needs CUDA >= (\d+\.\d+)")


def runs_on_device(arch: CudaArch, cc: str) -> bool:
    """Whether ``arch``'s code runs on a GPU of compute capability ``cc``: its SASS on the same major at
    an equal or higher minor (exactly its own for an `a` variant, the family for an `f` one), its PTX
    (JIT-compiled by the driver) on any GPU at least as new."""
    major, minor = (int(p) for p in cc.split("."))
    if arch.ptx and (major, minor) >= (arch.major, arch.minor):
        return True
    if not arch.sass or major != arch.major:
        return False
    return minor == arch.minor if arch.variant == "a" else minor >= arch.minor


def base_problems(base: BaseImage, cuda: CudaVariant, archs: ArchList | None = None) -> list[str]:
    out = []
    if base.runs_on and archs is not None:
        others = [a.cc for a in archs if not any(runs_on_device(a, cc) for cc in base.runs_on)]
        if others:
            out.append(f"{base.ref} is for {base.device}, whose GPUs are {', '.join(base.runs_on)}: code for"
                       f" {', '.join(others)} never runs there; use --arch {';'.join(base.runs_on)}")
    if base.nvcc is not None and base.nvcc.major != cuda.major:
        extra = ""
        if base.image_torch_cuda and base.image_torch_cuda != cuda.name:
            extra = f" (its preinstalled torch is a {base.image_torch_cuda} build)"
        where = "this host" if base.flavor.name == "native" else base.ref
        out.append(
            f"{where} has nvcc {fmt_version(base.nvcc)}{extra}, but torch {cuda.name} needs nvcc {cuda.major}.x"
            f" (nvcc's major must equal torch's CUDA major); use a CUDA {cuda.major}.x image or --cuda {base.nvcc.major}.x"
        )
    return out


_CODE = re.compile(r"(sm|compute)_(\d+)(\d)([af]?)")


def stated_flag_notes(version: RecipeVersion, series: TorchSeries, nvcc: Version, requested: ArchList, *,
                      msvc: bool = False) -> list[str]:
    """What an unchecked tree's setup.py states (RecipeVersion.stated), judged against one cell: a -std
    below what the cell's torch headers compile under, a -gencode target the cell's nvcc no longer has, and
    the requested archs its fixed list leaves out. Warnings, not refusals: the flags are read from string
    constants (a branch that never runs would name them too); `imagegen plan --audit` runs the build."""
    stated = version.stated
    if stated is None:
        return []
    out = []
    minimum = series.min_cxx_std(msvc)
    for n in stated.cxx_std:
        if CxxStd(standard_year(n), f"-std=c++{n}").below(minimum):
            out.append(f"warning: its setup.py passes -std=c++{n} and torch {series.series}'s headers need"
                       f" C++{minimum}: that build fails unless the flag goes (torch then picks the standard)")
    targets = []
    for code in stated.gencode:
        m = _CODE.fullmatch(code)
        if m is None:
            continue
        arch = CudaArch(int(m.group(2)), int(m.group(3)), m.group(4), sass=m.group(1) == "sm",
                        ptx=m.group(1) == "compute")
        targets.append(arch)
        if nvcc_problems(ArchList([arch]), nvcc):
            out.append(f"warning: its setup.py names -gencode {code}, which the nvcc of CUDA {nvcc} cannot"
                       f" compile: that build fails unless the target goes")
    if targets:
        missing = [a for a in requested if not any(t.cc == a.cc and t.variant == a.variant and t.sass for t in targets)]
        if missing:
            out.append(f"warning: its setup.py hard-codes its -gencode list, whatever --arch asks:"
                       f" {', '.join(f'sm_{a.code}' for a in missing)} not among them")
    return out
