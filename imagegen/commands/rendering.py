"""`imagegen render` and `imagegen bake`: the builder Dockerfile (or Windows script) of one cell, the
bake definition of a matrix, and the repository's generated files."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Sequence

from imagegen import options
from imagegen.commands import common
from imagegen.errors import CompatError, NothingToDoError, UsageError
from imagegen.model.arch_parse import parse_arch_list
from imagegen.outputs import output_folder, shown, write_output
from imagegen.plan import Plan, choose_cell, defaults, with_offline, with_requested_platforms
from imagegen.render.dockerfile import render_dockerfile


def cmd_render(args: argparse.Namespace, argv: Sequence[str]) -> int:
    config = common.config(args)
    cat = common.catalogue(args, config)
    _render_flags(args)
    wanted = (options.recipe_versions(args) or (None,))[0]  # one: render makes one cell
    recipe, version = common.resolve(cat, args.recipe, args.source, wanted, args.fetch,
                                     common.user_env(args), ref=args.ref, git=args.git, jobs=common.job_fix(args))
    opts = options.resolve(args, config)
    archs = parse_arch_list(opts.arch_configured or defaults()["arch"])
    if args.shell:
        return _render_windows(args, argv, recipe, version, archs, opts)
    # A config matrix narrows render's choice; its last entry (the newest listed) wins.
    cell = choose_cell(recipe, version, archs, torch=opts.torch_one, cuda=opts.cuda_one, python=opts.python_one,
                       flavor=opts.flavor, base_image=opts.base_image, torch_index_override=opts.torch_index_url,
                       flavor_given=opts.flavor_given)
    if len(opts.platforms) > 1:
        raise UsageError("render makes one cell's Dockerfile: give one --platform (bake and build take several)")
    cell = with_requested_platforms(Plan(cells=[cell]), opts.platforms, cell.flavor).cells[0]
    if not cell.buildable:
        raise CompatError(f"{cell.name}: " + "; ".join(cell.problems))
    if opts.offline:
        cell = with_offline(Plan(cells=[cell])).cells[0]
        if not cell.buildable:
            raise CompatError(f"{cell.name}: " + "; ".join(cell.problems))
    cell = common.gpu_checked(Plan(cells=[cell]), opts).cells[0]
    cell = common.lock(args).pin_bases(Plan(cells=[cell])).cells[0]
    rendered = render_dockerfile(cell, command=common.command_line(argv), stdout=args.output in (None, "-"))
    write_output(rendered.dockerfile, args.output)
    if args.output not in (None, "-"):
        # The build steps beside it, where the Dockerfile's imagegen-scripts stage copies them from (a plain
        # `docker build .` of this folder); bake and build name a context of that name instead.
        from imagegen.render.dockerfile import SCRIPTS_CONTEXT, write_scripts
        folder = Path(args.output).parent / SCRIPTS_CONTEXT  # beside the name given (a symlink's too)
        write_scripts(folder, within=Path(args.output).parent)
        print(f"wrote {args.output} and {folder}/: {cell.describe()} on {cell.base.ref}", file=sys.stderr)
    return 0


def _render_flags(args: argparse.Namespace) -> None:
    """render makes a Dockerfile or (--shell) a Windows script: a flag the chosen one ignores is refused."""
    if args.shell:
        for flag, value in (("--flavor", args.flavor), ("--base-image", args.base_image), ("--lock", args.lock),
                            ("--offline", args.offline or None), ("--gpu-check-device", args.gpu_check_device),
                            ("--platform", args.platform),
                            ("--dockerfile-frontend", args.dockerfile_frontend)):
            if value is not None:
                raise UsageError(f"{flag} does not apply to --shell (a native script uses the host's toolchain, no image)")
        # One script builds many cells: --torch 2.8,2.9 --cuda 12.8 (lists, as plan takes them).
        for flag in ("torch", "cuda", "python"):
            value = getattr(args, flag)
            if value is not None:
                setattr(args, flag, [value])
    else:
        for flag, value in (("--src-dir", args.src_dir), ("--python-exe", args.python_exe), ("--vcvars", args.vcvars),
                            ("--max-jobs", args.max_jobs), ("--nvcc-threads", args.nvcc_threads), ("--out", args.out)):
            if value is not None:
                raise UsageError(f"{flag} goes with --shell cmd|powershell (a Dockerfile takes MAX_JOBS and"
                                 " NVCC_THREADS as build args at bake time)")
        if args.audit:
            raise UsageError("--audit goes with --shell cmd|powershell; a Dockerfile's cell is audited by"
                             " `imagegen plan --audit` (and before every `imagegen build`)")


def _render_windows(args, argv, recipe, version, archs, opts) -> int:
    from imagegen.render import windows
    if recipe.source_kind == "sdist":
        raise UsageError("a Windows script clones the recipe's git source: leave out --fetch sdist")
    if version.arch.style != "fixed":
        supported = {a.cc for a in version.archs}
        bad = [a for a in archs if a.cc not in supported]
        if bad:
            raise UsageError(f"{recipe.name} {version.version} does not support {', '.join(a.sm for a in bad)}"
                             f" (it supports {', '.join(sorted(supported, key=lambda cc: tuple(map(int, cc.split('.')))))})")
    common.check_job_flags(args)
    torch, cuda, python = (options.flag_values(args, k) for k in ("torch", "cuda", "python"))
    m = opts.config.matrix  # a config matrix stands in for the flags it names
    cells, rejected = windows.windows_cells(recipe, version, archs, torch=torch or tuple(m.torch),
                                            cuda=cuda or tuple(m.cuda), python=python or tuple(m.python),
                                            layout=opts.layout)
    if len(cells) + len(rejected) > 1:
        for c in rejected:
            print(f"[{c.name}] rejected: {'; '.join(c.problems)}", file=sys.stderr)
    windows.refuse_rejected(rejected, len(cells) + len(rejected))
    if args.python_exe is not None and len(cells) > 1:
        raise UsageError(f"--python-exe builds with that interpreter's torch as it is: one cell only, and these flags"
                         f" make {len(cells)} ({', '.join(c.name for c in cells)}); leave --python-exe out to get a"
                         " venv per cell")
    if args.audit:
        print("imagegen: --audit: the gencode audit runs the package's build with stand-in compilers on Linux (in the"
              " cell's builder image, or --native); it cannot run a Windows build, so these cells are not audited:"
              " the script checks the built extensions' archs with cuobjdump instead", file=sys.stderr)
    out = args.out or (os.path.relpath(opts.config.out) if opts.config.path else "wheelhouse")
    text = windows.render_script(
        args.shell, recipe, version, cells, src=args.src_dir or recipe.name, python_exe=args.python_exe,
        vcvars=args.vcvars or windows.DEFAULT_VCVARS, max_jobs=args.max_jobs or 1, nvcc_threads=args.nvcc_threads or 1,
        out=str(out), command=common.command_line(argv), index_override=opts.torch_index_url)
    write_output(text, args.output)
    if args.output not in (None, "-"):
        print(f"wrote {args.output}: {len(cells)} cell(s) of {recipe.name} {version.version}: "
              + ", ".join(c.name for c in cells), file=sys.stderr)
    return 0


def cmd_bake(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from imagegen.render import bakefiles
    config = common.config(args)
    cat = common.catalogue(args, config)
    if args.repo:
        written = bakefiles.write_repo_files(Path.cwd(), cat)
        for path in written:
            print(f"wrote {path}", file=sys.stderr)
        return 0
    output_folder(args.dockerfiles, "--dockerfiles")
    plan = common.one_target_per_cell(common.planned(args, config, cat))
    for c in plan.rejected:
        print(f"skipping {c.name}: {'; '.join(c.problems)}", file=sys.stderr)
    if not plan.buildable:
        raise NothingToDoError("no cell of this matrix can build (imagegen plan explains each)")
    out = args.out or (os.path.relpath(config.out) if config.path else "wheelhouse")
    if os.path.lexists(out) and not os.path.isdir(out):
        raise UsageError(f"--out {shown(out)}: exists and is not a folder (the wheels go into folders under it)")
    written, printed = bakefiles.write_bake(plan, Path.cwd(), Path(args.file), out_dir=str(out),
                                            dockerfiles_dir=args.dockerfiles, command=common.command_line(argv),
                                            check=args.show)
    for path in written:
        print(f"wrote {path}", file=sys.stderr)
    if args.show and printed is not None:
        json.dump(printed, sys.stdout, indent=2)
        sys.stdout.write("\n")
    return 0
