"""`imagegen index OUT`: write the static pip index of a wheelhouse's verified wheels (imagegen.publish.index)
and say how pip reads it. Wheels left out (missing, changed since their build, unreadable) are warnings on
stderr; the index of the others is still written."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from imagegen.errors import printable
from imagegen.outputs import shown


def cmd_index(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from imagegen.publish.index import write_index

    result = write_index(args.out, base_url=args.base_url, say=_say)
    if args.json:
        json.dump(result.as_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    names = ", ".join(result.projects) or "none"
    print(f"indexed {result.wheels} wheel{'s' if result.wheels != 1 else ''} of {len(result.projects)}"
          f" project{'s' if len(result.projects) != 1 else ''} ({names}) in {shown(result.out)}"
          f" ({len(result.written)} files written, {len(result.removed)} removed)")
    # Where pip finds it: the base URL when given; else this folder, and a placeholder for where it is served.
    served = result.base_url or "<URL the folder is served at>/"
    print(f"  pip install --index-url {served}simple/ PROJECT")
    print(f"  pip install --find-links {served}index.html PROJECT")
    if result.base_url is None:
        here = result.out.resolve().as_uri()
        print(f"  here: --index-url {shown(here, 200)}/simple/ or --find-links {shown(here, 200)}/index.html")
    return 0


def _say(message: str) -> None:
    print(f"imagegen: {printable(message)}", file=sys.stderr, flush=True)
