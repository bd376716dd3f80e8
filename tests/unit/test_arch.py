"""Tests for imagegen.model.arch: the CudaArch / ArchList model and the notation, version and key helpers."""

from __future__ import annotations

import pytest
from packaging.version import Version

from imagegen.errors import ArchError
from imagegen.model.arch import (
    ArchList,
    CudaArch,
    arch_from_notation,
    fmt_minor,
    minor_of,
    normalise_gpu,
    quote,
    torch_key,
)
from imagegen.model.arch_parse import parse_arch_list

# --------------------------------------------------------------------------------------------
# CudaArch / ArchList
# --------------------------------------------------------------------------------------------


def test_cuda_arch_properties() -> None:
    arch = CudaArch(12, 0, "a")
    assert arch.cc == "12.0"
    assert arch.number == 120
    assert arch.code == "120a"
    assert arch.sm == "sm_120a"
    assert arch.compute == "compute_120a"


@pytest.mark.parametrize(
    ("arch", "text"),
    [
        (CudaArch(12, 0), "12.0"),
        (CudaArch(12, 0, ptx=True), "12.0+PTX"),
        (CudaArch(9, 0, "a"), "9.0a"),
        (CudaArch(10, 0, "f"), "10.0f"),
        (CudaArch(12, 0, sass=False, ptx=True), "compute_120"),
        (CudaArch(9, 0, "a", sass=False, ptx=True), "compute_90a"),
    ],
)
def test_cuda_arch_str(arch: CudaArch, text: str) -> None:
    assert str(arch) == text


def test_cuda_arch_ordering_ignores_flags() -> None:
    assert CudaArch(8, 0) < CudaArch(8, 6) < CudaArch(9, 0) < CudaArch(9, 0, "a") < CudaArch(10, 0)
    assert CudaArch(10, 0, "a") < CudaArch(10, 0, "f") < CudaArch(12, 0)
    assert not CudaArch(8, 0, ptx=True) < CudaArch(8, 0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"major": 8, "minor": 10},
        {"major": 0, "minor": 0},
        {"major": 8, "minor": 0, "variant": "b"},
        {"major": 8, "minor": 0, "sass": False, "ptx": False},
        {"major": True, "minor": 0},
    ],
)
def test_cuda_arch_rejects_nonsense(kwargs: dict[str, object]) -> None:
    with pytest.raises(ArchError):
        CudaArch(**kwargs)  # type: ignore[arg-type]


def test_arch_list_is_sorted_merged_hashable() -> None:
    archs = ArchList([CudaArch(12, 0), CudaArch(8, 0), CudaArch(12, 0, sass=False, ptx=True)])
    assert str(archs) == "8.0;12.0+PTX"
    assert len(archs) == 2
    assert archs
    assert not ArchList()
    assert list(archs) == [CudaArch(8, 0), CudaArch(12, 0, ptx=True)]
    assert archs.has_ptx
    assert archs.newest == CudaArch(12, 0, ptx=True)
    assert hash(archs) == hash(parse_arch_list("8.0;12.0+PTX"))
    assert {archs, parse_arch_list("80 120+ptx")} == {archs}
    with pytest.raises(AttributeError):
        archs._entries = ()  # type: ignore[misc]
    with pytest.raises(ArchError):
        ArchList().newest


def test_cuda_arch_range_edges() -> None:
    assert CudaArch(99, 9).code == "999"
    assert CudaArch(1, 0).cc == "1.0"
    for major, minor in ((100, 0), (8, -1)):
        with pytest.raises(ArchError, match="out of range"):
            CudaArch(major, minor)


@pytest.mark.parametrize(
    "kwargs", [{"major": "8", "minor": 0}, {"major": 8, "minor": 0.0}, {"major": 8, "minor": False}]
)
def test_cuda_arch_requires_int_fields(kwargs: dict[str, object]) -> None:
    with pytest.raises(ArchError, match="must be an int") as info:
        CudaArch(**kwargs)  # type: ignore[arg-type]
    assert info.value.exit_code == 2


def test_cuda_arch_is_frozen_and_compares_only_with_cuda_arch() -> None:
    arch = CudaArch(9, 0)
    with pytest.raises(AttributeError):
        arch.major = 10  # type: ignore[misc]
    with pytest.raises(TypeError):
        arch < "9.0"  # type: ignore[operator]  # noqa: B015
    assert CudaArch(9, 0, ptx=True) != arch  # flags are part of equality, not of the key
    assert CudaArch(9, 0, ptx=True).key == arch.key == (9, 0, "")


def test_arch_list_entries_indexing_and_membership() -> None:
    archs = ArchList([CudaArch(9, 0, "a"), CudaArch(8, 0), CudaArch(8, 0, sass=False, ptx=True)])
    assert archs.entries == (CudaArch(8, 0, ptx=True), CudaArch(9, 0, "a"))
    assert archs[0] == CudaArch(8, 0, ptx=True)
    assert archs[-1] is archs.newest
    assert CudaArch(9, 0, "a") in archs
    assert CudaArch(8, 0) not in archs  # membership is by whole entry, flags included
    assert repr(archs) == "ArchList('8.0+PTX;9.0a')"
    assert repr(ArchList()) == "ArchList('')"


def test_arch_list_gencode_targets_counts_sass_and_ptx() -> None:
    archs = ArchList([CudaArch(8, 0, ptx=True), CudaArch(9, 0, "a"), CudaArch(12, 0, sass=False, ptx=True)])
    assert archs.gencode_targets == 4
    assert not ArchList([CudaArch(8, 0)]).has_ptx
    assert ArchList().gencode_targets == 0


def test_arch_list_merges_flags_of_equal_keys_from_any_side() -> None:
    ptx_only = CudaArch(12, 0, sass=False, ptx=True)
    assert ArchList([ptx_only, CudaArch(12, 0)]) == ArchList([CudaArch(12, 0), ptx_only])
    assert str(ArchList([ptx_only, ptx_only])) == "compute_120"
    # variants never merge with the plain target
    assert len(ArchList([CudaArch(10, 0), CudaArch(10, 0, "a"), CudaArch(10, 0, "f")])) == 3


def test_arch_list_refuses_other_entries_and_other_comparisons() -> None:
    with pytest.raises(ArchError, match="ArchList takes CudaArch entries, not str"):
        ArchList(["8.0"])  # type: ignore[list-item]
    archs = ArchList([CudaArch(8, 0)])
    assert archs != "8.0"
    assert archs != [CudaArch(8, 0)]
    with pytest.raises(ArchError, match="empty"):
        ArchList().newest


# --------------------------------------------------------------------------------------------
# Helpers: quoting, GPU names, plain notations, versions, torch keys
# --------------------------------------------------------------------------------------------


def test_quote_escapes_and_bounds() -> None:
    assert quote("sm_12x") == "'sm_12x'"
    assert quote("9.0\x1b[31m") == "'9.0\\x1b[31m'"
    assert quote("9.0\x00") == "'9.0\\x00'"
    # the cut comes first (40 characters of the token), then the escaping
    assert quote("\x00" * 50) == "'" + "\\x00" * 40 + "...'"
    assert quote("\x1b") == "'\\x1b'"
    long = "x" * 100
    assert quote(long) == ascii("x" * 40 + "...")
    assert quote("x" * 40) == ascii("x" * 40)


def test_normalise_gpu() -> None:
    for name in ("RTX 5090", "rtx-5090", "Rtx_5090", "RTX \t-_ 5090", "rtx5090"):
        assert normalise_gpu(name) == "rtx5090"
    assert normalise_gpu("RTX PRO 6000") == "rtxpro6000"


@pytest.mark.parametrize(
    ("token", "expected"),
    [
        ("8.0", CudaArch(8, 0)),
        ("8.6+ptx", CudaArch(8, 6, ptx=True)),
        ("sm_90a", CudaArch(9, 0, "a")),
        ("sm90a+ptx", CudaArch(9, 0, "a", ptx=True)),
        ("compute_120", CudaArch(12, 0, sass=False, ptx=True)),
        ("compute_120+ptx", CudaArch(12, 0, sass=False, ptx=True)),
        ("100f", CudaArch(10, 0, "f")),
        ("90a-real", CudaArch(9, 0, "a")),
        ("90a-real+ptx", CudaArch(9, 0, "a", ptx=True)),
        ("120-virtual", CudaArch(12, 0, sass=False, ptx=True)),
        # syntax only: capabilities that do not exist still come back (arch_data judges them)
        ("4.2", CudaArch(4, 2)),
        ("137", CudaArch(13, 7)),
        ("8.0f", CudaArch(8, 0, "f")),
    ],
)
def test_arch_from_notation(token: str, expected: CudaArch) -> None:
    assert arch_from_notation(token) == expected


@pytest.mark.parametrize("token", ["", "garbage", "h100", "hopper", "0.0", "05", "sm_0", "8", "8.10", "sm_12x",
                                   "+ptx", "8.0+ptx+ptx", "8.0b", "1234", "80-fake", "SM_80"])
def test_arch_from_notation_refuses_non_notations(token: str) -> None:
    # It takes lower-cased tokens; names, upper case and nonsense are not its business.
    assert arch_from_notation(token) is None


def test_minor_of_and_fmt_minor() -> None:
    assert minor_of(Version("12.9.1")) == (12, 9)
    assert minor_of(Version("13")) == (13, 0)
    assert minor_of(Version("2.8.0+cu128")) == (2, 8)
    assert minor_of(Version("2.10.0rc1")) == (2, 10)
    assert fmt_minor((2, 10)) == "2.10"
    assert fmt_minor(minor_of(Version("12.8.1"))) == "12.8"


def test_torch_key_drops_flags_keeps_variant() -> None:
    assert torch_key(CudaArch(9, 0, "a", ptx=True)) == "9.0a"
    assert torch_key(CudaArch(12, 0, sass=False, ptx=True)) == "12.0"
    assert torch_key(CudaArch(10, 0, "f")) == "10.0f"
