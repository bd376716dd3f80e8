"""The compatibility model: torch <-> CUDA <-> Python, and the builder base images per flavor.

All facts live in ``imagegen/resources/compat/*.yaml`` (refreshed by scripts/refresh_compat.py);
this module only loads them into types and answers questions about them. The arch side
(nvcc <-> GPU arch) is in :mod:`imagegen.model.arch`.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

from packaging.version import InvalidVersion, Version

from imagegen import safety, yamlio
from imagegen.errors import CompatError, NoBaseImage, UsageError

# The tables `imagegen refresh` may extend, and the mapping in each that it adds rows to.
OVERLAY_KEYS = {"torch.yaml": "series", "cuda.yaml": "variants"}
MAX_OVERLAY_BYTES = 1 << 20


def _load(name: str) -> dict[str, Any]:
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
    for cached in (torch_table, cuda_table, flavors):
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
    raw = _load("torch.yaml")["series"]
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
    raw = _load("cuda.yaml")["variants"]
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


def check_python(text: str) -> str:
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
        safety.check(url, safety.URL, "torch index URL")
        return safety.no_credentials(url, "torch index URL", safety.NETRC_INSTEAD)
    if cuda.name == series.pypi_default:
        return None
    return f"https://download.pytorch.org/whl/{cuda.name}"


# --------------------------------------------------------------------------------------------
# Base images


@dataclass(frozen=True, eq=False)  # one instance per flavor (cached): identity is equality
class Flavor:
    name: str
    description: str
    os: str  # "apt" | "dnf"
    toolkit: str  # "image" | "pypi"
    python_template: str
    pythons: tuple[str, ...]
    stubs_in_library_path: bool
    raw: Mapping[str, Any]

    def python_path(self, py: str) -> str:
        return self.python_template.format(py=py, pyd=py.replace(".", ""))


@dataclass(frozen=True)
class BaseImage:
    """The image a builder starts FROM, and what imagegen knows about its contents."""

    ref: str
    flavor: Flavor
    python: str  # interpreter inside the image
    toolkit: str  # "image" | "pypi"
    nvcc: Version | None  # nvcc in the image (None: from PyPI, or unknown for a custom image)
    image_torch_cuda: str | None  # CUDA variant of a torch preinstalled in the image, if known
    # The torch release preinstalled in ``python`` (None: none, or not known): a cell asking for
    # exactly it (and ``image_torch_cuda``) reuses it instead of downloading torch again.
    image_torch: str | None = None
    # The images tried, in order, when ``ref`` cannot be pulled (same CUDA; seed 001's ALT_LINUX_IMAGE_CU*):
    # the manylinux flavor's sameli image, or the later images of --base-image CUDA=PRIMARY,FALLBACK.
    fallbacks: tuple[str, ...] = ()
    deadsnakes: bool = False  # Python must come from the deadsnakes PPA
    custom: bool = False
    # Where the builder's torch comes from when it is not PyTorch's own index (the jetson flavor's
    # jetson-ai-lab index of its JetPack); None: PyPI or download.pytorch.org by the CUDA variant.
    torch_index: str | None = None
    # The compute capabilities of the only GPUs this image's system runs on (a Jetson's), and their
    # name; empty: any GPU.
    runs_on: tuple[str, ...] = ()
    device: str | None = None

    @property
    def fallback(self) -> str | None:
        return self.fallbacks[0] if self.fallbacks else None


@functools.cache
def container_flavors() -> tuple[str, ...]:
    """The flavors a builder image can be made from (base_images.yaml; `native` is the host itself)."""
    return tuple(name for name, f in flavors().items() if f.os != "none")


@functools.cache
def base_images_data() -> dict[str, Any]:
    """base_images.yaml's top-level settings besides the flavors (arm64_index_min_torch, ...)."""
    return {k: v for k, v in _load("base_images.yaml").items() if k != "flavors"}


@functools.cache  # one Flavor instance per name: Flavor's equality is identity
def flavors() -> dict[str, Flavor]:
    raw = _load("base_images.yaml")["flavors"]
    return {
        name: Flavor(
            name=name,
            description=row["description"],
            os=row["os"],
            toolkit=row["toolkit"],
            python_template=row["python"],
            pythons=tuple(str(p) for p in row["pythons"]),
            stubs_in_library_path=bool(row.get("stubs_in_library_path")),
            raw=row,
        )
        for name, row in raw.items()
    }


def flavor(name: str) -> Flavor:
    table = flavors()
    if name not in table:
        raise UsageError(f"--flavor {name!r} is not one of {', '.join(table)}")
    return table[name]


def _digits(version: str) -> str:
    return version.replace(".", "")


def resolve_base_image(fl: Flavor, series: TorchSeries, torch_version: str, cuda: CudaVariant,
                       python: str, override: str | None = None) -> BaseImage:
    """Pick the base image for a cell, or raise NoBaseImage with the reason."""
    if python not in fl.pythons:
        raise NoBaseImage(f"the {fl.name} flavor has no Python {python} (it has {', '.join(fl.pythons)})")
    if override:
        # PRIMARY[,FALLBACK...]: the later images are tried in order when the first cannot be pulled.
        first, *rest = override.split(",")
        base = _custom_base(fl, first.strip(" "), python)
        fallbacks = []
        for ref in (r.strip(" ") for r in rest):
            other = _custom_base(fl, ref, python)
            if other.nvcc and base.nvcc and major_minor(str(other.nvcc)) != major_minor(str(base.nvcc)):
                raise NoBaseImage(f"--base-image: the fallback {ref} has CUDA {other.nvcc}, but {first} has"
                                  f" {base.nvcc}: a fallback must carry the same CUDA version")
            if ref != base.ref and ref not in fallbacks:
                fallbacks.append(ref)
        return dataclasses.replace(base, fallbacks=tuple(fallbacks)) if fallbacks else base
    builder = _BUILDERS[fl.name]
    return builder(fl, series, torch_version, cuda, python)


def on_fallback(base: BaseImage, ref: str, python: str) -> BaseImage:
    """``base`` with its fallback ``ref`` in place of the primary: what imagegen knows of that image
    (a custom image's tag is read again: its torch may differ), with no further fallbacks."""
    if base.custom:
        return _custom_base(base.flavor, ref, python)
    return dataclasses.replace(base, ref=ref, fallbacks=())


def _runpod(fl: Flavor, series: TorchSeries, torch_version: str, cuda: CudaVariant, python: str) -> BaseImage:
    raw = fl.raw
    matches = [img for img in raw["images"] if major_minor(img["cuda"]) == (cuda.major, cuda.minor)]
    if not matches:
        have = ", ".join(img["cuda"] for img in raw["images"])
        raise NoBaseImage(
            f"runpod/pytorch has no CUDA {cuda.dotted} image (it has {have}); use --flavor cuda, manylinux"
            + (" or pypi" if cuda.pypi_toolkit else "") + ", or a CUDA the runpod images carry"
        )
    img = matches[0]
    torches = img["torch"]
    # Same torch as asked when runpod ships it, else the newest torch of that CUDA image: the
    # builder installs the requested torch on top either way.
    tv = torch_version if torch_version in torches else sorted(torches, key=Version)[-1]
    ubuntu = img["ubuntu"][-1]
    ref = raw["template"].format(
        release=raw["release"], cuda_digits=_digits(img["cuda"]), torch_digits=_digits(tv),
        ubuntu_digits=_digits(ubuntu),
    )
    return BaseImage(ref=ref, flavor=fl, python=fl.python_path(python), toolkit="image",
                     nvcc=Version(img["cuda"]), image_torch_cuda=torches[tv],
                     image_torch=tv if python == str(raw.get("torch_python")) else None)


def _manylinux(fl: Flavor, series: TorchSeries, torch_version: str, cuda: CudaVariant, python: str) -> BaseImage:
    raw = fl.raw
    mm = cuda.dotted
    primary = raw["template"].format(cuda_mm=mm) if mm in raw["cuda"] else None
    fallback = raw["fallback_template"].format(cuda_mm=mm) if mm in raw["fallback_cuda"] else None
    if primary is None and fallback is None:
        raise NoBaseImage(
            f"no manylinux builder image for CUDA {mm} (pytorch/manylinux2_28-builder has"
            f" {', '.join(raw['cuda'])}; sameli has {', '.join(raw['fallback_cuda'])})"
        )
    ref = primary or fallback
    return BaseImage(ref=ref, flavor=fl, python=fl.python_path(python), toolkit="image",
                     nvcc=Version(mm), image_torch_cuda=None,
                     fallbacks=(fallback,) if primary and fallback else ())


def amd64_catalogue_refs(fl: Flavor, cuda: CudaVariant) -> tuple[str, ...]:
    """The flavor's own linux/amd64 image names for ``cuda`` that have a separate arm64 image
    (manylinux: pytorch's builder and sameli's fallback); empty for a multi-platform flavor."""
    raw = fl.raw
    if not raw.get("arm64_template"):
        return ()
    return tuple(t.format(cuda_mm=cuda.dotted) for t in (raw["template"], raw.get("fallback_template")) if t)


def arm64_base(base: BaseImage, cuda: CudaVariant) -> BaseImage:
    """``base`` for linux/arm64: the flavor's arm64 image where it is another image (pytorch's
    manylinuxaarch64-builder), else the same reference (a multi-platform image, or the user's own
    --base-image, which must have an arm64 variant). A manylinux CUDA version without an arm64 builder
    keeps the amd64 name (the platform check then refuses the cell)."""
    raw = base.flavor.raw
    if base.ref not in amd64_catalogue_refs(base.flavor, cuda) or cuda.dotted not in raw.get("arm64_cuda", ()):
        return base
    return dataclasses.replace(base, ref=raw["arm64_template"].format(cuda_mm=cuda.dotted), fallbacks=())


def _cuda(fl: Flavor, series: TorchSeries, torch_version: str, cuda: CudaVariant, python: str) -> BaseImage:
    raw = fl.raw
    if not cuda.ubuntu:
        raise NoBaseImage(f"no nvidia/cuda devel image is listed for {cuda.name}")
    distro = raw["distro_python"]
    native = [u for u in cuda.ubuntu if distro.get(u) == python]
    ubuntu = native[0] if native else cuda.ubuntu[-1]
    ref = raw["template"].format(cuda=cuda.toolkit, ubuntu=ubuntu)
    return BaseImage(ref=ref, flavor=fl, python=fl.python_path(python), toolkit="image",
                     nvcc=Version(cuda.toolkit), image_torch_cuda=None, deadsnakes=not native)


def _pypi(fl: Flavor, series: TorchSeries, torch_version: str, cuda: CudaVariant, python: str) -> BaseImage:
    if cuda.pypi_toolkit is None:
        raise NoBaseImage(f"PyPI has no nvcc for {cuda.name} (the CUDA 12 wheels carry ptxas only): use --flavor"
                          " cuda, runpod or manylinux, or CUDA 13 (--cuda 13.0)")
    ref = fl.raw["template"].format(py=python)
    return BaseImage(ref=ref, flavor=fl, python=fl.python_path(python), toolkit="pypi",
                     nvcc=Version(cuda.pypi_toolkit), image_torch_cuda=None)


def _native(fl: Flavor, series: TorchSeries, torch_version: str, cuda: CudaVariant, python: str) -> BaseImage:
    raise NoBaseImage("the native flavor builds on this host: use `imagegen build --native`")


def jetpack_for(fl: Flavor, cuda: CudaVariant) -> Mapping[str, Any] | None:
    """The jetson flavor's JetPack row whose CUDA is ``cuda`` (None: no JetPack has it)."""
    return next((row for row in fl.raw.get("jetpacks", ()) if major_minor(row["cuda"]) == (cuda.major, cuda.minor)), None)


def _jetson(fl: Flavor, series: TorchSeries, torch_version: str, cuda: CudaVariant, python: str) -> BaseImage:
    row = jetpack_for(fl, cuda)
    rows = fl.raw.get("jetpacks", ())
    if row is None:
        have = ", ".join(f"JetPack {r['jetpack']}: CUDA {r['cuda']}" for r in rows)
        raise NoBaseImage(f"no JetPack with a torch index has CUDA {cuda.dotted} ({have}; not {fl.raw.get('unsupported')}):"
                          f" use --cuda {' or '.join(r['cuda'] for r in rows)}")
    jp = f"JetPack {row['jetpack']} (L4T {row['l4t']}, Ubuntu {row['ubuntu']})"
    if python != str(row["python"]):
        raise NoBaseImage(f"{jp} has Python {row['python']}, and its torch index has wheels for that alone: use"
                          f" --python {row['python']}")
    torches = [str(t) for t in row["torch"]]
    if torch_version not in torches:
        raise NoBaseImage(f"the {jp} torch index ({row['torch_index']}) has torch {', '.join(torches)}, not"
                          f" {torch_version}: use --torch {' or '.join(t for t in torches if t.startswith(series.series + '.')) or torches[-1]}")
    return BaseImage(ref=str(row["image"]), flavor=fl, python=fl.python_path(python), toolkit="image",
                     nvcc=Version(str(row["cuda"])), image_torch_cuda=None, torch_index=str(row["torch_index"]),
                     runs_on=tuple(str(a) for a in row["archs"]), device=f"{row['gpus']} on JetPack {row['jetpack']}")


_BUILDERS = {"runpod": _runpod, "manylinux": _manylinux, "cuda": _cuda, "pypi": _pypi, "jetson": _jetson,
             "native": _native}

# What a known tag scheme tells about a custom image: nvcc version, and a preinstalled torch's CUDA.
_RUNPOD_NEW = re.compile(r"(?:docker\.io/)?runpod/pytorch:[\d.]+-cu(\d{2})(\d)(\d)?-torch(\d)(\d+)(\d)-ubuntu\d{4}")
_RUNPOD_OLD = re.compile(r"(?:docker\.io/)?runpod/pytorch:(\d+\.\d+\.\d+)-py3\.\d+-cuda(\d+\.\d+)(?:\.\d+)?-(?:cudnn-)?devel-ubuntu[\d.]+")
_NVIDIA = re.compile(r"(?:docker\.io/)?nvidia/cuda:(\d+\.\d+)(?:\.\d+)?-.*devel.*")
_MANYLINUX = re.compile(r"(?:docker\.io/)?pytorch/manylinux2?_?\d*_?\d*-builder:cuda(\d+\.\d+).*")
_SAMELI = re.compile(r"(?:docker\.io/)?sameli/manylinux[\w.]*_cuda_(\d+\.\d+).*")


def _custom_base(fl: Flavor, ref: str, python: str) -> BaseImage:
    safety.check(ref, safety.IMAGE_REF, "--base-image")
    nvcc: Version | None = None
    torch_cuda: str | None = None
    image_torch: str | None = None
    tag = ref.split("@", 1)[0]
    runpod = flavors()["runpod"].raw
    if m := _RUNPOD_NEW.fullmatch(tag):
        nvcc = Version(f"{m.group(1)}.{m.group(2)}")
        tv = f"{m.group(4)}.{int(m.group(5))}.{m.group(6)}"
        for img in runpod["images"]:
            if major_minor(img["cuda"]) == (nvcc.major, nvcc.minor) and tv in img["torch"]:
                torch_cuda = img["torch"][tv]
        image_torch = tv if python == str(runpod.get("torch_python")) else None
    elif m := _RUNPOD_OLD.fullmatch(tag):
        nvcc = Version(m.group(2))
        # The legacy scheme names the one Python the image carries, and torch is installed into it.
        image_py = re.search(r"-py(3\.\d+)-", tag)
        if image_py and image_py.group(1) != python:
            raise NoBaseImage(f"{ref} carries Python {image_py.group(1)}, not {python}: use --python {image_py.group(1)}")
        image_torch = m.group(1)
        torch_cuda = next((img["torch_cuda"] for img in runpod.get("legacy_images", ())
                           if img["torch"] == image_torch and (image_py is None or img["py"] == image_py.group(1))
                           and major_minor(img["cuda"]) == (nvcc.major, nvcc.minor)), None)
    elif m := (_NVIDIA.fullmatch(tag) or _MANYLINUX.fullmatch(tag) or _SAMELI.fullmatch(tag)):
        nvcc = Version(m.group(1))
    if fl.toolkit == "pypi":
        nvcc = None
    return BaseImage(ref=ref, flavor=fl, python=fl.python_path(python), toolkit=fl.toolkit,
                     nvcc=nvcc, image_torch_cuda=torch_cuda, image_torch=image_torch, custom=True)


def parse_version(text: str, what: str) -> Version:
    try:
        return Version(text)
    except InvalidVersion:
        raise UsageError(f"{what} {text!r} is not a version") from None
