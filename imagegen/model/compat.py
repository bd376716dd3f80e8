"""The compatibility model: torch <-> CUDA <-> Python.

All facts live in ``imagegen/resources/compat/*.yaml`` (refreshed by scripts/refresh_compat.py);
this module only loads them into types and answers questions about them, and reads the overlay
`imagegen refresh` writes. The builder base images per flavor (base_images.yaml) are in
:mod:`imagegen.model.base_images`; the arch side (nvcc <-> GPU arch) is in :mod:`imagegen.model.arch`.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from imagegen import safety, yamlio
from imagegen.errors import CompatError, UsageError

# The tables `imagegen refresh` may extend, and the mapping in each that it adds rows to.
OVERLAY_KEYS = {"torch.yaml": "series", "cuda.yaml": "variants"}
MAX_OVERLAY_BYTES = 1 << 20


def load_table(name: str) -> dict[str, Any]:
    """One table of resources/compat, with the overlay's rows where `imagegen refresh` extends it."""
    path = resources.files("imagegen") / "resources" / "compat" / name
    data = yamlio.load(path.read_text(encoding="utf-8"))
    key = OVERLAY_KEYS.get(name)
    if key is not None:
        data[key] = {**data[key], **read_overlay(overlay_dir() / name, key)}
    return data


def overlay_dir() -> Path:
    """Where `imagegen refresh` writes its overlay: user-level, never the installed package."""
    if os.environ.get("IMAGEGEN_COMPAT_DIR"):
        return Path(os.environ["IMAGEGEN_COMPAT_DIR"]).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base).expanduser() / "imagegen" / "compat"


def read_overlay(path: Path, key: str) -> dict[str, Any]:
    """The rows of an overlay file `imagegen refresh` wrote ({} where there is none); a broken one is a
    one-line error naming it (delete it to go back to imagegen's own tables)."""
    try:
        raw = safety.read_regular_file(path, limit=MAX_OVERLAY_BYTES)
    except safety.Unreadable as exc:
        if not path.exists() and not path.is_symlink():
            return {}
        raise CompatError(f"{path}: cannot read the compatibility overlay: {exc} (delete it, or run imagegen refresh)")
    try:
        data = yamlio.load_untrusted(raw.decode("utf-8"))
        rows = data[key] if isinstance(data, dict) else None
        if not isinstance(rows, dict) or not all(isinstance(k, str) and isinstance(v, dict) for k, v in rows.items()):
            raise ValueError(f"no {key} mapping")
    except (UnicodeDecodeError, ValueError, KeyError, TypeError, yamlio.YAMLError) as exc:
        raise CompatError(f"{path}: not a compatibility overlay ({str(exc)[:80]}): delete it, or run imagegen"
                          " refresh") from None
    return rows


def reload() -> None:
    """Read the tables again (after `imagegen refresh` wrote the overlay)."""
    from imagegen.model import base_images  # it imports this module: its cache is cleared from here

    for cached in (torch_table, cuda_table, base_images.flavors):
        cached.cache_clear()


# --------------------------------------------------------------------------------------------
# torch


@dataclass(frozen=True)
class TorchSeries:
    series: str  # "2.8"
    latest: str  # "2.8.0"
    python: tuple[str, str]
    cuda: tuple[str, ...]  # ("cu126", "cu128", "cu129")
    pypi_default: str
    cxx11_abi: bool
    manylinux: str
    cxx_std: str
    # The oldest C++ standard an extension may compile torch's headers under (GCC/Clang/nvcc, and
    # MSVC): below it the build fails (torch.yaml says why per series).
    cxx_std_min: str = "17"
    cxx_std_min_msvc: str = "17"

    def min_cxx_std(self, msvc: bool = False) -> int:
        """The oldest standard (17, 20) the headers of this series compile under, with MSVC or not."""
        return int(self.cxx_std_min_msvc if msvc else self.cxx_std_min)

    @property
    def key(self) -> tuple[int, int]:
        return major_minor(self.series)

    def supports_python(self, py: str) -> bool:
        return major_minor(self.python[0]) <= major_minor(py) <= major_minor(self.python[1])

    @property
    def pythons(self) -> list[str]:
        lo, hi = major_minor(self.python[0]), major_minor(self.python[1])
        return [f"3.{m}" for m in range(lo[1], hi[1] + 1)] if lo[0] == hi[0] == 3 else []


@dataclass(frozen=True)
class CudaVariant:
    name: str  # "cu128"
    toolkit: str  # "12.8.1"
    pypi_toolkit: str | None
    pypi_extras: tuple[str, ...]
    ubuntu: tuple[str, ...]

    @property
    def version(self) -> Version:
        return Version(f"{self.major}.{self.minor}")

    @property
    def major(self) -> int:
        return int(self.name[2:-1])

    @property
    def minor(self) -> int:
        return int(self.name[-1])

    @property
    def dotted(self) -> str:
        return f"{self.major}.{self.minor}"

    def __str__(self) -> str:
        return self.name


def major_minor(text: str) -> tuple[int, int]:
    """(2, 8) for "2.8", "2.8.1" or "3.12": series and Pythons compare as numbers, not text."""
    parts = str(text).split(".")
    return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0


@functools.cache
def torch_table() -> dict[str, TorchSeries]:
    raw = load_table("torch.yaml")["series"]
    out = {}
    for series, row in raw.items():
        out[str(series)] = TorchSeries(
            series=str(series),
            latest=str(row["latest"]),
            python=(str(row["python"][0]), str(row["python"][1])),
            cuda=tuple(row["cuda"]),
            pypi_default=row["pypi_default"],
            cxx11_abi=bool(row["cxx11_abi"]),
            manylinux=row["manylinux"],
            cxx_std=str(row["cxx_std"]),
            # A row of an older overlay (imagegen refresh before these fields) has only cxx_std: the
            # standard torch itself compiles with is then the safe minimum to ask for.
            cxx_std_min=str(row.get("cxx_std_min", row["cxx_std"])),
            cxx_std_min_msvc=str(row.get("cxx_std_min_msvc", row.get("cxx_std_min", row["cxx_std"]))),
        )
    return dict(sorted(out.items(), key=lambda kv: kv[1].key))


@functools.cache
def cuda_table() -> dict[str, CudaVariant]:
    raw = load_table("cuda.yaml")["variants"]
    raw = dict(sorted(raw.items(), key=lambda kv: (int(kv[0][2:-1]), int(kv[0][-1]))))  # cu118 ... cu132, cu133
    return {
        name: CudaVariant(
            name=name,
            toolkit=str(row["toolkit"]),
            pypi_toolkit=None if row.get("pypi_toolkit") is None else str(row["pypi_toolkit"]),
            pypi_extras=tuple(row.get("pypi_extras") or ()),
            ubuntu=tuple(str(u) for u in row.get("ubuntu") or ()),
        )
        for name, row in raw.items()
    }


_TORCH_RE = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


def torch_series(text: str) -> tuple[TorchSeries, str]:
    """Resolve ``--torch`` (``2.8`` or ``2.8.0``) to its series and the exact release to install."""
    t = str(text).strip()
    m = _TORCH_RE.fullmatch(t)
    table = torch_table()
    if not m:
        raise UsageError(f"--torch {t!r} is not a torch version like 2.8 or 2.8.0")
    series = f"{m.group(1)}.{m.group(2)}"
    if series not in table:
        raise CompatError(
            f"torch {series} is not in imagegen's compatibility table (known: {', '.join(table)});"
            " run `imagegen refresh` (adds the series PyPI has to your overlay) or pick a known series"
        )
    row = table[series]
    return row, t if m.group(3) is not None else row.latest


_CUDA_RE = re.compile(r"(?:cu)?(\d{2})(\d)|(\d{2})\.(\d)(?:\.\d+)?")


def cuda_variant(text: str) -> CudaVariant:
    """Resolve ``--cuda`` (``12.8``, ``12.8.1``, ``cu128``, ``128``) to a torch CUDA variant."""
    t = str(text).strip().lower()
    m = _CUDA_RE.fullmatch(t)
    if not m:
        raise UsageError(f"--cuda {text!r} is not a CUDA version like 12.8 or cu128")
    major, minor = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
    name = f"cu{int(major)}{minor}"
    table = cuda_table()
    if name not in table:
        with_torch = [v for v in table if any(v in s.cuda for s in torch_table().values())]
        raise CompatError(f"CUDA {int(major)}.{minor} has no torch wheels (known: {', '.join(with_torch)});"
                          " `imagegen refresh` adds what PyPI has since")
    return table[name]


def validate_python(text: str) -> str:
    """``--python`` as users write it (3.12, 312, py312, cp312, 3.12.4) as ``3.12``."""
    t = str(text).strip().lower()
    if t.startswith(("py", "cp")):
        t = t[2:]
    if re.fullmatch(r"3\d{1,2}", t):
        t = f"3.{t[1:]}"
    m = re.fullmatch(r"(3\.\d{1,2})(?:\.\d{1,3})?", t)
    if not m:
        raise UsageError(f"--python {text!r} is not a CPython version like 3.12 (or 312, cp312)")
    return m.group(1)


def torch_index_url(series: TorchSeries, cuda: CudaVariant, override: str | None = None) -> str | None:
    """Where pip gets this torch build: PyPI (None) for the series' default variant, else the
    PyTorch index for that variant. ``override`` may contain ``{cuda}``."""
    if override:
        url = override.replace("{cuda}", cuda.name)
        safety.validate(url, safety.URL, "torch index URL")
        return safety.no_credentials(url, "torch index URL", safety.NETRC_INSTEAD)
    if cuda.name == series.pypi_default:
        return None
    return f"https://download.pytorch.org/whl/{cuda.name}"


def parse_version(text: str, what: str) -> Version:
    try:
        return Version(text)
    except InvalidVersion:
        raise UsageError(f"{what} {text!r} is not a version") from None
