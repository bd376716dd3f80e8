"""`imagegen index OUT [--variants|--no-variants] [--merge URL]`: write the static pip index of a wheelhouse's verified wheels
(imagegen.publish.index), with wheel variants when asked (imagegen.publish.variants), and say how pip reads it.
Wheels left out (missing, changed since their build, unreadable) and wheels without a variant are warnings on
stderr; the index of the others is still written."""

from __future__ import annotations

import argparse
import json
import sys

from imagegen.errors import printable
from imagegen.outputs import shown


def cmd_index(args: argparse.Namespace) -> int:
    from imagegen.publish.index import write_index

    result = write_index(args.out, base_url=args.base_url, variants=args.variants, say=_say,
                         merge_from=getattr(args, "merge", None))
    if args.json:
        json.dump(result.as_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    names = ", ".join(result.projects) or "none"
    print(f"indexed {result.wheels} wheel{'s' if result.wheels != 1 else ''} of {len(result.projects)}"
          f" project{'s' if len(result.projects) != 1 else ''} ({names}) in {shown(result.out)}"
          f" ({len(result.written)} files written, {len(result.removed)} removed)")
    for name in result.external:
        print(f"  external: {name} (built outside imagegen; its SASS/PTX verified by imagegen collect --external)")
    if result.merged is not None:
        merged = result.merged
        what = (f"{len(merged['wheels'])} served wheel{'s' if len(merged['wheels']) != 1 else ''}"
                if merged["published"] else "nothing published yet")
        manifests = len(merged["manifests"])
        print(f"  merged with {shown(merged['url'], 200)}: {what}; {manifests} manifest.served.json"
              f" file{'s' if manifests != 1 else ''} (published cells and this run's)")
    if result.variants:
        files = [name for names in result.variants.values() for name in names]
        variant_wheels = sum(name.endswith(".whl") for name in files)
        print(f"  wheel variants (PEP 817/825): {variant_wheels} variant wheel{'s' if variant_wheels != 1 else ''} and"
              f" {len(files) - variant_wheels} variants.json beside the project pages, for a variant-aware installer;"
              " plain pip skips them")
    # Where pip finds it: the base URL when given; else this folder, and a placeholder for where it is served.
    served = result.base_url or "<URL the folder is served at>/"
    print(f"  pip install --index-url {served}simple/ PROJECT")
    print(f"  pip install --find-links {served}index.html PROJECT")
    for cuda in result.cuda:
        print(f"  pip install --index-url {served}{cuda}/simple/ PROJECT   (only the {cuda} wheels)")
    if result.base_url is None:
        here = result.out.resolve().as_uri()
        print(f"  here: --index-url {shown(here, 200)}/simple/ or --find-links {shown(here, 200)}/index.html")
    return 0


def _say(message: str) -> None:
    print(f"imagegen: {printable(message)}", file=sys.stderr, flush=True)
