"""Tests for imagegen.publish.manylinux: the glibc a manylinux tag promises, what --plat accepts, the CPU a
tag names, and the glibc of each builder base image read from its name."""

from __future__ import annotations

import pytest

from imagegen.errors import UsageError
from imagegen.publish import manylinux
from tests.unit.executor_fixtures import tiny_cell


@pytest.mark.parametrize("tag, glibc", [
    ("manylinux_2_34_x86_64", "2.34"),
    ("manylinux_2_5_i686", "2.5"),
    ("manylinux2014_aarch64", "2.17"),
    ("manylinux2010_x86_64", "2.12"),
    ("manylinux1_x86_64", "2.5"),
])
def test_the_glibc_a_tag_promises(tag, glibc):
    assert manylinux.tag_glibc(tag) == glibc


def test_glibc_versions_compare_as_numbers():
    assert manylinux.glibc_key("2.9") < manylinux.glibc_key("2.17") < manylinux.glibc_key("2.17.1")
    assert max(["2.9", "2.34", "2.17"], key=manylinux.glibc_key) == "2.34"


@pytest.mark.parametrize("plat", ["manylinux_2_28_x86_64", "manylinux2014_aarch64", "manylinux_2_39_riscv64"])
def test_plat_takes_a_manylinux_tag_of_a_known_machine(plat):
    manylinux.validate_plat(plat)
    manylinux.validate_plat(None)  # left out: the lowest tag the symbols allow


@pytest.mark.parametrize("plat", ["linux_x86_64", "manylinux_2_28_sparc", "musllinux_1_2_x86_64", "manylinux_2_28"])
def test_plat_refuses_what_is_no_manylinux_tag(plat):
    with pytest.raises(UsageError, match=r"expected a manylinux tag such as manylinux_2_28_x86_64$") as info:
        manylinux.validate_plat(plat)
    assert info.value.exit_code == 2


def test_the_machine_a_tag_names():
    assert manylinux.machine("linux_x86_64") == "x86_64"
    assert manylinux.machine("manylinux_2_28_aarch64") == "aarch64"
    assert manylinux.machine("win_amd64") == "win_amd64"  # unknown: the whole tag, which matches no other


@pytest.mark.parametrize("image, glibc", [
    ("pytorch/manylinux2_28-builder:cuda12.8", "2.28"),
    ("sameli/manylinux_2_34_x86_64_cuda_12.8", "2.34"),
    ("quay.io/pypa/manylinux2014_x86_64", "2.17"),
    ("runpod/pytorch:1.0.2-cu1281-torch280-ubuntu2204", "2.35"),
    ("runpod/pytorch:1.0.2-cu1300-torch291-ubuntu2404", "2.39"),
    ("runpod/pytorch:2.8.0-py3.11-cuda12.8.1-cudnn-devel-ubuntu22.04", "2.35"),
    ("nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04", "2.39"),
    ("python:3.12-slim-bookworm", "2.36"),
    ("python:3.12-slim-bookworm@sha256:" + "a" * 64, "2.36"),
    ("registry.example/team/custom:7", None),
    (None, None),
])
def test_the_base_images_glibc_is_read_from_its_name(image, glibc):
    assert manylinux.base_image_glibc(image) == glibc


def test_every_catalogue_base_image_of_a_container_flavor_has_a_known_glibc():
    for flavor in ("runpod", "manylinux", "cuda", "pypi"):
        cell = tiny_cell(flavor=flavor)
        assert manylinux.base_image_glibc(cell.base.ref) is not None, (flavor, cell.base.ref)
