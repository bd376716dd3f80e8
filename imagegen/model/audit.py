"""The gencode audit: what a cell's build would really compile, read before anything compiles.

The in-build script's ``audit`` step (shipped/builder/imagegen_audit.py) runs the package's own
build with stand-in compilers that record instead of compile, and reports per extension the SASS and
PTX targets and the nvcc flags. This module reads that report and judges it against the request,
the recipe and nvcc:

- **refuse** a cell whose build would compile a kernel for an arch it cannot target (the recipe's
  ``extensions`` knowledge, e.g. SageAttention's wgmma kernels only for sm_90a), hand nvcc an arch it
  does not support (compute_70 on CUDA 13), stop in the package's own checks, compile no CUDA code
  at all, or leave a requested arch out of every extension (the wheel could not run there);
- **warn**, naming the extension, when an extension lacks a requested arch it could take, or the
  build compiles archs nobody asked for (a hard-coded list that ignores ``--arch``);
- judge each extension's C++ standard (the ``-std`` / ``/std:`` its compiles pass, nvcc's and the host
  compiler's) against the cell's torch: refuse one its headers ``#error`` under (C++17 with torch
  2.14), warn about one older than torch's own default (C++17 with torch 2.12/2.13);
- refuse an extension whose **header probe** failed: the script ran the real compilers on torch's
  headers with that extension's recorded flags, and the compiler's first error line says why
  (torch 2.14's ``#error`` below C++20, a CUDA toolkit without ``cusparse.h``);
- refuse an extension whose link asks for a library the linker will not find (``-lcuda`` with no
  driver), or that includes from a folder missing or empty inside a git submodule of the tree (a
  checkout without ``--recursive``); warn of such a folder elsewhere in the tree.

The report and the verdict as data: imagegen.model.audit_report. The verdict and the table go into
``imagegen plan --audit`` and the cell's manifest. Rules over data, as the rest of model/: the executors
run the audit (in the builder image, or this host's Python for a native build) and judge it here.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping, Sequence

from packaging.version import Version

from imagegen.model.cell_rules import cc_key, covers
from imagegen.errors import CompatError
from imagegen.model.arch import ArchList, CudaArch
from imagegen.model.arch_rules import nvcc_problems
from imagegen.model.compat import TorchSeries
from imagegen.model.cxx_std import judge as judge_std
from imagegen.model.audit_report import MAX_TEXT, AuditReport, ExtensionAudit, Verdict
# Which extensions a list builds at all (the smoke test's modules follow the same rule: Cell.smoke).
from imagegen.shipped.builder.imagegen_rules import routed_builds

# --------------------------------------------------------------------------------------------
# Judging


def _ccs(archs: ArchList) -> set[str]:
    return {a.cc for a in archs}


def _fmt(v: Version) -> str:
    return f"{v.major}.{v.minor}"


def judge(report: AuditReport, *, recipe_name: str, version_label: str, requested: ArchList, nvcc: Version,
          extension_archs: Mapping[str, ArchList] | None = None, force_hint: str | None = None,
          torch: TorchSeries | None = None, own_build: str | None = None) -> Verdict:
    """Judge what the build would compile (``report``) against the request.

    ``requested``: what the built .so must carry (the request mapped through the recipe's ``emits``
    and arch families: plan.Cell.expected_archs). ``extension_archs``: the recipe's per-extension
    arch knowledge. ``nvcc``: the toolkit the build uses. ``torch``: the series whose headers every
    compile includes, to judge each extension's C++ standard against (None: not judged). ``own_build``:
    the file of a user's own tree that sets its flags (setup.py), where no recipe of imagegen's exists to
    fix: the fix texts name the edit to that file instead of a recipe fix.
    """
    name = f"{recipe_name} {version_label}"
    extension_archs = extension_archs or {}
    refusals: list[str] = []
    warnings: list[str] = []
    notes: list[str] = []
    if not report.ok:
        why = _best_error(report.error_lines)
        refusals.append(f"{name}: its own build stops before compiling anything (exit {report.exit}): {why}"
                        " (this is the package's build with the flags imagegen would pass; --no-audit skips the audit)")
        return Verdict(report, tuple(refusals), tuple(warnings), tuple(notes))
    # The C++ standard of each extension against torch's headers first: a probe failing on that same
    # standard (torch's #error) then only confirms it, and says so in a note instead of a second refusal.
    std_refused = _judge_std(report, torch, refusals, warnings, own_build) if torch is not None else set()
    _judge_probe(report, refusals, warnings, notes, std_refused, own_build)
    _judge_link(report, refusals)
    _judge_includes(report, refusals, warnings)
    cuda_exts = [e for e in report.extensions if e.compiles_cuda]
    if not cuda_exts:
        hint = f" ({force_hint})" if force_hint else ""
        refusals.append(f"{name}: the build compiles no CUDA code: every extension is host-only or none is built"
                        f"{hint}; the wheel would have no kernels")
        return Verdict(report, tuple(refusals), tuple(warnings), tuple(notes))
    if report.unlinked:
        notes.append(f"{report.unlinked} nvcc compile(s) not linked into any extension were not judged")

    covered: dict[str, list[str]] = {}  # requested target -> extensions that carry it
    for ext in cuda_exts:
        targets = ext.targets
        # 1. nvcc must support every target it is handed.
        bad_nvcc: dict[str, list[str]] = {}
        for t in targets:
            for p in nvcc_problems(ArchList([t]), nvcc):
                bad_nvcc.setdefault(p, []).append(str_target(t))
        for p, named in bad_nvcc.items():
            flags = ", ".join(f"-gencode arch=compute_{t_code(t)},code={t}" for t in dict.fromkeys(named))
            edit = f": drop {flags} from {own_build}" if own_build else ""
            refusals.append(f"{ext.module}: the build hands nvcc {_fmt(nvcc)} a target it cannot compile: {p}{edit}")
        # 2. The recipe's knowledge of what this extension's kernels can target.
        allowed = extension_archs.get(ext.module)
        if allowed is not None:
            outside = [str_target(t) for t in targets if t.cc not in _ccs(allowed)]
            if outside:
                refusals.append(
                    f"{ext.module} would be compiled for {', '.join(outside)}: its kernels target only"
                    f" {', '.join(sorted(_ccs(allowed), key=cc_key))} ({recipe_name}'s recipe), so nvcc/ptxas would fail;"
                    f" the recipe's per-extension arch routing is missing for this version")
            # A plain target where the kernels need the arch-specific one (wgmma/setmaxnreg exist
            # only on sm_90a): nvcc compiles it, but the kernels become traps that fail at run time.
            plain = [t for t in targets if t.cc in _ccs(allowed) and not t.variant
                     and all(a.variant for a in allowed if a.cc == t.cc)]
            for t in plain:
                need = sorted({a.variant for a in allowed if a.cc == t.cc})
                refusals.append(
                    f"{ext.module} would be compiled for {str_target(t)}: its kernels need"
                    f" {' or '.join(str_target(t) + v for v in need)} ({recipe_name}'s recipe);"
                    f" for plain {str_target(t)} they build as traps that fail at run time: ask for {t.cc}{need[0]}")
        for o in ext.other:
            if o.startswith("default"):
                warnings.append(f"{ext.module}: nvcc gets no arch flag and compiles its own default arch, ignoring --arch")
            elif o.startswith("special"):
                warnings.append(f"{ext.module}: nvcc is asked for {o.split(':', 1)[1]!r} archs, not the requested list")
        # 3. Requested archs this extension carries, or should.
        for want in requested:
            if allowed is not None and not routed_builds(_ccs(allowed), [want.cc]):
                continue  # this extension's kernels do not exist for that arch: not missing
            have = _carries(ext, want)
            for label, ok in have.items():
                covered.setdefault(label, [])
                if ok:
                    covered[label].append(ext.module)
        # 4. Archs nobody asked for.
        extra = [str_target(t) for t in targets if not _requested(t, requested)]
        if extra:
            warnings.append(f"{ext.module} compiles {', '.join(dict.fromkeys(extra))}, not requested:"
                            " a hard-coded arch list that ignores --arch"
                            + (f" (edit {own_build}: leave the -gencode flags to TORCH_CUDA_ARCH_LIST)" if own_build else ""))
    for want in requested:
        for label, ok_exts in ((lbl, covered.get(lbl, [])) for lbl in _labels(want)):
            eligible = [e for e in cuda_exts if extension_archs.get(e.module) is None
                        or routed_builds(_ccs(extension_archs[e.module]), [want.cc])]
            missing = [e.module for e in eligible if e.module not in ok_exts]
            if not ok_exts:
                refusals.append(f"{name}: no extension would carry {label} (requested): the build ignores --arch"
                                f" for it; it compiles {_all_targets(cuda_exts) or 'nothing'}"
                                + (f" (edit {own_build}: add {label}, or leave the -gencode flags to"
                                   " TORCH_CUDA_ARCH_LIST)" if own_build else ""))
            elif missing:
                warnings.append(f"{', '.join(missing)} would not carry {label} (requested); "
                                f"{', '.join(ok_exts)} would")
    return Verdict(report, tuple(dict.fromkeys(refusals)), tuple(dict.fromkeys(warnings)), tuple(notes))


_MISSING_HEADER = re.compile(r"(?:fatal error|catastrophic error): (?:cannot open source file \"?)?([\w./+-]+\.h(?:pp)?)\b")
_NEEDS_STD = re.compile(r"C\+\+(\d\d) or later")
# Headers torch's CUDA headers include that a minimal CUDA toolkit (nvcc and the runtime only) lacks.
_TOOLKIT_PARTS = {"cusparse.h": "cusparse", "cublas_v2.h": "cublas", "cublasLt.h": "cublas", "cublas.h": "cublas",
                  "cusolverDn.h": "cusolver", "cusolver_common.h": "cusolver", "cufft.h": "cufft",
                  "curand.h": "curand", "nvrtc.h": "nvrtc", "cudnn.h": "cudnn", "nccl.h": "nccl",
                  "nvToolsExt.h": "nvtx", "cudss.h": "cudss"}


def probe_fix(error: str, own_build: str | None = None) -> str:
    """What to do about a header probe's first error line ("" when it says nothing we know); ``own_build``:
    the file of a user's own tree to edit (judge)."""
    m = _NEEDS_STD.search(error)
    if m and own_build:
        return f"edit {own_build}: build with -std=c++{m.group(1)} (or drop its -std flag: torch then picks the standard)"
    if m:
        return (f"build with -std=c++{m.group(1)} (a recipe fix: by_torch patch, or the package's release that picks"
                " the standard from torch)")
    m = _MISSING_HEADER.search(error)
    if m:
        header = m.group(1).rsplit("/", 1)[-1]
        part = _TOOLKIT_PARTS.get(header)
        if part:
            return (f"the CUDA toolkit (CUDA_HOME) has no {header}: install its {part} headers"
                    f" (the toolkit's {part} development package, or the nvidia-{part} wheel's include/ on the include path)")
        return f"{header} is not on the include path: install what provides it"
    return ""


def _judge_std(report: AuditReport, torch: TorchSeries, refusals: list[str], warnings: list[str],
               own_build: str | None = None) -> set[str]:
    """Every extension includes torch's headers (host-only ones too): a standard they #error under fails
    the build at its first compile. One line per standard, naming the extensions that use it; returns
    the refused extensions."""
    by_std: dict[str, list[ExtensionAudit]] = {}
    for ext in report.extensions:
        if ext.lowest_std is not None:
            by_std.setdefault(ext.lowest_std.flag, []).append(ext)
    refused: set[str] = set()
    for exts in by_std.values():
        modules = [e.module for e in exts]
        what = modules[0] if len(modules) == 1 else f"{', '.join(modules)}: each"
        std = exts[0].lowest_std
        # A user's own tree: the edit to its file (no recipe of imagegen's to fix); else the default fix.
        fix = (f"edit {own_build}: {std.flag} -> -std=c++{torch.min_cxx_std(False)} (or drop it: torch then picks"
               " the standard)" if own_build else "")
        found = judge_std(what, std, torch, fix=fix)
        if found is None:
            continue
        if found.kind == "refuse":
            refusals.append(found.text)
            refused.update(modules)
        else:
            warnings.append(found.text)
    return refused


_CMAKE_CUDA20 = re.compile(r'language dialect "CUDA20".*does not know the flags')


def cmake_fix(error: str) -> str:
    """A CMake error we know, said short with what to do ("" for any other: it is shown as CMake wrote it)."""
    if _CMAKE_CUDA20.search(error):
        # CMake learnt nvcc's -std=c++20 in 3.26 (Modules/Compiler/NVIDIA-CUDA.cmake); torch >= 2.12's CMake
        # config asks for CUDA at the C++ standard of the build, 20 once a recipe's C++20 patch sets it.
        return ("CMake: language dialect \"CUDA20\" unknown to this CMake (nvcc's C++20 flag came in CMake 3.26): put"
                " CMake 3.26 or newer first on PATH, e.g. pip install 'cmake>=3.26' into the build's venv")
    return ""


def link_fix(name: str) -> str:
    """What to do about a library the link would not find."""
    if name == "cuda":
        return ("libcuda.so is the GPU driver's, absent on a host without one (a CPU builder, a pypi toolkit):"
                " in a builder image the recipe's `links_libcuda: true` puts a stub libcuda.so on LIBRARY_PATH;"
                " natively, put a folder holding one on LIBRARY_PATH (the toolkit's lib64/stubs, or build where"
                " the driver is installed)")
    return f"install what provides lib{name}.so, or put its folder on LIBRARY_PATH"


def _judge_link(report: AuditReport, refusals: list[str]) -> None:
    """Refuse each extension whose link asks for a library the linker would not find: the compile
    would pass and the build stop at its last step (`cannot find -lNAME`)."""
    by_library: dict[str, list[str]] = {}
    for ext in report.extensions:
        for name in ext.link_missing:
            by_library.setdefault(name, []).append(ext.module)
    for name, modules in by_library.items():
        refusals.append(f"{', '.join(dict.fromkeys(modules))}: its link asks for -l{name}, which the linker will not"
                        f" find (not in the link's -L folders, LIBRARY_PATH or the compiler's own search): the build"
                        f" would stop at `cannot find -l{name}`; {link_fix(name)}")


def _judge_includes(report: AuditReport, refusals: list[str], warnings: list[str]) -> None:
    """Refuse each extension that includes from a folder missing or empty inside a git submodule of the
    tree (.gitmodules: a checkout without its submodules; every compile that includes from there fails);
    warn of one missing or empty elsewhere in the tree (a -I the build may not need)."""
    by_folder: dict[tuple[str, str, str], list[str]] = {}
    for ext in report.extensions:
        for m in ext.include_missing:
            by_folder.setdefault((m.path, m.state, m.submodule), []).append(ext.module)
    for (path, state, submodule), modules in by_folder.items():
        who = ", ".join(dict.fromkeys(modules))
        if submodule:
            refusals.append(f"{who}: its include folder {path} is {state}, inside the git submodule {submodule}"
                            f" (.gitmodules): the tree has not got its submodules, and a compile that includes from"
                            f" there fails (`No such file or directory`): run `git submodule update --init --recursive`"
                            f" in the tree, or build from the recipe's source (imagegen fetches its submodules)")
        else:
            warnings.append(f"{who}: its include folder {path} is {state} in the tree: a compile that includes from"
                            f" it will fail (`No such file or directory`)")


def _judge_probe(report: AuditReport, refusals: list[str], warnings: list[str], notes: list[str],
                 std_refused: set[str] = frozenset(), own_build: str | None = None) -> None:
    """Refuse each extension whose header probe failed, one line per failure (extensions that share a
    flag set share the line); note probes that could not run. nvcc's probe includes
    ATen/cuda/CUDAContext.h: an error there (a toolkit without cusparse.h) is a warning when the
    package's own sources include no ATen/cuda/ header (the build may never need it). A failure on the
    C++ standard of extensions the standard check refused already (``std_refused``) is a note."""
    failed: dict[tuple[str, str], list[str]] = {}
    not_run: dict[tuple[str, str], list[str]] = {}
    for ext in report.extensions:
        for p in ext.probe:
            if p.ok is False:
                failed.setdefault((p.compiler, p.error), []).append(ext.module)
            elif p.ok is None:
                not_run.setdefault((p.compiler, p.error), []).append(ext.module)
    for (compiler, error), modules in failed.items():
        fix = probe_fix(error, own_build)
        what = ", ".join(dict.fromkeys(modules))
        if _NEEDS_STD.search(error) and set(modules) <= std_refused:
            notes.append(f"header probe with {compiler} for {what} confirms the standard: {error}")
            continue
        if error.startswith("ATen/cuda/") and report.probe_aten_cuda is False:
            warnings.append(f"{what}: ATen/cuda/CUDAContext.h does not compile with {compiler} and the build's own flags"
                            f" (header probe): {error}" + (f"; {fix}" if fix else "")
                            + "; the package's sources include no ATen/cuda/ header, so its build may not need it")
            continue
        refusals.append(f"{what}: torch's headers do not compile with {compiler} and the build's own flags (header"
                        f" probe): {error or 'no error line'}" + (f"; {fix}" if fix else "")
                        + " (IMAGEGEN_AUDIT_PROBE=0 skips the probe)")
    for (compiler, error), modules in not_run.items():
        notes.append(f"header probe with {compiler} for {', '.join(dict.fromkeys(modules))} did not run: {error}")
    mode = report.probe_mode
    if mode == "off":
        notes.append("header probe skipped (IMAGEGEN_AUDIT_PROBE=0)")
    elif mode and not failed:
        probed = sum(1 for e in report.extensions if e.probe)
        what = "parsed" if mode == "full" else "preprocessed"
        notes.append(f"header probe: torch's headers {what} with the flags of {probed} extension(s) in"
                     f" {report.probe_seconds:.1f} s" if probed else "header probe: no C++ or CUDA compile to probe")


def str_target(t: CudaArch) -> str:
    return t.sm if t.sass else t.compute


def t_code(target: str) -> str:
    """sm_70 / compute_70 -> 70."""
    return target.split("_", 1)[-1]


def _labels(want: CudaArch) -> list[str]:
    out = []
    if want.sass:
        out.append(want.sm)
    if want.ptx:
        out.append(want.compute)
    return out


def _carries(ext: ExtensionAudit, want: CudaArch) -> dict[str, bool]:
    targets = ext.targets
    out = {}
    if want.sass:
        out[want.sm] = any(t.sass and covers(t, want) for t in targets)
    if want.ptx:
        out[want.compute] = any(t.ptx and t.number == want.number and t.variant == want.variant for t in targets)
    return out


def _requested(t: CudaArch, requested: ArchList) -> bool:
    if t.sass:
        return any(w.sass and t.number == w.number and t.variant == w.variant for w in requested) \
            or any(w.sass and covers(t, w) for w in requested)
    return any(w.ptx and t.number == w.number for w in requested) or any(t.number == w.number for w in requested)


def _all_targets(exts: Sequence[ExtensionAudit]) -> str:
    seen: dict[str, None] = {}
    for e in exts:
        for x in (*e.sass, *e.ptx):
            seen[x] = None
    return ", ".join(seen)


_PY_EXC = re.compile(r"^\s*(\w+(?:Error|Exception)): (.+)$")
_PIP_NOISE = re.compile(r"subprocess-exited-with-error|metadata-generation-failed|Encountered error|"
                        r"originates from a subprocess|^Traceback|finished with status|See above")


def _best_error(lines: Sequence[str]) -> str:
    """The line that says why: CMake's own error (its reason folded in by the build script), else the
    package's own exception (RuntimeError: CUDA 12.8 or higher is required ...) before pip's wrapping
    lines; a CMake error gets what to do about it where we know (cmake_fix)."""
    for line in reversed(lines):
        if line.startswith("CMake Error"):
            return (cmake_fix(line) or line)[:MAX_TEXT]
    for line in reversed(lines):
        m = _PY_EXC.match(line)
        if m:
            return f"{m.group(1)}: {m.group(2)}"[:MAX_TEXT]
    useful = [ln for ln in lines if not _PIP_NOISE.search(ln)]
    return (useful[-1] if useful else (lines[-1] if lines else "no output"))[:MAX_TEXT]


def own_build_file(recipe: Any) -> str | None:
    """The file that sets a user's own tree's build flags (setup.py, else pyproject.toml), when ``recipe``
    is such a tree (--source on a project no recipe knows: source_tree.recipe_from_source_tree names the
    recipe by the tree's path); None for a catalogue recipe, a fork of one included (its recipe is fixed)."""
    root = recipe.source_path
    if recipe.source_kind != "local" or root is None or recipe.path != str(root):
        return None
    tree = Path(root) / (recipe.subdir or "")
    return next((f for f in ("setup.py", "pyproject.toml") if (tree / f).is_file()), "its build files")


def judge_cell(report: AuditReport, cell: Any) -> Verdict:
    """judge() with everything taken from a plan cell."""
    force = ", ".join(f"{k}={v}" for k, v in cell.recipe.force_env.items())
    hint = f"the recipe sets {force}" if force else "a CUDA build usually needs FORCE_CUDA=1 or the package's force-build variable"
    return judge(report, recipe_name=cell.recipe.name, version_label=cell.version.version, requested=cell.expected_archs,
                 nvcc=Version(_fmt(Version(str(cell.nvcc)))), extension_archs=cell.version.extensions, force_hint=hint,
                 torch=cell.torch, own_build=own_build_file(cell.recipe))


def refuse(cell: Any, verdict: Verdict) -> CompatError:
    return CompatError(f"cannot build {cell.describe()}: the gencode audit refuses it: " + "; ".join(verdict.refusals))


__all__ = ["cmake_fix", "judge", "judge_cell", "link_fix", "own_build_file", "probe_fix", "refuse"]
