"""`imagegen refresh`: the compatibility tables brought up to date from PyPI, as a user-level overlay.

What PyPI can tell, read from its JSON simple API (PEP 691) and each release's wheel metadata (PEP 658,
or the wheel's METADATA read through HTTP range requests, never the multi-GB wheel):
  - every torch series with a release on PyPI: its newest release, the CPython range of its Linux
    wheels, the CUDA variant its PyPI wheel pins (``nvidia-cuda-runtime-cuXX==X.Y.*`` or
    ``cuda-toolkit==X.Y.*``), and the ABI/manylinux/C++ facts of the series before it;
  - every CUDA 13+ toolkit ``cuda-toolkit`` publishes with a compiler (the newest X.Y.Z of each X.Y).
What it cannot tell stays curated and is marked so: the cuXYZ builds on download.pytorch.org (a new
series lists only its PyPI variant, ``cuda_curated: false``), the Ubuntu releases of NVIDIA's images.

The result is written to the overlay folder (``$IMAGEGEN_COMPAT_DIR``, else
``$XDG_CONFIG_HOME/imagegen/compat``, else ``~/.config/imagegen/compat``), never into the installed
package; imagegen.model.compat reads the overlay over its own tables. Like cog's compatgen, a result
that looks broken is refused instead of written: a release going backwards, a series or a Python
disappearing, a default variant with no known toolkit, an answer with far fewer series than the table.
"""

from __future__ import annotations

import io
import os
import re
import struct
import urllib.parse
import zipfile
import zlib
from datetime import date
from pathlib import Path
from typing import Any

from imagegen import outputs, safety, untrusted, yamlio
from imagegen.errors import CompatError, Unreadable, UsageError
from imagegen.model import compat

PYPI = "https://pypi.org/simple/"
JSON_API = "application/vnd.pypi.simple.v1+json"
TORCH_WHEEL = re.compile(r"torch-(\d+)\.(\d+)\.(\d+)-cp3(\d+)-cp3\d+t?-(?:manylinux|linux)\S*x86_64\.whl$")
TOOLKIT_FILE = re.compile(r"cuda_toolkit-(\d+)\.(\d+)\.(\d+)(?:\.\d+)?-\S+\.whl$")
CUDA_PIN = (re.compile(r"Requires-Dist: nvidia-cuda-runtime-cu\d+\s*\(?\s*==\s*(\d+)\.(\d+)"),
            re.compile(r"Requires-Dist: cuda-toolkit\S*\s*\(?\s*==\s*(\d+)\.(\d+)"))
MAX_ANSWER = 64 << 20  # PyPI's torch page is ~2 MB of JSON
MAX_METADATA = 4 << 20  # a wheel's METADATA: a few KB (torch's ~10 KB); a larger one is refused, never inflated
MAX_RANGE_BYTES = 64 << 20  # what range requests may read of one wheel: its end record and central directory
DEADLINE = 300.0  # seconds for all the requests of one refresh together ($IMAGEGEN_REFRESH_DEADLINE)
PYPI_EXTRAS = ["nvcc", "crt", "cccl", "cudart", "nvvm"]


# --------------------------------------------------------------------------------------------
# Reading PyPI. The index is untrusted: every answer goes through imagegen.untrusted.http_get (http(s)
# only, also after a redirect; bounded in size; all requests within one total deadline), every page
# through its bounded JSON loader, and a wheel's METADATA is read within MAX_METADATA.


def deadline_seconds() -> float:
    """The total time one refresh may spend on the index: $IMAGEGEN_REFRESH_DEADLINE, else DEADLINE."""
    raw = os.environ.get("IMAGEGEN_REFRESH_DEADLINE", "").strip()
    if not raw:
        return DEADLINE
    try:
        seconds = float(raw)
    except ValueError:
        seconds = float("nan")
    if not 0 < seconds <= 86400:
        raise UsageError(f"IMAGEGEN_REFRESH_DEADLINE={raw[:40]!r}: give a number of seconds (at most 86400)")
    return seconds


def _fetch(url: str, deadline: untrusted.Deadline, *, limit: int = MAX_ANSWER,
           headers: dict[str, str] | None = None) -> tuple[bytes, str, int]:
    """(body, final URL, status); untrusted.HTTPStatusError for an error status, CompatError for anything else."""
    try:
        return untrusted.http_get(url, deadline=deadline, limit=limit, headers=headers)
    except untrusted.HTTPStatusError:
        raise
    except untrusted.Unreachable as exc:
        raise CompatError(f"cannot read {url}: {exc} (offline? give --index-url of a PyPI mirror)") from None
    except Unreadable as exc:  # it answered, and the answer is refused (too large, too slow, a redirect loop)
        raise CompatError(f"cannot read {url}: {exc}") from None


def get(url: str, accept: str | None = None, limit: int = MAX_ANSWER, *,
        deadline: untrusted.Deadline | None = None) -> bytes:
    """The body of ``url`` (see _fetch)."""
    deadline = deadline or untrusted.Deadline(deadline_seconds())
    return _fetch(url, deadline, limit=limit, headers={"Accept": accept} if accept else None)[0]


class _RangeFile(io.RawIOBase):
    """A read-only, seekable view of a remote file through HTTP range requests: zipfile reads one
    wheel's METADATA without downloading the wheel. At most MAX_RANGE_BYTES are read through it, each
    answer must be the range asked for (206), all within the refresh's deadline."""

    def __init__(self, url: str, size: int, deadline: untrusted.Deadline) -> None:
        self.url, self.size, self.pos, self.deadline = url, size, 0, deadline
        self.budget = MAX_RANGE_BYTES

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
        if end - self.pos > self.budget:
            raise CompatError(f"{self.url}: its zip directory would take over {MAX_RANGE_BYTES >> 20} MiB of range"
                              " requests to read: refusing it (not a wheel as PyPI serves them)")
        try:
            data, _, status = _fetch(self.url, self.deadline, limit=end - self.pos,
                                     headers={"Range": f"bytes={self.pos}-{end - 1}"})
        except untrusted.HTTPStatusError as exc:
            raise CompatError(f"{self.url}: HTTP {exc.code} to a range request") from None
        if status != 206:
            raise CompatError(f"{self.url}: the server ignores range requests (HTTP {status}): imagegen reads a"
                              " wheel's METADATA by range, never the whole wheel")
        self.budget -= len(data)
        self.pos += len(data)
        return data


def _file_url(page: str, entry: dict, project: str) -> str:
    """A file's URL as the page gives it, relative ones resolved against the page's URL (PEP 691);
    only http(s) URLs are taken."""
    url = entry.get("url")
    if not isinstance(url, str) or not url or len(url) > 4096:
        raise CompatError(f"{page}: the {project} page is not PEP 691 JSON ({entry['filename'][:100]!r} has no url)")
    resolved = urllib.parse.urljoin(page, url)
    scheme = urllib.parse.urlsplit(resolved).scheme.lower()
    if scheme not in untrusted.HTTP_SCHEMES:
        raise CompatError(f"{page}: the {project} page lists {entry['filename'][:100]!r} at a {scheme or 'schemeless'}"
                          " URL: only http(s) URLs from an index are read")
    return resolved


def project_files(index: str, project: str, deadline: untrusted.Deadline | None = None, *,
                  absent_ok: bool = False) -> list[dict]:
    """The files of ``project``'s PEP 691 page, each with its ``url`` resolved (an absolute http(s) URL)
    and its ``size`` checked; CompatError (one line) for a page that is not PEP 691 JSON. ``absent_ok``:
    no files (not an error) where the index has no such project (HTTP 404)."""
    deadline = deadline or untrusted.Deadline(deadline_seconds())
    url = index.rstrip("/") + f"/{project}/"
    try:
        page, final, _ = _fetch(url, deadline, headers={"Accept": JSON_API})
    except untrusted.HTTPStatusError as exc:
        if absent_ok and exc.code == 404:
            return []
        raise CompatError(f"{url}: HTTP {exc.code}: the index has no {project} project page (a PyPI-compatible"
                          " simple index with the JSON API is needed)") from None
    not_pep691 = f"{index}: the {project} page is not PEP 691 JSON"
    try:
        doc = untrusted.loads_json(page)
    except Unreadable as exc:
        raise CompatError(f"{not_pep691} ({exc}): use a PyPI-compatible index") from None
    files = doc.get("files") if isinstance(doc, dict) else None
    if not isinstance(files, list):
        raise CompatError(f"{not_pep691} (no list of files): use a PyPI-compatible index")
    out = []
    for n, f in enumerate(files):
        if not isinstance(f, dict) or not isinstance(f.get("filename"), str):
            raise CompatError(f"{not_pep691} (its file {n} is not a mapping with a filename)")
        size = f.get("size")
        if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 0):
            raise CompatError(f"{not_pep691} ({f['filename'][:100]!r} has size {safety.describe(size, 40)},"
                              " not a number of bytes)")
        out.append({**f, "url": _file_url(final, f, project)})
    return out


def wheel_metadata(file: dict, deadline: untrusted.Deadline | None = None) -> str:
    """PEP 658 metadata beside the wheel when the index serves it, else read out of the zip by range
    requests; at most MAX_METADATA bytes either way (a larger METADATA is refused, never inflated)."""
    deadline = deadline or untrusted.Deadline(deadline_seconds())
    name, url = file["filename"][:200], file["url"]
    if file.get("core-metadata") or file.get("data-dist-info-metadata"):
        try:
            data = _fetch(url.split("#", 1)[0] + ".metadata", deadline, limit=MAX_METADATA)[0]
            return data.decode("utf-8", "replace")
        except untrusted.HTTPStatusError:
            pass
    size = file.get("size")
    if not isinstance(size, int) or isinstance(size, bool) or size < 22:
        raise CompatError(f"{name}: the index gives no size{'' if size is None else ' that can be'} of a wheel,"
                          " and no PEP 658 metadata: its METADATA cannot be read without downloading it")
    try:
        with zipfile.ZipFile(_RangeFile(url, size, deadline)) as zf:
            found = [i for i in zf.infolist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", i.filename)]
            if not found:
                raise CompatError(f"{name}: no *.dist-info/METADATA in the wheel at {url}")
            return untrusted.read_member(zf, found[0], limit=MAX_METADATA).decode("utf-8", "replace")
    except Unreadable as exc:
        raise CompatError(f"{name}: its METADATA {exc}: refused") from None
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError, OverflowError, struct.error,
            NotImplementedError, zlib.error, OSError) as exc:
        raise CompatError(f"{name} at {url}: not a readable wheel ({exc.__class__.__name__})") from None


def torch_releases(files: list[dict]) -> dict[str, dict]:
    """series -> {latest, python: [lo, hi], wheel: a file of the latest release} from PyPI's torch files."""
    by_series: dict[str, dict[tuple[int, int, int], list]] = {}
    for f in files:
        m = TORCH_WHEEL.search(f["filename"])
        if m and not f.get("yanked"):
            major, minor, patch, py = (int(x) for x in m.groups())
            by_series.setdefault(f"{major}.{minor}", {}).setdefault((major, minor, patch), []).append((py, f))
    out = {}
    for series, releases in by_series.items():
        newest = max(releases)
        pys = sorted({py for py, _ in releases[newest]})
        out[series] = {"latest": ".".join(map(str, newest)), "python": [f"3.{pys[0]}", f"3.{pys[-1]}"],
                       "wheel": max(releases[newest], key=lambda pf: pf[0])[1]}
    return out


def pinned_variant(metadata: str) -> str | None:
    for line in metadata.splitlines():
        for pattern in CUDA_PIN:
            m = pattern.match(line)
            if m:
                return f"cu{m.group(1)}{m.group(2)}"
    return None


def toolkits(files: list[dict]) -> dict[str, str]:
    """cuXYZ -> the newest cuda-toolkit X.Y.Z on PyPI (the wheels that carry nvcc: CUDA 13 on)."""
    out: dict[str, tuple[int, int, int]] = {}
    for f in files:
        m = TOOLKIT_FILE.search(f["filename"])
        if m and not f.get("yanked"):
            v = tuple(int(x) for x in m.groups())
            if v[0] >= 13:
                key = f"cu{v[0]}{v[1]}"
                out[key] = max(out.get(key, v), v)
    return {k: ".".join(map(str, v)) for k, v in sorted(out.items())}


# --------------------------------------------------------------------------------------------
# The overlay


def refresh(index: str = PYPI, *, today: str | None = None,
            deadline: untrusted.Deadline | None = None) -> tuple[dict, dict, list[str]]:
    """(torch overlay, cuda overlay, what changed) against the tables imagegen reads now. ``deadline``: the
    one that every request of this refresh shares (else a new one of deadline_seconds())."""
    known_torch, known_cuda = compat.torch_table(), compat.cuda_table()
    stamp = today or date.today().isoformat()
    deadline = deadline or untrusted.Deadline(deadline_seconds())
    releases = torch_releases(project_files(index, "torch", deadline))
    kits = toolkits(project_files(index, "cuda-toolkit", deadline))
    torch_rows: dict[str, Any] = {}
    cuda_rows: dict[str, Any] = {}
    changes: list[str] = []

    for variant, version in kits.items():
        old = known_cuda.get(variant)
        if old is None:
            cuda_rows[variant] = {"toolkit": version, "pypi_toolkit": version, "pypi_extras": PYPI_EXTRAS,
                                  "ubuntu": [], "source": f"imagegen refresh {stamp} (PyPI cuda-toolkit)",
                                  "ubuntu_curated": False}
            changes.append(f"CUDA {variant}: new, cuda-toolkit {version} from PyPI")
        elif old.pypi_toolkit is not None and _newer(version, old.pypi_toolkit):
            cuda_rows[variant] = {**_cuda_row(old), "pypi_toolkit": version,
                                  "source": f"imagegen refresh {stamp} (PyPI cuda-toolkit)"}
            changes.append(f"CUDA {variant}: cuda-toolkit {old.pypi_toolkit} -> {version}")

    newest_known = max(known_torch.values(), key=lambda s: s.key)
    for series, got in sorted(releases.items(), key=lambda kv: compat.major_minor(kv[0])):
        old = known_torch.get(series)
        if old is None and compat.major_minor(series) < newest_known.key:
            continue  # an old series the table never carried (before 2.4): not imagegen's to add
        variant = pinned_variant(wheel_metadata(got["wheel"], deadline))
        if variant is None:
            raise CompatError(f"torch {got['latest']}: its wheel pins no CUDA runtime (nvidia-cuda-runtime-cuXX /"
                              " cuda-toolkit): refusing to guess its default variant")
        if variant not in known_cuda and variant not in cuda_rows:
            raise CompatError(f"torch {got['latest']} pins CUDA {variant}, which no known toolkit provides:"
                              " refusing (update imagegen, or its cuda table)")
        if old is None:
            torch_rows[series] = {
                "latest": got["latest"], "released": stamp[:7], "python": got["python"], "cuda": [variant],
                "pypi_default": variant, "cxx11_abi": newest_known.cxx11_abi, "manylinux": newest_known.manylinux,
                "cxx_std": newest_known.cxx_std, "cxx_std_min": newest_known.cxx_std_min,
                "cxx_std_min_msvc": newest_known.cxx_std_min_msvc, "cuda_curated": False,
                "source": f"imagegen refresh {stamp} (PyPI; the download.pytorch.org variants are not known)"}
            changes.append(f"torch {series}: new, {got['latest']}, Python {got['python'][0]}-{got['python'][1]},"
                           f" PyPI's variant {variant}")
            continue
        _refuse_suspicious(old, got, variant)
        row = _torch_row(old)
        new = {**row, "latest": got["latest"], "python": got["python"], "pypi_default": variant}
        if variant not in new["cuda"]:
            new["cuda"] = [*new["cuda"], variant]
        if new != row:
            torch_rows[series] = {**new, "source": f"imagegen refresh {stamp} (PyPI)"}
            changes.append(f"torch {series}: " + ", ".join(f"{k} {row[k]} -> {new[k]}" for k in new if new[k] != row[k]))
    gone = [s for s in known_torch if s not in releases]
    if len(gone) > len(known_torch) // 2:
        raise CompatError(f"PyPI lists none of torch {', '.join(gone)}: refusing an answer that lost most of the"
                          " table (a wrong --index-url?)")
    return torch_rows, cuda_rows, changes


def _newer(a: str, b: str) -> bool:
    return tuple(int(x) for x in a.split(".")) > tuple(int(x) for x in b.split("."))


def _refuse_suspicious(old: compat.TorchSeries, got: dict, variant: str) -> None:
    if _newer(old.latest, got["latest"]):
        raise CompatError(f"torch {old.series}: PyPI's newest is {got['latest']}, older than the table's {old.latest}:"
                          " refusing (a stale mirror?)")
    lo, hi = (compat.major_minor(p) for p in got["python"])
    if lo > compat.major_minor(old.python[0]) or hi < compat.major_minor(old.python[1]):
        raise CompatError(f"torch {old.series}: PyPI's wheels cover Python {got['python'][0]}-{got['python'][1]},"
                          f" less than the table's {old.python[0]}-{old.python[1]}: refusing")


def _torch_row(s: compat.TorchSeries) -> dict:
    return {"latest": s.latest, "python": list(s.python), "cuda": list(s.cuda), "pypi_default": s.pypi_default,
            "cxx11_abi": s.cxx11_abi, "manylinux": s.manylinux, "cxx_std": s.cxx_std,
            "cxx_std_min": s.cxx_std_min, "cxx_std_min_msvc": s.cxx_std_min_msvc}


def _cuda_row(v: compat.CudaVariant) -> dict:
    return {"toolkit": v.toolkit, "pypi_toolkit": v.pypi_toolkit, "pypi_extras": list(v.pypi_extras),
            "ubuntu": list(v.ubuntu)}


def write_overlay(folder: Path, torch_rows: dict, cuda_rows: dict) -> list[Path]:
    """Merge the rows into the overlay's torch.yaml / cuda.yaml (atomically); returns what it wrote."""
    written = []
    rows_by_file = {"torch.yaml": torch_rows, "cuda.yaml": cuda_rows}
    for name, key in compat.OVERLAY_KEYS.items():  # the files and mappings compat reads the overlay from
        rows = rows_by_file[name]
        if not rows:
            continue
        path = folder / name
        current = compat.read_overlay(path, key)
        merged = {**current, **rows}
        text = ("# Written by `imagegen refresh` (PyPI); imagegen reads it over its own tables. Delete the file\n"
                "# to go back to the tables imagegen ships.\n" + yamlio.dump({"schema": 1, key: merged}))
        folder.mkdir(parents=True, exist_ok=True)
        outputs.write_text_atomic(path, text, what="compatibility overlay")
        written.append(path)
    return written


def run(index: str | None, dry_run: bool, deadline: untrusted.Deadline | None = None) -> int:
    if index is not None and not re.fullmatch(r"https?://[A-Za-z0-9._~:/@%+-]+", index):
        raise UsageError(f"--index-url {index!r}: give the http(s) URL of a PyPI-compatible simple index")
    torch_rows, cuda_rows, changes = refresh(index or PYPI, deadline=deadline)
    for line in changes:
        print(line)
    if not changes:
        print("the compatibility tables are current")
        return 0
    if dry_run:
        print(f"(dry run: {compat.overlay_dir()} not written)")
        return 0
    for path in write_overlay(compat.overlay_dir(), torch_rows, cuda_rows):
        print(f"wrote {path}")
    return 0
