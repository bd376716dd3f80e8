#!/usr/bin/env python3
"""Refresh the PyPI-derived columns of imagegen/resources/compat/torch.yaml from PyPI's JSON API.

For each torch series in the table it reads the newest release's metadata and rewrites:
  latest        the newest patch release of the series
  python        (oldest, newest) CPython that has a cp3XX manylinux x86_64 wheel
  pypi_default  the CUDA variant its Linux wheel pins (nvidia-cuda-runtime-cuXX==X.Y.* /
                cuda-toolkit==X.Y.*)
The `cuda` lists are curated (download.pytorch.org is their only source) and left alone.
Like cog's compatgen, it refuses a result that looks broken instead of writing it.

    python scripts/refresh_compat.py            # show the changes
    python scripts/refresh_compat.py --write    # and write them
"""

from __future__ import annotations

import argparse
import io
import json
import re
import sys
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

TABLE = Path(__file__).resolve().parent.parent / "imagegen" / "resources" / "compat" / "torch.yaml"
SIMPLE = "https://pypi.org/simple/torch/"
WHEEL = re.compile(r"torch-(\d+\.\d+\.\d+)-cp3(\d+)-cp3\d+t?-(?:manylinux|linux)\S*x86_64\.whl$")


def get(url: str, accept: str | None = None) -> bytes:
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(req, timeout=120) as resp:  # noqa: S310 - fixed https URLs
        return resp.read()


class RangeFile(io.RawIOBase):
    """A read-only, seekable view of a remote file through HTTP range requests, so zipfile can
    read one wheel's METADATA without downloading the multi-GB wheel."""

    def __init__(self, url: str, size: int) -> None:
        self.url, self.size, self.pos = url, size, 0

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = {0: offset, 1: self.pos + offset, 2: self.size + offset}[whence]
        return self.pos

    def read(self, n: int = -1) -> bytes:
        end = self.size if n is None or n < 0 else min(self.size, self.pos + n)
        if end <= self.pos:
            return b""
        req = urllib.request.Request(self.url, headers={"Range": f"bytes={self.pos}-{end - 1}"})
        with urllib.request.urlopen(req, timeout=120) as resp:  # noqa: S310
            data = resp.read()
        self.pos += len(data)
        return data


def wheel_metadata(file: dict) -> str:
    """PEP 658 metadata beside the wheel when the index serves it, else read out of the zip."""
    try:
        return get(file["url"] + ".metadata").decode()
    except urllib.error.HTTPError:
        with zipfile.ZipFile(RangeFile(file["url"], int(file["size"]))) as zf:
            name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
            return zf.read(name).decode()


def wheel_files() -> list[dict]:
    """Every torch file on PyPI, from the PEP 691 JSON simple API (one request)."""
    return json.loads(get(SIMPLE, "application/vnd.pypi.simple.v1+json"))["files"]


def derive(series: str, files: list[dict]) -> dict | None:
    wheels = [(m, f) for f in files if (m := WHEEL.search(f["filename"])) and m.group(1).startswith(series + ".")]
    if not wheels:
        return None
    latest = max((m.group(1) for m, _ in wheels), key=lambda v: int(v.rsplit(".", 1)[1]))
    mine = [(m, f) for m, f in wheels if m.group(1) == latest]
    pys = sorted({int(m.group(2)) for m, _ in mine})
    meta = wheel_metadata(mine[-1][1])
    default = None
    for line in meta.splitlines():
        m = re.match(r"Requires-Dist: nvidia-cuda-runtime-cu\d+\s*\(?==\s*(\d+)\.(\d+)", line) or \
            re.match(r"Requires-Dist: cuda-toolkit\S*\s*==\s*(\d+)\.(\d+)", line)
        if m:
            default = f"cu{m.group(1)}{m.group(2)}"
            break
    if not pys or default is None:
        return None
    return {"latest": latest, "python": [f"3.{pys[0]}", f"3.{pys[-1]}"], "pypi_default": default}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    text = TABLE.read_text()
    series = re.findall(r'^  "(\d+\.\d+)":$', text, flags=re.M)
    files = wheel_files()
    changes = 0
    for s in series:
        got = derive(s, files)
        if got is None:
            print(f"{s}: no usable metadata on PyPI; left as it is", file=sys.stderr)
            continue
        block = re.search(rf'^  "{re.escape(s)}":\n((?:    .*\n)+)', text, flags=re.M)
        assert block
        new = block.group(1)
        new = re.sub(r'(?m)^    latest: ".*"$', f'    latest: "{got["latest"]}"', new)
        new = re.sub(r'(?m)^    python: \[.*\]$', f'    python: ["{got["python"][0]}", "{got["python"][1]}"]', new)
        new = re.sub(r"(?m)^    pypi_default: \S+$", f"    pypi_default: {got['pypi_default']}", new)
        if new != block.group(1):
            changes += 1
            print(f"{s}: {got}")
            text = text.replace(block.group(1), new)
    if len(series) < 8:
        print(f"refusing: only {len(series)} series in {TABLE}; has the file's layout changed?", file=sys.stderr)
        return 1
    if args.write and changes:
        TABLE.write_text(text)
    print(f"{changes} series changed" + ("" if args.write else " (dry run; --write to save)"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
