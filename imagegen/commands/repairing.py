"""`imagegen repair`: give built wheels a manylinux tag with auditwheel, torch's libraries excluded
(imagegen.publish.repair), then check them again.

Where the repaired wheel goes: into --out when given; else, for a wheel its folder's manifest lists
(a wheel of a wheelhouse), in place of the original in that folder and manifest; else beside the
original, which stays. Every wheel is tried; a wheel that cannot be repaired is reported and, once
all are done, ends the command with one line (exit 9).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

from imagegen.commands import common
from imagegen.errors import ArchError, ImagegenError, PublishError, UsageError
from imagegen.model.arch_parse import parse_arch_list
from imagegen.outputs import output_folder, shown
from imagegen.publish.manylinux import validate_plat
from imagegen.publish.repair import RepairResult, repair_in_wheelhouse, repair_wheel, wheelhouse_entries


def _importer(args: argparse.Namespace) -> str | None:
    """The Python for the import test: --python-exe, else this one when it has torch, else none."""
    given = common.validate_exe(args.python_exe, "--python-exe")
    if given:
        return given
    return sys.executable if importlib.util.find_spec("torch") is not None else None


def _repair_one(wheel: Path, args: argparse.Namespace, python_exe: str | None) -> RepairResult:
    entries = wheelhouse_entries(wheel)
    if entries and args.out is None:
        return repair_in_wheelhouse(wheel, plat=args.plat, python_exe=python_exe)
    # Outside its wheelhouse (or not in one): what the manifest says of it still tells what to check.
    entry = entries[min(entries)] if entries else {}
    try:
        expected = parse_arch_list(entry["expected_archs"]) if isinstance(entry.get("expected_archs"), str) else None
    except ArchError:
        expected = None
    base_image = entry.get("base_image") if isinstance(entry.get("base_image"), str) else None
    return repair_wheel(wheel, args.out if args.out is not None else wheel.parent, plat=args.plat,
                        python_exe=python_exe, expected=expected, base_image=base_image)


def cmd_repair(args: argparse.Namespace) -> int:
    for wheel in args.wheels:
        common.validate_wheel_file(wheel)
    if args.out is not None:
        output_folder(args.out, "--out")
        try:
            not_a_folder = args.out.exists() and not args.out.is_dir()
        except OSError as exc:  # a 5000-character name
            raise UsageError(f"--out {shown(args.out)}: {exc.strerror or 'not a usable path'}") from None
        if not_a_folder:
            raise UsageError(f"--out {shown(args.out)}: not a folder")
    validate_plat(args.plat)
    python_exe = _importer(args)
    if python_exe is None:
        print("imagegen: the import test is skipped: this Python has no torch (give --python-exe)", file=sys.stderr)
    results: list[RepairResult] = []
    failures: list[tuple[Path, str]] = []
    for wheel in args.wheels:
        try:
            results.append(_repair_one(wheel, args, python_exe))
        except ImagegenError as exc:
            failures.append((wheel, str(exc)))
    if args.json:
        json.dump([r.as_dict() for r in results]
                  + [{"ok": False, "source": str(wheel), "error": error} for wheel, error in failures],
                  sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for result in results:
            print("\n".join(result.lines()))
        for wheel, error in failures:
            print(f"FAIL {wheel.name}\n     problem: {error}")
    if failures:
        raise PublishError(f"{len(failures)} of {len(args.wheels)} wheels could not be repaired: {failures[0][1]}")
    return 0
