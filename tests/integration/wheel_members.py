"""A few files out of a large wheel on PyPI, without downloading the wheel.

A wheel is a zip: its table of contents sits at the end, and each member can be read from its own
offset. With HTTP range requests (PyPI's file host serves them) the headers of torch 2.14.1's 555 MB
wheel cost ~14 MB: the last 4 MB (the table of contents) and the span that holds ``torch/include/``.
A server that ignores ranges gets the whole file instead (what ``pip download`` would fetch).
"""

from __future__ import annotations

import io
import os
import shutil
import time
import urllib.request
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from imagegen.plan.refresh import project_files

INDEX = os.environ.get("IMAGEGEN_TEST_INDEX_URL", "https://pypi.org/simple").rstrip("/")
TAIL = 4 << 20  # the table of contents of torch's wheel is ~1.5 MB
GAP = 8 << 20  # members this close together are fetched in one request


def wheel_url(project: str, version: str, platform: str = "manylinux", machine: str = "x86_64") -> tuple[str, str, int]:
    """The file name, download address and size of ``project``'s wheel ``version`` for Linux x86_64
    (cp311 where it has one per Python) from the index's JSON form (PEP 691)."""
    files = project_files(INDEX, project)
    prefix = project.replace("-", "_") + "-" + version + "-"
    found = [f for f in files if f["filename"].startswith(prefix) and f["filename"].endswith(".whl")
             and platform in f["filename"] and machine in f["filename"]]
    found.sort(key=lambda f: "cp311" not in f["filename"])
    if not found:
        raise LookupError(f"no {platform} {machine} wheel of {project} {version} on {INDEX}/{project}/")
    return found[0]["filename"], found[0]["url"], int(found[0].get("size") or 0)


@dataclass
class RemoteFile(io.RawIOBase):
    """A seekable, read-only view of a file on an HTTP server that answers range requests; what it
    fetched stays in memory (``spans``)."""

    url: str
    size: int
    spans: list[tuple[int, bytes]] = field(default_factory=list)
    fetched: int = 0
    requests: int = 0
    pos: int = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = offset if whence == 0 else self.pos + offset if whence == 1 else self.size + offset
        return self.pos

    def fetch(self, start: int, end: int) -> None:
        start, end = max(0, start), min(end, self.size)
        req = urllib.request.Request(self.url, headers={"Range": f"bytes={start}-{end - 1}"})
        with urllib.request.urlopen(req, timeout=600) as resp:
            data = resp.read()
            whole = resp.status == 200  # the server ignored the range: this is the whole file
        self.requests += 1
        self.fetched += len(data)
        if whole:
            self.spans = [(0, data)]
        else:
            if len(data) != end - start:
                raise OSError(f"{self.url}: asked for {end - start} bytes at {start}, got {len(data)}")
            self.spans.append((start, data))

    def read(self, n: int = -1) -> bytes:
        end = self.size if n is None or n < 0 else min(self.pos + n, self.size)
        for _ in range(2):
            for start, data in self.spans:
                if start <= self.pos and end <= start + len(data):
                    out = data[self.pos - start:end - start]
                    self.pos = end
                    return out
            self.fetch(self.pos, max(end, self.pos + (1 << 20)))
        raise OSError(f"{self.url}: cannot read {end - self.pos} bytes at {self.pos}")


@dataclass(frozen=True)
class Fetched:
    files: int
    fetched_bytes: int
    wheel_bytes: int
    seconds: float


def extract(url: str, size: int, wanted: Callable[[str], bool], dest: Path) -> Fetched:
    """Extract the members ``wanted`` accepts into ``dest`` (paths as in the wheel)."""
    started = time.monotonic()
    remote = RemoteFile(url, size)
    remote.fetch(size - TAIL, size)
    with zipfile.ZipFile(remote) as zf:
        infos = sorted((i for i in zf.infolist() if wanted(i.filename) and not i.is_dir()), key=lambda i: i.header_offset)
        if not infos:
            raise LookupError(f"{url}: nothing wanted in the wheel")
        # one request per run of nearby members (a local header is 30 bytes + name + extra)
        runs: list[list[int]] = []
        for i in infos:
            end = i.header_offset + 30 + len(i.orig_filename.encode()) + 1024 + i.compress_size
            if runs and i.header_offset - runs[-1][1] < GAP:
                runs[-1][1] = max(runs[-1][1], end)
            else:
                runs.append([i.header_offset, end])
        for start, end in runs:
            if not any(s <= start and end <= s + len(d) for s, d in remote.spans):
                remote.fetch(start, end)
        # newest spans first: the member's bytes are found in one list lookup
        remote.spans.sort(key=lambda sd: -len(sd[1]))
        for i in infos:
            target = dest / i.filename
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(i) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out)
    return Fetched(len(infos), remote.fetched, size, round(time.monotonic() - started, 2))
