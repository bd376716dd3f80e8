"""manylinux platform tags and the glibc versions behind them: what --plat accepts, the glibc a tag
promises (PEP 600 says it in the tag, the legacy names by table), the CPU a tag names, and the glibc
of a builder base image read from its name, which `imagegen repair` compares with the tag auditwheel
gave (imagegen.publish.repair)."""

from __future__ import annotations

import re

from imagegen.errors import UsageError
from imagegen.outputs import shown

# glibc of the builder base images, read from the image's name (a pinned ref keeps its name before @sha256).
# The manylinux images say it in the name (pytorch/manylinux2_28-builder, sameli/manylinux_2_34_...).
_MANYLINUX_IMAGE = re.compile(r"manylinux_?2_(\d+)")
BASE_IMAGE_GLIBC = (
    (re.compile(r"manylinux2014"), "2.17"),       # CentOS 7
    (re.compile(r"ubuntu-?20\.?04"), "2.31"),
    (re.compile(r"ubuntu-?22\.?04"), "2.35"),     # runpod/pytorch ...-ubuntu2204, nvidia/cuda ...-ubuntu22.04
    (re.compile(r"ubuntu-?24\.?04"), "2.39"),
    (re.compile(r"bullseye"), "2.31"),            # python:*-bullseye (Debian 11)
    (re.compile(r"bookworm"), "2.36"),            # python:*-bookworm (Debian 12), the pypi flavor's default
    (re.compile(r"trixie"), "2.41"),              # Debian 13
)

# What --plat accepts: a glibc policy (PEP 600, or its legacy alias) for the wheel's architecture.
MACHINES = ("x86_64", "aarch64", "ppc64le", "s390x", "i686", "armv7l", "riscv64")
_PLAT = re.compile(rf"(manylinux_\d+_\d+|manylinux1|manylinux2010|manylinux2014)_({'|'.join(MACHINES)})")
_LEGACY_GLIBC = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}


def glibc_key(text: str) -> tuple[int, ...]:
    """A glibc version ("2.34", "2.3.4") as numbers, to compare and sort: 2.9 < 2.17."""
    return tuple(int(part) for part in text.split("."))


def tag_glibc(platform: str) -> str:
    """The glibc a manylinux platform tag promises: ``manylinux_2_34_x86_64`` -> ``2.34``,
    ``manylinux2014_x86_64`` -> ``2.17``."""
    m = re.fullmatch(r"manylinux_(\d+)_(\d+)_.+", platform)
    major, minor = (int(m.group(1)), int(m.group(2))) if m else _LEGACY_GLIBC[platform.split("_", 1)[0]]
    return f"{major}.{minor}"


def base_image_glibc(base_image: str | None) -> str | None:
    """The glibc of a builder base image, read from its name (BASE_IMAGE_GLIBC); None when imagegen
    cannot tell (a native build, an image of another family)."""
    if not base_image:
        return None
    name = base_image.split("@", 1)[0]
    m = _MANYLINUX_IMAGE.search(name)
    if m:
        return f"2.{m.group(1)}"
    return next((glibc for pattern, glibc in BASE_IMAGE_GLIBC if pattern.search(name)), None)


def machine(platform: str) -> str:
    """The CPU a platform tag names: ``linux_x86_64`` -> ``x86_64`` (an unknown one: the whole tag)."""
    return next((m for m in MACHINES if platform.endswith(f"_{m}")), platform)


def validate_plat(plat: str | None) -> None:
    """Refuse (UsageError) a --plat that is no manylinux tag, before anything runs."""
    if plat is not None and not _PLAT.fullmatch(plat):
        raise UsageError(f"--plat {shown(plat, 80)}: expected a manylinux tag such as manylinux_2_28_x86_64")
