"""`imagegen publish`: upload a wheelhouse's verified wheels to PyPI-compatible indexes, Hugging Face
Hub repositories, GitHub releases and S3 (imagegen.publish.upload holds the rules), and report every
wheel's outcome at every destination."""

from __future__ import annotations

import argparse
import json
import sys

from imagegen.errors import PublishError, UsageError
from imagegen.outputs import shown


def cmd_publish(args: argparse.Namespace) -> int:
    from imagegen.publish.upload import publish

    try:
        is_dir = args.out.is_dir()
    except (OSError, ValueError):  # a name too long, a NUL
        is_dir = False
    if not is_dir:
        raise UsageError(f"{shown(args.out)}: no such wheelhouse folder (imagegen build --out writes one)")
    dry_run = args.dry_run or args.check
    report = publish(args.out, args.to, dry_run=dry_run, create=args.create, offline=not args.check)
    if args.json:
        json.dump(report.as_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for outcome in report.outcomes:
            print(outcome.line())
        for problem in report.problems:
            print(f"{'refused':<12} {problem}")
        print(f"{'dry run: ' if dry_run else ''}{report.summary()}", file=sys.stderr)
    failures, problems = report.failures, report.problems
    if failures or problems:
        counts = [f"{len(failures)} refused or failed"] * bool(failures) \
            + [f"{len(problems)} not verified"] * bool(problems)
        first = f"{failures[0].wheel} -> {failures[0].dest}: {failures[0].status}, {failures[0].detail}" if failures \
            else problems[0]
        raise PublishError(f"{', '.join(counts)}: {first}")
    return 0
