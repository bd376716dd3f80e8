"""`imagegen reuse WHEEL --torch X.Y.Z`: before rebuilding a wheel for a new torch, check whether the one
built for an earlier torch still works with it (imagegen.finish.reuse): its extensions' symbols against
that torch's libraries, an import with it, the recipe's GPU check where a GPU is here. Exit 0: reusable
(and with --into, placed in the wheelhouse marked as reused); 11: not reusable; 2: bad input."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from imagegen.commands import common
from imagegen.errors import ImagegenError, UsageError
from imagegen.outputs import shown


def cmd_reuse(args: argparse.Namespace) -> int:
    from imagegen import safety
    from imagegen.finish import reuse

    exe = common.validate_exe(args.python_exe, "--python-exe")
    into: Path | None = args.into
    if into is not None:
        safety.wheelhouse_folder(into, "--into", UsageError)
        if args.wheel.is_file():
            reuse.require_placeable(args.wheel)  # before the check: where it would go must be known
    config = None
    try:
        config = common.config(args)
    except ImagegenError:
        if args.config or args.recipe_dir:
            raise
    # the recipes name the gpu_check and a wheelhouse folder; a check runs without them
    cat = None if config is None else common.optional_catalogue(args, config)
    result = reuse.check_reuse(args.wheel, torch=args.torch, python_exe=exe, torch_wheel=args.torch_wheel,
                               source_torch=args.built_with, catalogue=cat, recipe=args.recipe, timeout=args.timeout,
                               gpu=not args.no_gpu_check)
    if into is not None and result.reusable:
        reuse.place_reused(result, args.wheel, into, catalogue=cat, layout=config.layout if config else None)
    if args.json:
        json.dump(result.as_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for line in result.lines():
            print(line)
    if into is not None and not result.reusable:
        print(f"imagegen: not placed in {shown(into, 200)}: the wheel is not reusable", file=sys.stderr)
    reuse.require_reusable(result)
    return 0


    try:
        return common.catalogue(args, config)
    except ImagegenError:
        if args.recipe_dir:
            raise
        return None
