"""Tests for imagegen.model.arch_format: an ArchList in torch, numeric, dotted, CMake and -gencode notation."""

from __future__ import annotations

import pytest
from packaging.version import Version

from imagegen.errors import ArchError
from imagegen.model.arch import ArchList, CudaArch
from imagegen.model.arch_format import (
    as_tuples,
    format_for,
    to_cmake,
    to_dotted_list,
    to_gencode,
    to_numeric_list,
    to_torch_arch_list,
)
from imagegen.model.arch_parse import parse_arch_list

# --------------------------------------------------------------------------------------------
# torch
# --------------------------------------------------------------------------------------------


def test_to_torch_arch_list() -> None:
    archs = parse_arch_list("sm_80 90a 120+PTX")
    assert to_torch_arch_list(archs) == "8.0;9.0a;12.0+PTX"
    assert to_torch_arch_list(archs, "2.8.0+cu128") == "8.0;9.0a;12.0+PTX"
    with pytest.raises(ArchError) as info:
        to_torch_arch_list(parse_arch_list("11.0 12.0f"), "2.8")
    assert "\n" not in str(info.value)
    assert "11.0" in str(info.value) and "12.0f" in str(info.value)


# --------------------------------------------------------------------------------------------
# Other formatters
# --------------------------------------------------------------------------------------------


def test_numeric_and_dotted() -> None:
    archs = parse_arch_list("8.0 9.0 9.0a 10.0f 12.0+PTX compute_121")
    assert to_numeric_list(archs) == "80;90;100;120;121"
    assert to_numeric_list(archs, sep=",") == "80,90,100,120,121"
    assert to_numeric_list(archs, keep_variant=True) == "80;90;90a;100f;120;121"
    assert to_dotted_list(archs) == "8.0;9.0;10.0;12.0;12.1"
    assert to_dotted_list(archs, sep=" ") == "8.0 9.0 10.0 12.0 12.1"


def test_cmake() -> None:
    archs = parse_arch_list("8.0 9.0a 12.0+PTX")
    assert to_cmake(archs) == "80-real;90a-real;120-real;120-virtual"
    assert to_cmake(parse_arch_list("compute_90a")) == "90a-virtual"
    assert parse_arch_list(to_cmake(archs)) == archs  # CMake's form parses back


def test_gencode() -> None:
    archs = parse_arch_list("8.0 9.0a 12.0+PTX")
    assert to_gencode(archs) == [
        "-gencode=arch=compute_80,code=sm_80",
        "-gencode=arch=compute_90a,code=sm_90a",
        "-gencode=arch=compute_120,code=sm_120",
        "-gencode=arch=compute_120,code=compute_120",
    ]
    assert to_gencode(parse_arch_list("compute_100f")) == [
        "-gencode=arch=compute_100f,code=compute_100f"
    ]


def test_format_for() -> None:
    archs = parse_arch_list("8.0 9.0a 12.0+PTX")
    assert format_for(archs, "torch") == "8.0;9.0a;12.0+PTX"
    assert format_for(archs, "torch", torch_version="2.7") == "8.0;9.0a;12.0+PTX"
    assert format_for(archs, "numeric", sep=",") == "80,90,120"
    assert format_for(archs, "numeric", keep_variant=True) == "80;90a;120"
    assert format_for(archs, "dotted") == "8.0;9.0;12.0"
    assert format_for(archs, "cmake") == "80-real;90a-real;120-real;120-virtual"
    assert format_for(archs, "gencode") == " ".join(to_gencode(archs))
    with pytest.raises(ArchError, match="unknown arch format"):
        format_for(archs, "natten")
    with pytest.raises(ArchError, match="takes no option"):
        format_for(archs, "cmake", sep=",")


def test_formatters_take_text_and_refuse_empty() -> None:
    assert to_numeric_list("Hopper H100") == "90"
    for formatter in (to_torch_arch_list, to_numeric_list, to_dotted_list, to_cmake, to_gencode):
        with pytest.raises(ArchError):
            formatter(ArchList())


# --------------------------------------------------------------------------------------------
# More formatting
# --------------------------------------------------------------------------------------------


def test_as_tuples() -> None:
    assert as_tuples(parse_arch_list("8.0 9.0a+PTX compute_120")) == [
        (8, 0, "", True, False),
        (9, 0, "a", True, True),
        (12, 0, "", False, True),
    ]
    assert as_tuples("H100") == [(9, 0, "", True, False)]  # type: ignore[arg-type]
    with pytest.raises(ArchError, match="empty"):
        as_tuples(ArchList())


def test_torch_list_reports_every_problem_on_one_line() -> None:
    with pytest.raises(ArchError) as info:
        to_torch_arch_list(parse_arch_list("12.0f compute_90"))
    assert str(info.value) == (
        "compute_90: TORCH_CUDA_ARCH_LIST cannot express a PTX-only entry; use 9.0+PTX; "
        "12.0f: TORCH_CUDA_ARCH_LIST never accepts family (f) targets; use 12.0 or 12.0a"
    )
    assert info.value.exit_code == 2


def test_torch_list_checks_against_the_torch_version() -> None:
    archs = parse_arch_list("10.1 12.0")
    assert to_torch_arch_list(archs, Version("2.8.0")) == "10.1;12.0"
    with pytest.raises(ArchError, match="torch 2.9 does not accept 10.1"):
        to_torch_arch_list(archs, "2.9")
    with pytest.raises(ArchError, match="torch 2.6 does not accept 12.0"):
        format_for(archs, "torch", torch_version="2.6")


@pytest.mark.parametrize("text", ["8.0;9.0a;12.0+PTX", "3.5+PTX;7.5;10.3a", "Blackwell", "A100 H100 RTX 5090"])
def test_torch_and_cmake_lists_parse_back(text: str) -> None:
    archs = parse_arch_list(text)
    assert parse_arch_list(to_torch_arch_list(archs)) == archs
    assert parse_arch_list(to_cmake(archs)) == archs


def test_numeric_and_dotted_drop_what_they_cannot_tell_apart() -> None:
    archs = parse_arch_list("9.0 9.0a compute_90 10.0f")
    assert to_numeric_list(archs) == "90;100"
    assert to_numeric_list(archs, keep_variant=True) == "90;90a;100f"
    assert to_dotted_list(archs) == "9.0;10.0"


def test_formatters_take_loose_entries_and_strings() -> None:
    entries = [CudaArch(12, 0, sass=False, ptx=True), CudaArch(8, 0)]
    assert to_cmake(entries) == "80-real;120-virtual"  # type: ignore[arg-type]
    assert to_gencode(["sm_80"]) == ["-gencode=arch=compute_80,code=sm_80"]  # type: ignore[arg-type]
    assert to_dotted_list("Ampere", sep=",") == "8.0,8.6"  # type: ignore[arg-type]


def test_format_for_style_names() -> None:
    archs = parse_arch_list("8.0")
    assert format_for(archs, "CMake") == "80-real"
    assert format_for(archs, "GENCODE") == "-gencode=arch=compute_80,code=sm_80"
    with pytest.raises(ArchError) as info:
        format_for(archs, 7)  # type: ignore[arg-type]
    assert str(info.value) == "unknown arch format '7': use one of torch, numeric, dotted, cmake, gencode"
    with pytest.raises(ArchError) as info:
        format_for(archs, "nat\x1bten")
    assert "'nat\\x1bten'" in str(info.value)


def test_format_for_names_the_options_a_style_takes() -> None:
    archs = parse_arch_list("8.0")
    with pytest.raises(ArchError) as info:
        format_for(archs, "numeric", torch_version="2.8", foo=1)
    assert str(info.value) == "arch format 'numeric' takes no option foo, torch_version (it takes: keep_variant, sep)"
    with pytest.raises(ArchError) as info:
        format_for(archs, "gencode", sep=",")
    assert str(info.value) == "arch format 'gencode' takes no option sep (it takes: none)"
    with pytest.raises(ArchError, match="takes no option keep_variant"):
        format_for(archs, "dotted", keep_variant=True)
