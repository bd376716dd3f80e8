"""`imagegen verify`, `check` and `doctor`: what a wheel holds, whether it runs on this GPU, and what
this host can build."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from imagegen.commands import common
from imagegen.plan.config import load_config
from imagegen.errors import EngineError, ImagegenError, UsageError
from imagegen.model.arch_parse import parse_arch_list
from imagegen.model.catalogue import Catalogue, load_catalogue
from imagegen.outputs import shown


def cmd_doctor(args: argparse.Namespace) -> int:
    from imagegen.commands import doctor
    report = doctor.run(common.validate_exe(args.python_exe, "--python-exe"), Path.cwd(), engine=not args.no_engine,
                        build=not args.no_build)
    print(report.as_json() if args.json else report.text())
    if report.failed:
        # Exit 4 (the exit-code table of docs/reference/cli.md: Docker, buildx or the host toolchain missing or refused), what every
        # check doctor fails is; exit 1 would read as an internal error.
        raise EngineError(f"{len(report.failed)} problem(s): " + "; ".join(f"{c.name}: {c.fix or c.detail}" for c in report.failed))
    return 0


def cmd_cdi_spec(args: argparse.Namespace) -> int:
    from imagegen.errors import NoGpuError
    from imagegen.executors import gpu_access
    from imagegen.outputs import write_output
    edits = gpu_access.driver_edits()
    if edits is None:
        raise NoGpuError("no NVIDIA device nodes here (/dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidiaN): write the CDI"
                         " spec on the GPU host, where the driver is loaded")
    if not isinstance(edits, gpu_access.DriverEdits):
        raise NoGpuError(f"{edits.detail}: {edits.fix}")
    write_output(json.dumps(gpu_access.cdi_spec(edits), indent=2) + "\n", args.output, what="CDI spec",
                 system_ok=("/etc/cdi", "/var/run/cdi", "/run/cdi"))  # where the container engines read CDI specs
    if args.output not in (None, "-"):
        print(f"wrote {args.output}: nvidia.com/gpu=all with {edits.detail}", file=sys.stderr)
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from imagegen.finish.verify import VerifyError, expected_for_wheel, verify_wheel

    archs = parse_arch_list(args.arch)
    common.validate_exe(args.python_exe, "--python-exe")
    reports = []
    try:  # the recipes tell how a package compiles a request; --gpu needs them, plain verify does without
        cat: Catalogue | None = load_catalogue(tuple(load_config(search_from=Path.cwd()).recipe_dirs) + tuple(args.recipe_dir))
    except ImagegenError:
        if args.gpu:
            raise
        cat = None
    for wheel in args.wheels:
        common.validate_wheel_file(wheel)
        expected, knowledge = expected_for_wheel(cat, wheel, archs)
        report = verify_wheel(wheel, expected, strict=args.strict, extension_archs=knowledge)
        if args.python_exe:
            from imagegen.executors.import_test import import_test, wheel_modules

            try:
                report.imports = import_test(wheel, wheel_modules(wheel), args.python_exe)
            except ImagegenError as exc:
                report.problems.append(str(exc))
        reports.append(report)
    no_gpu = _verify_gpu(args, cat, reports) if args.gpu and cat is not None else None
    if args.json:
        json.dump([r.as_dict() for r in reports], sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for r in reports:
            print(f"{'ok  ' if r.ok else 'FAIL'} {r.wheel}")
            for so in r.extensions:
                print(f"     {so.name}: {so.summary()}")
            for w in r.warnings:
                print(f"     warning: {w}")
            for module, result in (r.imports or {}).items():
                print(f"     import {module}: {result}")
            if r.gpu_check and r.gpu_check.get("status") == "passed":
                for line in r.gpu_check["output"]:
                    print(f"     gpu_check: {line}")
                print(f"     gpu_check passed on {r.gpu_check['device']} in {r.gpu_check['seconds']:.1f} s")
            for p in r.problems:
                print(f"     problem: {p}")
    bad = [r for r in reports if not r.ok]
    if bad:
        raise VerifyError(f"{len(bad)} of {len(reports)} wheels failed verification: " + "; ".join(bad[0].problems))
    if no_gpu is not None:
        raise no_gpu
    warned = [r for r in reports if r.warnings]
    if warned:
        print(f"imagegen: warning: {len(warned)} of {len(reports)} wheels carry archs not requested"
              " (--strict makes that a failure)", file=sys.stderr)
    return 0


def _verify_gpu(args: argparse.Namespace, cat: Catalogue, reports: list) -> ImagegenError | None:
    """verify --gpu: `imagegen check` on each wheel that passed. Returns the NoGpuError (exit 8) to
    raise once the reports are printed; a failed check is a problem of its wheel."""
    from imagegen.finish import check
    for wheel, report in zip(args.wheels, reports):
        if not report.ok:
            continue
        try:
            report.gpu_check = check.check_wheel(wheel, cat, python_exe=args.python_exe,
                                                 how=f"imagegen check {wheel} --recipe NAME").as_dict()
        except check.NoGpuError as exc:
            return exc  # the same for every wheel: stop
        except ImagegenError as exc:
            report.gpu_check = {"status": "failed", "error": str(exc)}
            report.problems.append(str(exc))
    return None


def cmd_check(args: argparse.Namespace) -> int:
    from imagegen.finish import check
    try:
        args.wheel.stat()
    except FileNotFoundError:
        pass  # check says so, with the hint
    except (OSError, ValueError) as exc:  # a name too long, a loop
        raise UsageError(f"{shown(args.wheel)}: {getattr(exc, 'strerror', None) or 'not a usable path'}") from None
    common.lock(args)  # a given lock file must at least be one (check runs no image)
    cat = common.catalogue(args, common.config(args))
    result = check.check_wheel(args.wheel, cat, recipe=args.recipe, python_exe=args.python_exe, timeout=args.timeout)
    if args.json:
        json.dump(result.as_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for line in result.output:
            print(line)
        print(result.summary(), file=sys.stderr)
    return 0
