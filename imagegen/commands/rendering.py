"""`imagegen render` and `imagegen bake`: the builder Dockerfile (or Windows script) of one cell, the
bake definition of a matrix, and the repository's generated files."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

from imagegen.plan import options, request
from imagegen.commands import common
from imagegen.errors import CompatError, NothingToDoError, UsageError
from imagegen.outputs import output_folder, shown, write_output
from imagegen.render.dockerfile import render_dockerfile


def cmd_render(args: argparse.Namespace) -> int:
    command = common.command_line(args.argv)  # the Dockerfile's and the script's header say how they were made
    config = common.config(args)
    cat = common.catalogue(args, config)
    given = _render_flags(args)
    opts = options.resolve(given, config)
    wanted = (opts.versions or (None,))[0]  # one: render makes one cell
    recipe, version = request.recipe_at(cat, args.recipe, args.source, wanted, opts.fetch, opts.env, ref=opts.ref,
                                        git=opts.git, jobs=opts.jobs_fix)
    if args.shell:
        return _render_windows(args, given, command, recipe, version, request.one_arch_list(opts), opts)
    cell = request.one_cell(opts, recipe, version)
    cell = common.lock(args).pin_base(cell)  # read after the cell is planned: its errors come second
    rendered = render_dockerfile(cell, command=command, stdout=args.output in (None, "-"))
    write_output(rendered.dockerfile, args.output)
    if args.output not in (None, "-"):
        # The build steps beside it, where the Dockerfile's imagegen-scripts stage copies them from (a plain
        # `docker build .` of this folder); bake and build name a context of that name instead.
        from imagegen.render.dockerfile import SCRIPTS_CONTEXT, write_files, write_scripts
        here = Path(args.output).parent  # beside the name given (a symlink's too)
        write_scripts(here / SCRIPTS_CONTEXT, within=here)
        write_files(rendered.files, here)
        cell_dir = next(iter(rendered.files)).split("/")[0]
        print(f"wrote {args.output}, {here / SCRIPTS_CONTEXT}/ and {here / cell_dir}/: {cell.describe()} on {cell.base.ref}",
              file=sys.stderr)
    return 0


def _render_flags(args: argparse.Namespace) -> options.Flags:
    """render's flags as values. It makes a Dockerfile or (--shell) a Windows script: a flag the chosen one
    ignores is refused."""
    given = common.flags(args)
    if args.shell:
        for flag, value in (("--flavor", args.flavor), ("--base-image", args.base_image), ("--lock", args.lock),
                            ("--offline", args.offline or None), ("--gpu-check-device", args.gpu_check_device),
                            ("--platform", args.platform),
                            ("--dockerfile-frontend", args.dockerfile_frontend)):
            if value is not None:
                raise UsageError(f"{flag} does not apply to --shell (a native script uses the host's toolchain, no image)")
        # One script builds many cells: --torch 2.8,2.9 --cuda 12.8 (lists, as plan takes them).
        given = dataclasses.replace(given, **{flag: [getattr(given, flag)] for flag in ("torch", "cuda", "python")
                                              if getattr(given, flag) is not None})
    else:
        for flag, value in (("--src-dir", args.src_dir), ("--python-exe", args.python_exe), ("--vcvars", args.vcvars),
                            ("--max-jobs", args.max_jobs), ("--nvcc-threads", args.nvcc_threads), ("--out", args.out),
                            ("--install-torch", args.install_torch or None)):
            if value is not None:
                raise UsageError(f"{flag} goes with --shell cmd|powershell" + (
                    " (a Dockerfile takes MAX_JOBS and NVCC_THREADS as build args at bake time)"
                    if flag in ("--max-jobs", "--nvcc-threads") else " (a native Windows script)"))
        if args.audit:
            raise UsageError("--audit goes with --shell cmd|powershell; a Dockerfile's cell is audited by"
                             " `imagegen plan --audit` (and before every `imagegen build`)")
    return given


def _render_windows(args, given: options.Flags, command, recipe, version, archs, opts) -> int:
    from imagegen.model.cell import WindowsHost
    from imagegen.plan.matrix import windows_plan
    from imagegen.render import windows
    common.validate_job_flags(args)
    if args.install_torch and args.python_exe is None:
        raise UsageError("--install-torch goes with --python-exe (without it, each cell's own venv gets its torch)")
    # --src-dir on a checkout that is here: a fork or a changed tree builds as a local tree, as on Linux.
    wanted = (opts.versions or (None,))[0]
    recipe, version = request.local_checkout(recipe, version, args.src_dir, wanted)
    torch, cuda, python = _from_python_exe(args, *(options.flag_values(given, k) for k in ("torch", "cuda", "python")))
    m = opts.config.matrix  # a config matrix stands in for the flags it names
    plan = windows_plan([(recipe, version)], [archs], WindowsHost(), torch=torch or tuple(m.torch),
                        cuda=cuda or tuple(m.cuda), python=python or tuple(m.python),
                        torch_index_override=opts.torch_index_url, layout=opts.layout)
    cells = plan.buildable
    if len(plan.cells) > 1:
        for c in plan.rejected:
            print(f"[{c.name}] rejected: {'; '.join(c.problems)}", file=sys.stderr)
    if plan.rejected and cells:
        # as ci github --windows and bake do: the script builds what can build, the rest is named above
        print(f"imagegen: the script leaves out {len(plan.rejected)} rejected cell(s) of {len(plan.cells)}"
              " (reasons above)", file=sys.stderr)
    elif plan.rejected:
        first = plan.rejected[0]
        more = (f" (and {len(plan.rejected) - 1} more of the {len(plan.cells)} cells:"
                f" {', '.join(c.name for c in plan.rejected[1:4])}{', ...' if len(plan.rejected) > 4 else ''})"
                if len(plan.rejected) > 1 else "")
        raise CompatError(f"cannot build {first.describe()}: " + "; ".join(first.problems) + more)
    if args.python_exe is not None and len(cells) > 1:
        raise UsageError(f"--python-exe builds with that interpreter's torch as it is: one cell only, and these flags"
                         f" make {len(cells)} ({', '.join(c.name for c in cells)}); leave --python-exe out to get a"
                         " venv per cell")
    if args.audit:
        print("imagegen: --audit: the gencode audit runs the package's build with stand-in compilers on Linux (in the"
              " cell's builder image, or --native); it cannot run a Windows build, so these cells are not audited:"
              " the script checks the built extensions' archs with cuobjdump instead", file=sys.stderr)
    out = opts.out_written
    src = str(recipe.source_path) if recipe.source_kind == "local" else args.src_dir or recipe.name
    text = windows.render_script(
        args.shell, recipe, version, cells, src=src, src_given=args.src_dir is not None, python_exe=args.python_exe,
        install_torch=args.install_torch,
        vcvars=args.vcvars or windows.DEFAULT_VCVARS, max_jobs=args.max_jobs or 1, nvcc_threads=args.nvcc_threads or 1,
        out=str(out), command=command, index_override=opts.torch_index_url)
    write_output(text, args.output)
    if args.output not in (None, "-"):
        print(f"wrote {args.output}: {len(cells)} cell(s) of {recipe.name} {version.version}: "
              + ", ".join(c.name for c in cells), file=sys.stderr)
    return 0


def _from_python_exe(args, torch: tuple, cuda: tuple, python: tuple) -> tuple[tuple, tuple, tuple]:
    """--python-exe's torch, CUDA and Python as the cell's, where no flag names them: the interpreter is run
    once with a probe (executors.host.probe_python: torch's version and CUDA read without importing it, bounded
    in time), and a flag given must agree with what it has. Not run when the flags name all three (the script
    checks them against the interpreter when it runs: a script rendered for another machine)."""
    exe = args.python_exe
    many = [f"{flag} {' '.join(v)}" for flag, v in (("--torch", torch), ("--cuda", cuda), ("--python", python)) if len(v) > 1]
    if exe is not None and many:
        raise UsageError(f"--python-exe builds with that interpreter's torch as it is: one cell only, and {many[0]} asks"
                         " for several; leave --python-exe out to get a venv per cell")
    if exe is None or (torch and cuda and python):
        return torch, cuda, python
    from imagegen.errors import EngineError
    from imagegen.executors.host import probe_python
    from imagegen.render.windows import validate_value
    validate_value(args.shell, exe)  # a path the script could not hold is never run here either
    try:
        info = probe_python(exe)
    except EngineError as exc:
        raise UsageError(f"--python-exe {shown(exe, 80)}: {exc}: render where the script runs, or give --torch,"
                         " --cuda and --python (the torch it has; the script checks them when it runs)") from None
    have = {"--torch": info.get("torch"), "--cuda": info.get("torch_cuda"), "--python": info["python"]}
    if have["--torch"] is None and not args.install_torch:
        raise UsageError(f"--python-exe {shown(exe, 80)} has no torch ({shown(info.get('torch_error') or 'none', 80)}):"
                         " install the torch you build for into it, or give --torch and --cuda with --install-torch"
                         " (the script then installs that torch into it)")
    if have["--torch"] is not None and have["--cuda"] is None and not args.install_torch:
        raise UsageError(f"--python-exe {shown(exe, 80)} has torch {have['--torch']}, a CPU-only build: install a CUDA"
                         " build of torch into it, or give --torch and --cuda with --install-torch")
    given = {"--torch": torch, "--cuda": cuda, "--python": python}
    for flag, asked in given.items():
        if args.install_torch and flag != "--python":
            continue  # the script installs the torch asked for
        for value in asked:
            if have[flag] is not None and not request.same_value(flag, value, have[flag]):
                raise UsageError(f"{flag} {value} asked, but --python-exe {shown(exe, 80)} has {have[flag]}: the"
                                 " script builds with that interpreter's; leave the flag out to take its own")
    fill = {flag: given[flag] or ((have[flag],) if have[flag] is not None else ()) for flag in given}
    return fill["--torch"], fill["--cuda"], fill["--python"]


def cmd_bake(args: argparse.Namespace) -> int:
    from imagegen.render import bakefiles
    config = common.config(args)
    cat = common.catalogue(args, config)
    if args.repo:
        written = bakefiles.write_repo_files(Path.cwd(), cat)
        for path in written:
            print(f"wrote {path}", file=sys.stderr)
        return 0
    output_folder(args.dockerfiles, "--dockerfiles")
    opts = common.resolved(args, config)  # once: the plan and the bake file's outputs read it
    plan = request.one_target_per_cell(request.planned(opts, cat, common.lock(args)))
    for c in plan.rejected:
        print(f"skipping {c.name}: {'; '.join(c.problems)}", file=sys.stderr)
    if not plan.buildable:
        raise NothingToDoError("no cell of this matrix can build (imagegen plan explains each)")
    out = opts.out_written
    if os.path.lexists(out) and not os.path.isdir(out):
        raise UsageError(f"--out {shown(out)}: exists and is not a folder (the wheels go into folders under it)")
    written, printed = bakefiles.write_bake(plan, Path.cwd(), Path(args.file), out_dir=str(out),
                                            dockerfiles_dir=args.dockerfiles, command=common.command_line(args.argv),
                                            validate=args.show)
    for path in written:
        print(f"wrote {path}", file=sys.stderr)
    if args.show and printed is not None:
        json.dump(printed, sys.stdout, indent=2)
        sys.stdout.write("\n")
    return 0
