"""Tests for imagegen.model.arch_rules: CUDA version forms, which nvcc compiles which arch, what torch accepts."""

from __future__ import annotations

import pytest
from packaging.version import Version

from imagegen.errors import ArchError, UsageError
from imagegen.model.arch import ArchList, CudaArch
from imagegen.model.arch_format import to_torch_arch_list
from imagegen.model.arch_parse import parse_arch_list
from imagegen.model.arch_rules import (
    min_cuda_for,
    nvcc_problems,
    parse_cuda_version,
    torch_problems,
    torch_syntax_problem,
)

# --------------------------------------------------------------------------------------------
# nvcc
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("archs", "ok_from", "too_old"),
    [
        ("10.0", "12.8", "12.6"),
        ("12.0", "12.8", "12.6"),
        ("10.1", "12.8", "12.6"),
        ("12.0a", "12.8", "12.6"),
        ("10.3", "12.9", "12.8"),
        ("12.1", "12.9", "12.8"),
        ("10.0f", "12.9", "12.8"),
        ("12.0f", "12.9", "12.8"),
        ("11.0", "13.0", "12.9"),
        ("9.0a", "12.0", "11.8"),
        ("9.0", "11.8", "11.7"),
        ("8.9", "11.8", "11.7"),
    ],
)
def test_nvcc_minimums(archs: str, ok_from: str, too_old: str) -> None:
    arch_list = parse_arch_list(archs)
    assert nvcc_problems(arch_list, ok_from) == []
    problems = nvcc_problems(arch_list, too_old)
    assert len(problems) == 1
    assert f"needs CUDA >= {ok_from}; CUDA {too_old} selected" in problems[0]
    assert min_cuda_for(arch_list) == Version(ok_from)


def test_nvcc_messages() -> None:
    assert nvcc_problems(parse_arch_list("12.0"), "12.6") == [
        "sm_120 needs CUDA >= 12.8; CUDA 12.6 selected"
    ]
    assert nvcc_problems(parse_arch_list("7.0"), "13.0") == [
        "sm_70 was dropped in CUDA 13.0; CUDA 13.0 selected (use CUDA <= 12.9 or drop 7.0)"
    ]
    assert nvcc_problems(parse_arch_list("12.0f"), "12.8") == [
        "sm_120f (family target) needs CUDA >= 12.9; CUDA 12.8 selected"
    ]
    assert nvcc_problems(parse_arch_list("compute_120"), "12.6") == [
        "compute_120 needs CUDA >= 12.8; CUDA 12.6 selected"
    ]


@pytest.mark.parametrize("cc", ["5.0", "5.2", "6.0", "6.1", "7.0", "7.2"])
def test_cuda_13_drops_below_sm75(cc: str) -> None:
    archs = parse_arch_list(cc)
    assert nvcc_problems(archs, "12.9") == []
    assert nvcc_problems(archs, "12.9.1") == []  # a patch release is still 12.9
    (problem,) = nvcc_problems(archs, "13.0")
    assert "dropped in CUDA 13.0" in problem
    assert nvcc_problems(parse_arch_list("7.5;8.0;9.0;12.0"), "13.0") == []


def test_kepler_dropped_in_12_and_sm101_renamed_in_13() -> None:
    assert nvcc_problems(parse_arch_list("3.5"), "11.8") == []
    assert "dropped in CUDA 12.0" in nvcc_problems(parse_arch_list("3.7"), "12.0")[0]
    (problem,) = nvcc_problems(parse_arch_list("10.1"), "13.0")
    assert "sm_101 was dropped in CUDA 13.0" in problem and "11.0" in problem


def test_nvcc_reports_one_reason_per_entry() -> None:
    problems = nvcc_problems(parse_arch_list("7.0 8.0 11.0 12.0f"), "cu128")
    assert len(problems) == 2
    assert problems[0].startswith("sm_110 ")
    assert problems[1].startswith("sm_120f ")


def test_min_cuda_for() -> None:
    assert min_cuda_for(parse_arch_list("8.0;8.6;9.0")) == Version("11.8")
    assert min_cuda_for(parse_arch_list("8.0;9.0a;12.0+PTX")) == Version("12.8")
    assert min_cuda_for(parse_arch_list("Blackwell")) == Version("12.9")
    assert min_cuda_for("8.0 11.0") == Version("13.0")
    with pytest.raises(ArchError, match="no single CUDA toolkit"):
        min_cuda_for(parse_arch_list("7.0;11.0"))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("12.8", "12.8"),
        ("12.8.1", "12.8.1"),
        ("cu128", "12.8"),
        ("cu130", "13.0"),
        ("128", "12.8"),
        ("cu118", "11.8"),
        ("CUDA 12.9", "12.9"),
        (" 13.0 ", "13.0"),
    ],
)
def test_parse_cuda_version(text: str, expected: str) -> None:
    assert parse_cuda_version(text) == Version(expected)
    assert parse_cuda_version(Version(expected)) == Version(expected)


@pytest.mark.parametrize("bad", ["", "twelve", "12", "cu12x", "12.8.1.2", "1288", None])
def test_parse_cuda_version_errors(bad: object) -> None:
    with pytest.raises(UsageError):
        parse_cuda_version(bad)  # type: ignore[arg-type]


def test_nvcc_problems_bad_cuda_is_usage_error() -> None:
    with pytest.raises(UsageError):
        nvcc_problems(parse_arch_list("8.0"), "latest")


# --------------------------------------------------------------------------------------------
# torch
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("archs", "accepted_by", "rejected_by"),
    [
        ("10.1", ["2.7", "2.8.0"], ["2.6", "2.9", "2.10"]),
        ("10.1a", ["2.7", "2.8"], ["2.6", "2.9"]),
        ("11.0", ["2.9", "2.10.0", "2.12"], ["2.6", "2.7", "2.8"]),
        ("12.0", ["2.7", "2.8", "2.15"], ["2.6"]),
        ("12.0a+PTX", ["2.7"], ["2.6"]),
        ("10.0", ["2.6", "2.9"], ["2.5"]),
        ("10.0a", ["2.7"], ["2.6"]),
        ("10.3;12.1a", ["2.8", "2.9"], ["2.7"]),
        ("9.0a;8.6+PTX", ["2.4", "2.6", "2.12"], []),
    ],
)
def test_torch_acceptance(archs: str, accepted_by: list[str], rejected_by: list[str]) -> None:
    arch_list = parse_arch_list(archs)
    for version in accepted_by:
        assert torch_problems(arch_list, version) == [], version
        to_torch_arch_list(arch_list, version)
    for version in rejected_by:
        assert torch_problems(arch_list, version), version
        with pytest.raises(ArchError):
            to_torch_arch_list(arch_list, version)


@pytest.mark.parametrize("version", ["2.6", "2.8", "2.9", "2.15"])
def test_torch_never_accepts_family_or_ptx_only(version: str) -> None:
    for text in ("10.0f", "12.0f", "compute_120"):
        (problem,) = torch_problems(parse_arch_list(text), version)
        assert "TORCH_CUDA_ARCH_LIST" in problem
    with pytest.raises(ArchError, match="family"):
        to_torch_arch_list(parse_arch_list("12.0f"))
    with pytest.raises(ArchError, match="PTX-only"):
        to_torch_arch_list(parse_arch_list("compute_120"))


def test_torch_messages() -> None:
    assert torch_problems(parse_arch_list("10.1"), "2.9") == [
        "torch 2.9 does not accept 10.1 in TORCH_CUDA_ARCH_LIST "
        "(accepted by torch >= 2.7 and < 2.9)"
    ]
    assert torch_problems(parse_arch_list("12.0"), Version("2.6.0")) == [
        "torch 2.6 does not accept 12.0 in TORCH_CUDA_ARCH_LIST (accepted from torch 2.7)"
    ]
    assert "no TORCH_CUDA_ARCH_LIST data" in torch_problems(parse_arch_list("8.0"), "2.3")[0]
    with pytest.raises(UsageError):
        torch_problems(parse_arch_list("8.0"), "two.eight")


# --------------------------------------------------------------------------------------------
# More CUDA versions, nvcc and torch rules
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [("cuda-12.8", "12.8"), ("cuda_12.8", "12.8"), ("CUDA12.8", "12.8"), ("cuda128", "12.8"), ("CU130", "13.0"),
     ("cu92", "9.2"), ("12.8\n", "12.8")],
)
def test_parse_cuda_version_more_forms(text: str, expected: str) -> None:
    assert parse_cuda_version(text) == Version(expected)


def test_parse_cuda_version_messages() -> None:
    with pytest.raises(UsageError) as info:
        parse_cuda_version(128)  # type: ignore[arg-type]
    assert str(info.value) == "a CUDA version must be text such as 12.8 or cu128, not 128"
    with pytest.raises(UsageError) as info:
        parse_cuda_version("cu12\x1b")
    assert str(info.value) == "bad CUDA version 'cu12\\x1b': use forms like 12.8, 12.8.1 or cu128"
    assert info.value.exit_code == 2


def test_nvcc_labels_arch_specific_and_ptx_targets() -> None:
    assert nvcc_problems(parse_arch_list("9.0a"), "11.8") == [
        "sm_90a (arch-specific target) needs CUDA >= 12.0; CUDA 11.8 selected"
    ]
    assert nvcc_problems(parse_arch_list("compute_70"), "13.0") == [
        "compute_70 was dropped in CUDA 13.0; CUDA 13.0 selected (use CUDA <= 12.9 or drop 7.0)"
    ]
    # the archs.yaml note rides along with the "dropped" hint
    (problem,) = nvcc_problems(parse_arch_list("10.1a"), "13.0")
    assert problem.startswith("sm_101a was dropped in CUDA 13.0; CUDA 13.0 selected (use CUDA <= 12.9 or drop 10.1a; ")
    assert "renumbered sm_101 (Jetson Thor) as sm_110: use 11.0)" in problem


def test_nvcc_problems_takes_text_entries_and_versions() -> None:
    assert nvcc_problems("8.0 H100", Version("12.8.1")) == []
    assert nvcc_problems([CudaArch(12, 0)], "cu126") == ["sm_120 needs CUDA >= 12.8; CUDA 12.6 selected"]
    assert nvcc_problems(["12.0", "8.0"], "12.8") == []
    with pytest.raises(ArchError, match="empty"):
        nvcc_problems(ArchList(), "12.8")


def test_min_cuda_for_variants_and_conflicts() -> None:
    assert min_cuda_for("9.0a") == Version("12.0")
    assert min_cuda_for("8.0") == Version("11.0")
    assert min_cuda_for([CudaArch(10, 0, "f")]) == Version("12.9")
    with pytest.raises(ArchError) as info:
        min_cuda_for("10.1 11.0")
    message = str(info.value)
    assert message.startswith("no single CUDA toolkit can compile 10.1;11.0: sm_101 was dropped in CUDA 13.0")
    assert "\n" not in message
    with pytest.raises(ArchError):
        min_cuda_for(ArchList())


def test_torch_syntax_problem() -> None:
    assert torch_syntax_problem(CudaArch(9, 0, "a", ptx=True)) is None
    assert torch_syntax_problem(CudaArch(12, 0)) is None
    assert torch_syntax_problem(CudaArch(12, 0, "f")) == (
        "12.0f: TORCH_CUDA_ARCH_LIST never accepts family (f) targets; use 12.0 or 12.0a"
    )
    assert torch_syntax_problem(CudaArch(9, 0, "a", sass=False, ptx=True)) == (
        "compute_90a: TORCH_CUDA_ARCH_LIST cannot express a PTX-only entry; use 9.0a+PTX"
    )


def test_torch_problems_one_reason_per_entry_in_order() -> None:
    assert torch_problems("10.1 12.0 compute_90", "2.6") == [
        "compute_90: TORCH_CUDA_ARCH_LIST cannot express a PTX-only entry; use 9.0+PTX",
        "torch 2.6 does not accept 10.1 in TORCH_CUDA_ARCH_LIST (accepted by torch >= 2.7 and < 2.9)",
        "torch 2.6 does not accept 12.0 in TORCH_CUDA_ARCH_LIST (accepted from torch 2.7)",
    ]
    # before the table starts, the syntax reason still wins over "no data"
    assert torch_problems("8.0 12.0f", "2.3") == [
        "no TORCH_CUDA_ARCH_LIST data for torch 2.3 (known from torch 2.4)",
        "12.0f: TORCH_CUDA_ARCH_LIST never accepts family (f) targets; use 12.0 or 12.0a",
    ]


@pytest.mark.parametrize("version", ["2.8.0+cu128", "2.8.1", Version("2.8"), " 2.8 ", "2.8.0rc1"])
def test_torch_problems_reads_major_minor_only(version: str | Version) -> None:
    assert torch_problems("10.3 12.1a", version) == []
    assert torch_problems("11.0", version) != []


@pytest.mark.parametrize("bad", ["latest", "2.x", ""])
def test_torch_problems_bad_version_message(bad: str) -> None:
    with pytest.raises(UsageError, match="use forms like 2.8 or 2.8.0") as info:
        torch_problems("8.0", bad)
    assert str(info.value).startswith(f"bad torch version {bad!r}")
