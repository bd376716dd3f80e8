"""`imagegen push`, `pull` and `lock`: prebuilt builder images in a registry."""

from __future__ import annotations

import argparse
import sys
from functools import partial

from imagegen.plan import options, request
from imagegen.commands import common
from imagegen.errors import NothingToDoError


def cmd_push(args: argparse.Namespace) -> int:
    from imagegen.publish import push
    config = common.config(args)
    cat = common.catalogue(args, config)
    opts = common.resolved(args, config)
    registry = common.registry(opts)
    lock = common.lock(args)  # loaded once: it pins the plan, and push writes the pushed digests there
    plan = request.buildable(request.planned(opts, cat, lock), arch_free=True)
    from imagegen.outputs import output_folder, resolve_target
    from imagegen.plan.registry import probe

    # Everything the user gave is checked first; then the registry, before anything is built.
    resolve_target(lock.path, "lock file")  # push writes the pushed digests there
    output_folder(args.work, "--work")
    common.validate_builders(args.builder)
    cache_from, cache_to = common.validate_cache_specs(args.cache_from), common.validate_cache_specs(args.cache_to)
    ca = common.ca_bundle(args.ca_bundle)
    netrc = options.netrc_file(args.netrc)
    probe(registry)  # unreachable, not a registry, wrong password: said now
    results = push.push(plan, registry, work=args.work, lock=lock, ca_bundle=ca, netrc=netrc,
                        builder=args.builder, cache_from=cache_from, cache_to=cache_to)
    for r in results:
        print(f"{r.ref}@{r.digest}" if r.digest else r.ref)
    return 0


def cmd_pull(args: argparse.Namespace) -> int:
    from imagegen.executors import prebuilt
    from imagegen.executors import results as report
    from imagegen.finish.finisher import finish
    config = common.config(args)
    cat = common.catalogue(args, config)
    opts = common.resolved(args, config)
    registry = common.registry(opts)
    lock = common.lock(args)  # loaded once: it pins the plan and the pulled builder images
    plan = request.buildable(request.planned(opts, cat, lock))
    common.validate_job_flags(args)
    from imagegen.outputs import output_folder
    output_folder(args.work, "--work")
    results = prebuilt.pull(plan, registry, out=opts.out, work=args.work, lock=lock,
                            finish=partial(finish, force=args.force), gpus=args.gpus, fallback=not args.no_fallback,
                            max_jobs=args.max_jobs,
                            nvcc_threads=args.nvcc_threads, ca_bundle=common.ca_bundle(args.ca_bundle),
                            netrc=options.netrc_file(args.netrc), force=args.force,
                            audit=not args.no_audit)
    report.report(results, as_json=args.json)
    return 0


def cmd_lock(args: argparse.Namespace) -> int:
    from imagegen.plan.registry import lock_bases, lock_builders, validate_registry

    config = common.config(args)
    cat = common.catalogue(args, config)
    opts = common.resolved(args, config)
    # Where the team's builder images are (--registry, else the config's registry): their digests too.
    registry = validate_registry(opts.registry) if opts.registry else None
    plan = request.planned(opts, cat)  # the tags, unpinned; one cell per platform: each pulls its own variant
    if not plan.buildable:
        raise NothingToDoError("no cell of this matrix can build (imagegen plan explains each)")
    from imagegen.outputs import resolve_target

    lock = common.lock(args)
    resolve_target(lock.path, "lock file")  # a device or folder: refused before any pull
    say = lambda m: print(m, file=sys.stderr)  # noqa: E731
    lock = lock_bases(plan, lock, say=say)
    if registry is not None:
        lock = lock_builders(plan, registry, lock, say=say)
    lock.save()
    print(f"wrote {lock.path}: {len(lock.base_images)} base image(s), {len(lock.builder_images)} builder image(s)")
    return 0
