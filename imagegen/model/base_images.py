"""The builder base images per flavor (resources/compat/base_images.yaml): which image a cell's
builder starts FROM (runpod, manylinux, cuda, pypi, jetson, or the user's own --base-image), what
imagegen knows of its contents (nvcc, a preinstalled torch, its Python), its fallbacks and its arm64
counterpart. The torch <-> CUDA <-> Python tables are :mod:`imagegen.model.compat`.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass
from typing import Any, Mapping

from packaging.version import Version

from imagegen import safety
from imagegen.errors import NoBaseImage, UsageError
from imagegen.model.compat import CudaVariant, TorchSeries, load_table, major_minor


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
    # The images tried, in order, when ``ref`` cannot be pulled (same CUDA; a team's flash-attn matrix's ALT_LINUX_IMAGE_CU*):
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
def settings() -> dict[str, Any]:
    """base_images.yaml's top-level settings besides the flavors (arm64_index_min_torch, ...)."""
    return {k: v for k, v in load_table("base_images.yaml").items() if k != "flavors"}


@functools.cache  # one Flavor instance per name: Flavor's equality is identity
def flavors() -> dict[str, Flavor]:
    raw = load_table("base_images.yaml")["flavors"]
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
    safety.validate(ref, safety.IMAGE_REF, "--base-image")
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
