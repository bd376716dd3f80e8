"""`imagegen plan`, `recipes` and `archs`: what would be built, and why not, before anything compiles."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from imagegen.plan import options, request
from imagegen.commands import common
from imagegen.errors import CompatError, ImagegenError, NothingToDoError, UsageError
from imagegen.model import compat
from imagegen.model.arch import ArchList
from imagegen.model.catalogue import Catalogue, load_catalogue
from imagegen.model.recipes import Recipe, RecipeVersion
from imagegen.outputs import output_folder
from imagegen.model.cell import BUILDABLE, DEFAULT_PLATFORM, Plan
from imagegen.plan.matrix import default_policy, device_rows


# What plan calls a buildable cell whose facts are assumed, not read: a local tree, a fork or a changed
# checkout (RecipeVersion.unchecked) that no audit has checked. It builds as a buildable cell does (plan's exit
# code and `build` are the same); `plan --audit` reads what it compiles.
UNCHECKED = "unchecked"


def plan_status(cell, *, audited: bool = False) -> str:
    """A cell's status as plan shows it: ``unchecked`` for a buildable cell of a tree nobody audited."""
    return UNCHECKED if cell.status == BUILDABLE and cell.version.unchecked and not audited else cell.status


def _cell_record(cell, *, audited: bool = False) -> dict:
    unchecked = plan_status(cell, audited=audited) == UNCHECKED
    return {
        "name": cell.name,
        "status": plan_status(cell, audited=audited),
        # Why the facts are unchecked, and what the tree's setup.py names (read without running it).
        "unchecked": cell.version.unchecked if unchecked else None,
        "recipe": cell.recipe.name,
        "version": cell.version.version,
        "torch": cell.torch_version,
        "cuda": cell.cuda.name,
        "python": cell.python,
        "platform": cell.platform,
        "archs": str(cell.archs),
        # What was asked; "archs" is what the package compiles for it (flash-attn: 8.6 -> 8.0).
        "requested_archs": str(cell.requested_archs),
        # The recipe's claim of what the wheel carries: not made for a tree nobody checked.
        "expected_archs": str(cell.expected_archs) if cell.status == BUILDABLE and not unchecked else None,
        "flavor": cell.flavor,
        "base_image": cell.base.ref if cell.base else None,
        # where pip gets torch: None for PyPI, the PyTorch index of the CUDA variant, a JetPack's own
        "torch_index_url": cell.torch_index_url,
        # image (the base image's torch, reused), venv, image-or-venv (a custom image), host (native)
        "torch_from": cell.torch_from if cell.status != "rejected" else None,
        "reasons": list(cell.problems),
        "notes": list(cell.notes),
        "wheel_dir": cell.wheel_dir,
    }


def _print_plan(plan: Plan, only: str | None) -> None:
    # --only buildable: every cell that can build, unchecked ones too; --only unchecked: those alone.
    cells = [c for c in plan.cells if only is None or c.status == only or plan_status(c) == only]
    # A PLATFORM column once a cell is not linux/amd64 (--platform): the same cell for two platforms
    # would otherwise read as one row twice.
    platforms = any(c.platform != DEFAULT_PLATFORM for c in cells)
    rows = [("STATUS", "RECIPE", "VERSION", "TORCH", "CUDA", "PY", *(("PLATFORM",) if platforms else ()), "ARCHS", "WHY")]
    for c in cells:
        why = "; ".join(c.problems) if c.problems else "; ".join(
            ([c.version.unchecked] if plan_status(c) == UNCHECKED else [])
            + ([f"{c.base.ref}: {c.torch_from_text()}"] if c.base else []) + list(c.notes))
        rows.append((plan_status(c), c.recipe.name, c.version.version, c.torch.series, c.cuda.name, c.python,
                     *((c.platform,) if platforms else ()), str(c.archs), why))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    out = sys.stdout
    for r in rows:
        out.write("  ".join(v.ljust(w) for v, w in zip(r, widths)) + "  " + r[-1] + "\n")
    unchecked = sum(plan_status(c) == UNCHECKED for c in plan.cells)
    about = f" ({unchecked} of them unchecked: `imagegen plan --audit` checks them)" if unchecked else ""
    out.write(f"\n{len(plan.buildable)} buildable{about}, {len(plan.rejected)} rejected, {len(plan.skipped)} skipped"
              f" of {len(plan.cells)} cells\n")


def _plan_json(plan: Plan, **extra) -> None:
    """plan --json: each cell's record and the counts ("buildable" counts every cell that can build,
    "unchecked" those of them no audit has checked)."""
    json.dump({**extra, "cells": [_cell_record(c) for c in plan.cells],
               "summary": {"buildable": len(plan.buildable),
                           "unchecked": sum(plan_status(c) == UNCHECKED for c in plan.cells),
                           "rejected": len(plan.rejected), "skipped": len(plan.skipped), "total": len(plan.cells)}},
              sys.stdout, indent=2)
    sys.stdout.write("\n")


def cmd_plan(args: argparse.Namespace) -> int:
    config = common.config(args)
    cat = common.catalogue(args, config)
    if args.audit:
        if args.resolve:
            raise UsageError("--resolve goes with a plain plan, not --audit (plan --resolve first, then --audit)")
        work = output_folder(args.work or Path(".imagegen"), "--work")
        return _plan_audit(args, common.resolved(args, config), cat, work)
    if args.native:
        return _plan_native(args, common.resolved(args, config), cat)
    for flag, value in (("--python-exe", args.python_exe), ("--src-dir", args.src_dir), ("--work", args.work)):
        if value:
            raise UsageError(f"{flag} goes with --native (plan the host's build with `imagegen plan --native`)")
    opts = common.resolved(args, config)
    plan = request.planned(opts, cat, common.lock(args))
    if args.resolve:
        from imagegen.plan.resolve import with_resolution
        plan = with_resolution(plan)
    if args.json:
        _plan_json(plan)
    else:
        _print_plan(plan, args.only)
        # The axes the default policy filled; a flavor whose images each serve one device (jetson) fills
        # torch, CUDA, Python and archs from its devices' rows instead (plan.device_requests).
        devices = bool(device_rows(opts.flavor))
        given = {"torch": opts.torch, "CUDA": opts.cuda, "Python": opts.python, "flavor": opts.flavor_given,
                 "archs": opts.arch_configured}
        unnamed = [axis for axis, value in given.items() if not value]
        if devices:
            unnamed = [axis for axis in unnamed if axis == "flavor"]
            print(f"{opts.flavor}: the axes not named come from its devices' rows (each JetPack's CUDA, Python, torch and GPUs)")
        if unnamed:
            print(f"{', '.join(unnamed)} not named: {default_policy(unnamed).split(': ', 1)[1]}")
    if not plan.buildable:
        raise NothingToDoError("no cell of this matrix can build; the reasons are listed above")
    return 0


NOT_AUDITED_NATIVE = ("not audited: `imagegen plan --audit --native` runs its build with stand-in compilers on this"
                      " host to check what it compiles")


def _plan_native(args: argparse.Namespace, opts: options.Options, cat: Catalogue) -> int:
    """plan --native without --audit: the one cell `imagegen build --native` would build on this host (its
    Python, torch and nvcc, checked against each other and the archs: a cell this host cannot build is
    the same one-line refusal, exit 3), planned from facts alone, and saying so. Nothing is fetched or run
    but the host's probe."""
    if args.work:
        raise UsageError("--work goes with --audit (a plan without it fetches and writes nothing)")
    if args.resolve:
        raise UsageError("--resolve plans container cells (a native build uses this host's torch as it is)")
    cell, host = common.native_cell(args, cat, opts)
    plan = Plan(cells=[cell])
    if args.json:
        _plan_json(plan, host=host.describe(), audited=False)
        return 0
    _print_plan(plan, args.only)
    print(f"this host: {host.describe()}")
    print(NOT_AUDITED_NATIVE)
    return 0


def _plan_audit(args: argparse.Namespace, opts: options.Options, cat: Catalogue, work: Path) -> int:
    """plan --audit: what each cell's own build would compile, judged before anything compiles; on
    this host (--native) or in each cell's builder image (the engine), where `imagegen build` runs it."""
    from imagegen.model.audit import refuse
    from imagegen.executors import native

    if args.native:
        cell, host = common.native_cell(args, cat, opts)
        verdict = native.audit_native(cell, host, work=work, src_dir=args.src_dir, say=lambda m: None)
        audited = [(cell, verdict, "")]
    else:
        for flag, value in (("--python-exe", args.python_exe), ("--src-dir", args.src_dir)):
            if value:
                raise UsageError(f"{flag} goes with --native (the builder image has its own Python and source)")
        from imagegen.executors import buildx_audit
        plan = request.planned(opts, cat, common.lock(args))
        for c in plan.rejected:
            print(f"[{c.name}] rejected: {'; '.join(c.problems)}", file=sys.stderr)
        if not plan.buildable:
            raise NothingToDoError("no cell of this matrix can build, so there is nothing to audit (imagegen plan explains each)")
        audited = [(o.cell, o.verdict, o.error + (f" (log: {o.log})" if o.log else ""))
                   for o in buildx_audit.audit(plan, work=work, say=lambda m: print(m, file=sys.stderr, flush=True))]
    if args.json:
        records = [{"cell": _cell_record(cell, audited=verdict is not None), "audit": verdict.as_dict() if verdict else None,
                    **({"error": error} if verdict is None else {})} for cell, verdict, error in audited]
        json.dump(records[0] if args.native else records, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for cell, verdict, error in audited:
            if verdict is None:
                print(f"{cell.describe()}: AUDIT FAILED: {error}")
                continue
            print(f"{cell.describe()}: {'buildable' if verdict.ok else 'REFUSED'} (audit {verdict.report.seconds:.1f} s)")
            for line in (*verdict.table().splitlines(), *verdict.findings()):
                print(f"  {line}")
    refused = [(cell, verdict) for cell, verdict, _ in audited if verdict is not None and not verdict.ok]
    failed = [cell for cell, verdict, _ in audited if verdict is None]
    if len(audited) == 1 and refused:
        raise refuse(*refused[0])
    if len(audited) == 1 and failed:  # why, on stderr too (with --json the record on stdout has it)
        raise CompatError(f"the gencode audit could not run for {failed[0].name}: {audited[0][2]}")
    if refused or failed:
        raise CompatError(f"the gencode audit refuses {len(refused)} and could not run {len(failed)} of {len(audited)}"
                          f" cell(s): {', '.join(c.name for c, _ in refused)}{', ' if refused and failed else ''}"
                          f"{', '.join(c.name for c in failed)}")
    return 0


def cmd_refresh(args: argparse.Namespace) -> int:
    from imagegen import untrusted
    from imagegen.plan import refresh, releases

    deadline = untrusted.Deadline(refresh.deadline_seconds())  # every request of the command together
    refresh.run(args.index_url, args.dry_run, deadline)
    # Then the catalogue's packages: a newer release is a pin to add (said, never written).
    return releases.run(args.index_url, load_catalogue(), deadline)


def cmd_recipes(args: argparse.Namespace) -> int:
    if args.lock is not None:
        common.lock(args)  # recipes uses no image, but a --lock that is not a lock file is a mistake worth saying
    config = common.config(args)
    cat = common.catalogue(args, config)
    records = []
    for name in cat.names():
        r = cat.recipes[name]
        records.append({
            "name": r.name, "aliases": list(r.aliases), "description": r.description, "source": r.source_url or str(r.source_path),
            "default_version": r.default_version,
            "versions": {k: {"ref": v.ref, "commit": v.commit, "archs": str(v.archs), "arch_env": v.arch.env,
                             "arch_style": v.arch.style, "ptx": v.arch.ptx, "notes": v.notes} for k, v in r.versions.items()},
            "force_env": dict(r.force_env), "local_version_env": r.local_version_env, "path": r.path,
        })
    if args.json:
        json.dump(records, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    for rec in records:
        aliases = f" (aliases: {', '.join(rec['aliases'])})" if rec["aliases"] else ""
        print(f"{rec['name']}{aliases}: {rec['description']}")
        for k, v in rec["versions"].items():
            default = " [default]" if k == rec["default_version"] else ""
            knob = f"{v['arch_env']} ({v['arch_style']})" if v["arch_env"] else "fixed list"
            print(f"  {k}{default}: archs {v['archs']}; knob {knob}; PTX {v['ptx']}")
    return 0


def cmd_archs(args: argparse.Namespace) -> int:
    from imagegen.model.arch_format import to_cmake, to_dotted_list, to_gencode, to_torch_arch_list
    from imagegen.model.arch_parse import parse_arch_list
    from imagegen.model.arch_rules import min_cuda_for, nvcc_problems, parse_cuda_version, torch_problems
    archs: ArchList = parse_arch_list(args.arch)
    problems: list[str] = []
    for flag, value in (("--cuda", args.cuda), ("--torch", args.torch)):
        if value is not None and not value.strip():  # given empty: refused, not taken as not given
            raise UsageError(f"{flag}: give a version (got an empty one)")
    if args.cuda:
        cuda = compat.cuda_variant(args.cuda) if not args.cuda.count(".") == 2 else None
        problems += nvcc_problems(archs, parse_cuda_version(args.cuda) if cuda is None else cuda.version)
    if args.torch:
        series, tv = compat.torch_series(args.torch)
        problems += torch_problems(archs, tv)
    print(f"normalised               {archs}")
    print(f"TORCH_CUDA_ARCH_LIST     {_try(lambda: to_torch_arch_list(archs))}")
    for line in _numeric_knob_lines(archs):
        print(line)
    print(f"NATTEN_CUDA_ARCH         {to_dotted_list(archs)}")
    print(f"CMAKE_CUDA_ARCHITECTURES {to_cmake(archs)}")
    print(f"nvcc                     {' '.join(to_gencode(archs))}")
    print(f"minimum CUDA             {min_cuda_for(archs)}")
    for p in problems:
        print(f"problem: {p}", file=sys.stderr)
    return 3 if problems else 0


def _numeric_knob_lines(archs: ArchList) -> list[str]:
    """FLASH_ATTN_CUDA_ARCHS / BLOCK_SPARSE_ATTN_CUDA_ARCHS as the package really gets them.

    Those knobs take 80 but not 86/89 (silently ignored); the plan maps such a request to the arch
    whose cubin runs on it, so show that value (80;90 for 80;86;89;90) and say why.
    """
    from imagegen.model.cell_rules import compiled_archs
    from imagegen.model.arch_format import to_numeric_list

    knobs: dict[str, tuple[Recipe, RecipeVersion]] = {}
    for recipe in load_catalogue().recipes.values():
        version = recipe.version(None)
        knob = version.arch
        if knob.style == "numeric" and knob.env:
            knobs.setdefault(knob.env, (recipe, version))
    lines = []
    for env, (recipe, version) in sorted(knobs.items()):
        compiled, mapped = compiled_archs(version, archs)
        extra = [mapped] if mapped else []
        supported = {a.cc for a in version.archs}
        missing = [a.cc for a in compiled if a.cc not in supported]
        if missing:
            extra.append(f"does not build {', '.join(missing)}: imagegen plan rejects such a cell")
        about = f"  ({recipe.name} {version.version}: {'; '.join(extra)})" if extra else ""
        lines.append(f"{env:<24} {to_numeric_list(compiled, keep_variant=version.arch.keep_variant)}{about}")
    return lines


def _try(fn) -> str:
    try:
        return fn()
    except ImagegenError as exc:
        return f"(cannot express: {exc})"
