#!/usr/bin/env python3
"""Refresh the compatibility tables imagegen ships (imagegen/resources/compat/torch.yaml, cuda.yaml) from
PyPI: the maintainers' side of `imagegen refresh`, which does the reading and refuses broken answers.
Users run `imagegen refresh` (it writes their overlay, never the package). Comments and curated fields
(the download.pytorch.org cuda lists, Ubuntu releases) are kept; a new series gets a block in the
table's style, marked `cuda_curated: false` until someone lists its download.pytorch.org variants.

    python scripts/refresh_compat.py            # show the changes
    python scripts/refresh_compat.py --write    # and write them into the package's tables
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from imagegen.plan import refresh  # noqa: E402
from imagegen.errors import ImagegenError  # noqa: E402

COMPAT = ROOT / "imagegen" / "resources" / "compat"
TORCH_FIELDS = ("latest", "released", "python", "cuda", "pypi_default", "cxx11_abi", "manylinux", "cxx_std",
                "cxx_std_min", "cxx_std_min_msvc", "cuda_curated")


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list):
        return "[" + ", ".join(json.dumps(x) if "." in str(x) else str(x) for x in v) + "]"
    return json.dumps(v) if re.fullmatch(r"[\d.]+", str(v)) or " " in str(v) else str(v)


def apply_torch(text: str, rows: dict) -> str:
    for series, row in rows.items():
        block = re.search(rf'^  "{re.escape(series)}":\n((?:    .*\n)+)', text, flags=re.M)
        if block is None:  # a new series: a block in the table's style at the end
            lines = [f'  "{series}":'] + [f"    {k}: {_value(row[k])}" for k in TORCH_FIELDS if k in row]
            text = text.rstrip("\n") + "\n" + "\n".join(lines) + "\n"
            continue
        body = block.group(1)
        for key in ("latest", "python", "pypi_default", "cuda"):
            body = re.sub(rf"(?m)^    {key}: .*$", f"    {key}: {_value(row[key])}", body)
        text = text.replace(block.group(1), body)
    return text


def apply_cuda(text: str, rows: dict) -> str:
    for variant, row in rows.items():
        ubuntu = ", ".join(json.dumps(u) for u in row["ubuntu"])
        line = (f'  {variant}: {{toolkit: "{row["toolkit"]}", pypi_toolkit: "{row["pypi_toolkit"]}", pypi_extras:'
                f' [{", ".join(row["pypi_extras"])}], ubuntu: [{ubuntu}]}}')
        if re.search(rf"(?m)^  {variant}: ", text):
            text = re.sub(rf"(?m)^  {variant}: .*$", line, text)
        else:
            text = text.rstrip("\n") + "\n" + line + "\n"
    return text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--index-url", default=refresh.PYPI)
    args = ap.parse_args()
    try:
        torch_rows, cuda_rows, changes = refresh.refresh(args.index_url)
    except ImagegenError as exc:
        print(f"refresh_compat: {exc}", file=sys.stderr)
        return 1
    print("\n".join(changes) or "the tables are current")
    if args.write and changes:
        for name, apply, rows in (("torch.yaml", apply_torch, torch_rows), ("cuda.yaml", apply_cuda, cuda_rows)):
            path = COMPAT / name
            path.write_text(apply(path.read_text(), rows))
        print("written; run the tests (the golden files may need `imagegen bake --repo`)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
