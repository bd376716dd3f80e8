"""`imagegen build`: a matrix through buildx bake, or one cell natively on this host."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from functools import partial
from pathlib import Path

from imagegen.plan import options, request
from imagegen.commands import common
from imagegen.errors import RefusedError, UsageError
from imagegen.model.catalogue import Catalogue
from imagegen.outputs import output_folder


def cmd_build(args: argparse.Namespace) -> int:
    from imagegen.executors import buildx as execute
    from imagegen.executors import results as report

    config = common.config(args)
    cat = common.catalogue(args, config)
    common.validate_job_flags(args)  # container and native builds alike
    output_folder(args.work, "--work")
    opts = common.resolved(args, config)  # once: the plan, the matrix and the output folder read it
    if args.native:
        return _build_native(args, cat, opts)
    if args.print_env:
        raise UsageError("--print-env goes with --native (a container build prints its variables in its log)")
    if args.verbose_build:
        raise UsageError("--verbose-build goes with --native (a container build prints the compiler output when it fails)")
    for flag, value in (("--flat", args.flat), ("--src-dir", args.src_dir), ("--python-exe", args.python_exe)):
        if value:
            raise UsageError(f"{flag} goes with --native (a container build has its own source and Python)")
    common.validate_builders(args.builder)
    plan = request.buildable(request.planned(opts, cat, common.lock(args)))
    common.ca_bundle(args.ca_bundle)
    netrc = options.netrc_file(args.netrc)
    out = opts.out
    from imagegen.finish.finisher import finish

    results = execute.build(plan, out=out, work=args.work, finish=partial(finish, force=args.force), force=args.force,
                            max_jobs=args.max_jobs,
                            nvcc_threads=args.nvcc_threads, builders=args.builder, ca_bundle=args.ca_bundle, netrc=netrc,
                            cache_from=common.validate_cache_specs(args.cache_from), cache_to=common.validate_cache_specs(args.cache_to),
                            audit=not args.no_audit, budget=args.budget,
                            compile_cache=common.compile_cache(args.compile_cache))
    repaired = _last_mile(args, out, [r.wheel for r in results if r.wheel is not None and r.status == "built"],
                          any(r.wheel is not None for r in results))
    for r in results:
        r.wheel = repaired.get(r.wheel, r.wheel) if r.wheel is not None else None
    report.report(results, as_json=args.json)
    return 0


def _build_native(args: argparse.Namespace, cat: Catalogue, opts: options.Options) -> int:
    from imagegen.executors import native
    if args.netrc:
        raise UsageError("--netrc goes with a container build: natively, git and pip read your ~/.netrc (or $NETRC)"
                         " themselves")
    compile_cache = common.compile_cache(args.compile_cache)
    if compile_cache and shutil.which("ccache") is None:
        raise UsageError("--compile-cache needs ccache on PATH for a native build (4.4 or newer, with Redis/HTTP"
                         " storage: apt-get install ccache)")
    if args.flat and (args.repair or args.index):
        raise UsageError("--repair and --index work on a wheelhouse: drop --flat (a flat folder has no manifest)")
    cell, host = common.native_cell(args, cat, opts)
    if args.print_env:
        # With the audit, the MAX_JOBS printed is the one the build will use (sized from the audit).
        print(json.dumps(native.build_env_native(cell, host, work=args.work, max_jobs=args.max_jobs,
                                                 nvcc_threads=args.nvcc_threads, src_dir=args.src_dir,
                                                 audit=not args.no_audit)))
        return 0
    out = opts.out
    if not args.flat and not args.force:  # the same inputs' wheel in the wheelhouse, intact: nothing to compile
        reused = native.up_to_date(cell, host, out=Path(out), work=args.work, src_dir=args.src_dir)
        if reused is not None:
            print(reused.line(), file=sys.stderr)
            _last_mile(args, out, [], True)  # repaired when it was built; the index brought up to date
            print(reused.wheel)
            return 0
    if not args.flat:
        from imagegen.wheelhouse import manifest as wheelhouse
        refused = wheelhouse.replacement_refused(Path(out), cell, force=args.force,
                                              say=lambda m: print(m, file=sys.stderr))
        if refused:
            raise RefusedError(refused)
    from imagegen.finish.finisher import finish
    from imagegen.interrupt import stopping_children

    with stopping_children():  # a signal to imagegen ends the compile it started
        dest = native.build_native(cell, host, out=out, work=args.work, finish=partial(finish, force=args.force),
                                   flat=args.flat,
                                   max_jobs=args.max_jobs,
                                   nvcc_threads=args.nvcc_threads, src_dir=args.src_dir,
                                   verbose_build=args.verbose_build, audit=not args.no_audit,
                                   compile_cache=compile_cache, budget=args.budget)
    dest = _last_mile(args, out, [Path(dest)], True).get(Path(dest), dest)
    print(dest)
    return 0


def _last_mile(args: argparse.Namespace, out: Path, built: list[Path], any_wheel: bool) -> dict[Path, Path]:
    """--repair each wheel this build made (old path -> repaired path), then --index the wheelhouse (when
    it holds a wheel): the index lists the repaired wheels."""
    repaired: dict[Path, Path] = {}
    if args.repair:
        from imagegen.publish.repair import repair_in_wheelhouse
        for wheel in built:
            result = repair_in_wheelhouse(wheel, say=lambda m: print(m, file=sys.stderr))
            for line in result.lines():
                print(line, file=sys.stderr)
            repaired[wheel] = result.wheel
    if args.index and any_wheel:
        from imagegen.publish.index import write_index
        result = write_index(Path(out))
        print(f"index: {len(result.projects)} project(s), {sum(len(v) for v in result.projects.values())} wheel(s)"
              f" in {Path(out) / 'simple'}", file=sys.stderr)
    return repaired
