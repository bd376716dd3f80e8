"""Tests for imagegen.model.base_images: the flavors of base_images.yaml, the base image each resolves for a
cell (runpod, manylinux, cuda, pypi, jetson, a custom --base-image), fallbacks."""

from __future__ import annotations

import pytest
from packaging.version import Version

from imagegen.errors import NoBaseImage, UnsafeValueError, UsageError
from imagegen.model import base_images, compat
from imagegen.model.base_images import BaseImage


def base(flavor: str, torch: str, cuda: str, python: str, override: str | None = None) -> BaseImage:
    """The base image for one cell, resolved from flag text as the plan resolves it."""
    series, torch_version = compat.torch_series(torch)
    return base_images.resolve_base_image(base_images.flavor(flavor), series, torch_version,
                                          compat.cuda_variant(cuda), compat.validate_python(python), override)


# --------------------------------------------------------------------------------------------
# Flavors
# --------------------------------------------------------------------------------------------


def test_flavors_and_container_flavors() -> None:
    assert set(base_images.flavors()) == {"runpod", "manylinux", "cuda", "pypi", "jetson", "native"}
    assert base_images.container_flavors() == ("runpod", "manylinux", "cuda", "pypi", "jetson")  # native is the host
    assert base_images.flavor("pypi").toolkit == "pypi"
    assert base_images.flavor("manylinux").os == "dnf"
    assert base_images.flavor("runpod").stubs_in_library_path
    assert not base_images.flavor("manylinux").stubs_in_library_path


def test_the_runpod_images_torch_builds_are_cuda_variants_of_the_table() -> None:
    for img in base_images.flavors()["runpod"].raw["images"]:
        assert set(img["torch"].values()) <= set(compat.cuda_table())


def test_flavor_python_paths() -> None:
    assert base_images.flavor("manylinux").python_path("3.12") == "/opt/python/cp312-cp312/bin/python"
    assert base_images.flavor("cuda").python_path("3.10") == "/usr/bin/python3.10"
    assert base_images.flavor("pypi").python_path("3.13") == "python3.13"


def test_unknown_flavor() -> None:
    with pytest.raises(UsageError) as info:
        base_images.flavor("docker")
    assert str(info.value) == "--flavor 'docker' is not one of runpod, manylinux, cuda, pypi, jetson, native"


def test_one_flavor_instance_per_name() -> None:
    assert base_images.flavor("cuda") is base_images.flavor("cuda")
    assert base("cuda", "2.8", "12.8", "3.12") == base("cuda", "2.8", "12.8", "3.12")


# --------------------------------------------------------------------------------------------
# Base images per flavor
# --------------------------------------------------------------------------------------------


def test_runpod_image_for_a_torch_it_ships() -> None:
    image = base("runpod", "2.8", "12.8", "3.12")
    assert image.ref == "runpod/pytorch:1.0.2-cu1281-torch280-ubuntu2404"
    assert image.python == "/usr/bin/python3.12"
    assert (image.toolkit, image.nvcc, image.image_torch_cuda) == ("image", Version("12.8.1"), "cu128")
    assert not image.custom and not image.deadsnakes and image.fallback is None
    # the CUDA 13.0.0 image's torch 2.8 is a cu12 build (the trap the table records)
    assert base("runpod", "2.8", "13.0", "3.12").image_torch_cuda == "cu129"


def test_runpod_image_for_a_torch_it_does_not_ship_takes_its_newest() -> None:
    image = base("runpod", "2.7.0", "12.9", "3.11")
    assert image.ref == "runpod/pytorch:1.0.2-cu1290-torch291-ubuntu2404"
    assert image.image_torch_cuda == "cu129"


def test_runpod_without_that_cuda() -> None:
    with pytest.raises(NoBaseImage) as info:
        base("runpod", "2.8", "12.6", "3.12")
    assert str(info.value) == (
        "runpod/pytorch has no CUDA 12.6 image (it has 12.8.1, 12.9.0, 13.0.0); use --flavor cuda,"
        " manylinux, or a CUDA the runpod images carry"
    )
    with pytest.raises(NoBaseImage, match="use --flavor cuda, manylinux or pypi, or a CUDA"):
        base("runpod", "2.15", "13.2", "3.12")  # PyPI carries CUDA 13.2's nvcc


def test_manylinux_primary_and_fallback() -> None:
    image = base("manylinux", "2.8", "12.8", "3.12")
    assert image.ref == "pytorch/manylinux2_28-builder:cuda12.8"
    assert image.fallback == "sameli/manylinux_2_34_x86_64_cuda_12.8"
    assert image.nvcc == Version("12.8") and image.python == "/opt/python/cp312-cp312/bin/python"
    assert base("manylinux", "2.8", "12.6", "3.12").fallback is None  # sameli has no 12.6
    assert base("manylinux", "2.12", "13.2", "3.14").ref == "pytorch/manylinux2_28-builder:cuda13.2"
    with pytest.raises(NoBaseImage, match="no manylinux builder image for CUDA 11.8"):
        base("manylinux", "2.6", "11.8", "3.12")


@pytest.mark.parametrize(
    ("torch", "cuda", "python", "ubuntu", "deadsnakes"),
    [("2.8", "12.8", "3.12", "24.04", False), ("2.8", "12.8", "3.10", "22.04", False),
     ("2.8", "12.8", "3.11", "24.04", True), ("2.6", "11.8", "3.12", "22.04", True),
     ("2.12", "13.2", "3.10", "24.04", True)],
)
def test_cuda_flavor_prefers_an_ubuntu_whose_python_matches(torch: str, cuda: str, python: str, ubuntu: str,
                                                            deadsnakes: bool) -> None:
    image = base("cuda", torch, cuda, python)
    toolkit = compat.cuda_variant(cuda).toolkit
    assert image.ref == f"nvidia/cuda:{toolkit}-cudnn-devel-ubuntu{ubuntu}"
    assert image.deadsnakes is deadsnakes
    assert image.nvcc == Version(toolkit)


def test_pypi_flavor_needs_a_cuda_13_toolkit_wheel() -> None:
    image = base("pypi", "2.9", "13.0", "3.13")
    assert (image.ref, image.python, image.toolkit) == ("python:3.13-slim-bookworm", "python3.13", "pypi")
    assert image.nvcc == Version("13.0.3")
    with pytest.raises(NoBaseImage, match="PyPI has no nvcc for cu128"):
        base("pypi", "2.8", "12.8", "3.12")


def test_native_and_missing_python_have_no_base_image() -> None:
    with pytest.raises(NoBaseImage, match="imagegen build --native"):
        base("native", "2.8", "12.8", "3.12")
    with pytest.raises(NoBaseImage) as info:
        base("runpod", "2.8", "12.8", "3.14")
    assert str(info.value) == "the runpod flavor has no Python 3.14 (it has 3.9, 3.10, 3.11, 3.12, 3.13)"


# --------------------------------------------------------------------------------------------
# --base-image: what a known tag scheme tells
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flavor", "ref", "nvcc", "torch_cuda"),
    [
        ("cuda", "nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04", "12.8", None),
        ("runpod", "runpod/pytorch:1.0.2-cu1290-torch280-ubuntu2404", "12.9", "cu129"),
        ("runpod", "docker.io/runpod/pytorch:1.0.2-cu1281-torch291-ubuntu2204", "12.8", "cu128"),
        ("runpod", "runpod/pytorch:1.0.2-cu1281-torch250-ubuntu2204", "12.8", None),  # torch runpod never shipped
        ("manylinux", "pytorch/manylinux2_28-builder:cuda12.9", "12.9", None),
        ("manylinux", "sameli/manylinux_2_34_x86_64_cuda_13.0@sha256:" + "a" * 64, "13.0", None),
        ("cuda", "registry:5000/mine:latest", None, None),
    ],
)
def test_custom_base_image(flavor: str, ref: str, nvcc: str | None, torch_cuda: str | None) -> None:
    image = base(flavor, "2.8", "12.8", "3.12", ref)
    assert image.custom and image.ref == ref
    assert image.nvcc == (Version(nvcc) if nvcc else None)
    assert image.image_torch_cuda == torch_cuda
    assert image.toolkit == "image" and image.python == base_images.flavor(flavor).python_path("3.12")


def test_custom_legacy_runpod_image_names_its_python() -> None:
    ref = "runpod/pytorch:2.8.0-py3.11-cuda12.8.1-cudnn-devel-ubuntu22.04"
    assert base("runpod", "2.8", "12.8", "3.11", ref).nvcc == Version("12.8")
    with pytest.raises(NoBaseImage) as info:
        base("runpod", "2.8", "12.8", "3.12", ref)
    assert str(info.value) == f"{ref} carries Python 3.11, not 3.12: use --python 3.11"


def test_custom_base_image_with_pypi_toolkit_has_no_image_nvcc() -> None:
    image = base("pypi", "2.8", "12.8", "3.12", "nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04")
    assert image.nvcc is None and image.toolkit == "pypi" and image.custom


@pytest.mark.parametrize("ref", ["bad ref; rm -rf /", "UPPER/case:tag", "nvidia/cuda:12.8\n", "a@sha256:short"])
def test_unsafe_custom_base_image(ref: str) -> None:
    with pytest.raises(UnsafeValueError, match="--base-image") as info:
        base("cuda", "2.8", "12.8", "3.12", ref)
    assert "\n" not in str(info.value)


def test_python_is_checked_before_the_override() -> None:
    with pytest.raises(NoBaseImage, match="no Python 3.8"):
        base_images.resolve_base_image(base_images.flavor("cuda"), compat.torch_table()["2.8"], "2.8.0",
                                       compat.cuda_variant("12.8"), "3.8", "registry:5000/mine:latest")


# --------------------------------------------------------------------------------------------
# The torch an image ships (reused instead of downloaded) and fallback base images
# --------------------------------------------------------------------------------------------


def test_runpod_images_ship_torch_in_their_python_312_only() -> None:
    image = base("runpod", "2.9", "12.8", "3.12")
    assert (image.image_torch, image.image_torch_cuda) == ("2.9.1", "cu128")
    assert base("runpod", "2.9", "12.8", "3.11").image_torch is None  # deadsnakes 3.11 has no torch
    # torch 2.11 is not shipped: the image's newest (2.9.1) is named, and a cell for 2.11 cannot reuse it
    assert base("runpod", "2.11", "13.0", "3.12").image_torch == "2.9.1"


def test_a_custom_runpod_tag_tells_its_torch() -> None:
    image = base("runpod", "2.9", "12.8", "3.12", override="runpod/pytorch:1.0.2-cu1281-torch291-ubuntu2404")
    assert (image.image_torch, image.image_torch_cuda, image.custom) == ("2.9.1", "cu128", True)
    assert base("runpod", "2.9", "12.8", "3.11", override="runpod/pytorch:1.0.2-cu1281-torch291-ubuntu2404").image_torch is None
    legacy = base("runpod", "2.8", "12.8", "3.11", override="runpod/pytorch:2.8.0-py3.11-cuda12.8.1-cudnn-devel-ubuntu22.04")
    assert (legacy.image_torch, legacy.image_torch_cuda) == ("2.8.0", "cu128")
    assert base("cuda", "2.8", "12.8", "3.12", override="my/image:1").image_torch is None


def test_base_image_with_fallbacks() -> None:
    image = base("pypi", "2.11", "13.0", "3.11", override="127.0.0.1:9/x/base:1, a/b:2 ,a/b:2,c/d@sha256:" + "0" * 64)
    assert image.ref == "127.0.0.1:9/x/base:1"
    assert image.fallbacks == ("a/b:2", "c/d@sha256:" + "0" * 64) and image.fallback == "a/b:2"
    assert base("pypi", "2.11", "13.0", "3.11", override="a/b:1").fallbacks == ()


def test_a_fallback_of_another_cuda_or_an_unsafe_one_is_refused() -> None:
    with pytest.raises(NoBaseImage, match="fallback nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04 has CUDA 12.8, but"
                       " nvidia/cuda:13.0.0-cudnn-devel-ubuntu24.04 has 13.0: a fallback must carry the same CUDA"):
        base("cuda", "2.11", "13.0", "3.12",
             override="nvidia/cuda:13.0.0-cudnn-devel-ubuntu24.04,nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04")
    with pytest.raises(UnsafeValueError):
        base("cuda", "2.11", "13.0", "3.12", override="a/b:1,$(id)")


def test_on_fallback_reads_a_custom_fallback_again() -> None:
    primary = base("runpod", "2.9", "12.8", "3.12",
                   override="my/base:1,runpod/pytorch:1.0.2-cu1281-torch291-ubuntu2404")
    assert primary.image_torch is None
    after = base_images.on_fallback(primary, "runpod/pytorch:1.0.2-cu1281-torch291-ubuntu2404", "3.12")
    assert (after.ref, after.fallbacks, after.image_torch) == ("runpod/pytorch:1.0.2-cu1281-torch291-ubuntu2404", (), "2.9.1")
    many = base("manylinux", "2.8", "12.8", "3.12")
    after = base_images.on_fallback(many, "sameli/manylinux_2_34_x86_64_cuda_12.8", "3.12")
    assert after.ref == "sameli/manylinux_2_34_x86_64_cuda_12.8" and after.fallbacks == () and not after.custom
    assert after.python == many.python and after.nvcc == many.nvcc
