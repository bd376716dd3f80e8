"""Tests for imagegen.model.arch: notations, merging, nvcc and torch rules, formatters, fuzzing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from packaging.version import Version

from imagegen.errors import ArchError, UsageError
from imagegen.model.arch import ArchList, CudaArch
from imagegen.model.arch_data import arch_info, known_ccs
from imagegen.model.arch_format import (
    format_for,
    to_cmake,
    to_dotted_list,
    to_gencode,
    to_numeric_list,
    to_torch_arch_list,
)
from imagegen.model.arch_parse import parse_arch_list
from imagegen.model.arch_rules import min_cuda_for, nvcc_problems, parse_cuda_version, torch_problems


def p(text: str) -> str:
    """Parse and print canonically: the shortest way to state expectations."""
    return str(parse_arch_list(text))


def raises_arch_error(text: object) -> ArchError:
    with pytest.raises(ArchError) as info:
        parse_arch_list(text)  # type: ignore[arg-type]
    message = str(info.value)
    assert message and "\n" not in message
    return info.value


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


# --------------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("12.0+PTX", "12.0+PTX"),
        ("12.0", "12.0"),
        ("120", "12.0"),
        ("sm_120", "12.0"),
        ("sm120", "12.0"),
        ("sm_90a", "9.0a"),
        ("compute_120", "compute_120"),
        ("compute_90a", "compute_90a"),
        ("compute_120+PTX", "compute_120"),
        ("10.0f", "10.0f"),
        ("100f", "10.0f"),
        ("sm_100f", "10.0f"),
        ("9.0a", "9.0a"),
        ("90a", "9.0a"),
        ("8.6+ptx", "8.6+PTX"),
        ("8.6+Ptx", "8.6+PTX"),
        ("sm_86+PTX", "8.6+PTX"),
        ("35", "3.5"),
        ("SM_80", "8.0"),
        ("90a-real", "9.0a"),
        ("120-virtual", "compute_120"),
        ("80-real;80-virtual", "8.0+PTX"),
    ],
)
def test_notations(text: str, expected: str) -> None:
    assert p(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "8.0;8.6;9.0",
        "8.0 8.6 9.0",
        "8.0,8.6,9.0",
        "8.0, 8.6 ;9.0",
        " 8.0;;8.6,,9.0 ; ",
        "8.0\t8.6\n9.0",
        "80 sm_86 9.0",
    ],
)
def test_separators_mix(text: str) -> None:
    assert p(text) == "8.0;8.6;9.0"


def test_iterable_input() -> None:
    assert p(["8.0", "9.0a;12.0+PTX"]) == "8.0;9.0a;12.0+PTX"  # type: ignore[arg-type]
    assert str(parse_arch_list(("sm_80", "compute_80"))) == "8.0+PTX"


def test_seed_document_merges_sass_and_ptx() -> None:
    assert p("compute_80;sm_80;compute_86;sm_86") == "8.0+PTX;8.6+PTX"


def test_merging_keeps_variants_apart() -> None:
    assert p("9.0 9.0a sm_90 compute_90a") == "9.0;9.0a+PTX"
    assert p("12.0 12.0 120 sm_120") == "12.0"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Ampere", "8.0;8.6+PTX"),
        ("hopper", "9.0+PTX"),
        ("BLACKWELL", "10.0;10.3;12.0;12.1+PTX"),
        ("Kepler", "3.5+PTX"),
        ("Maxwell", "5.0;5.2+PTX"),
        ("Pascal", "6.0;6.1+PTX"),
        ("Volta", "7.0+PTX"),
        ("Turing", "7.5+PTX"),
        ("Ada", "8.9+PTX"),
        ("Lovelace", "8.9+PTX"),
        ("Ada Lovelace", "8.9+PTX"),
        ("Ampere+Tegra", "8.7"),
        ("Ampere;Hopper", "8.0;8.6+PTX;9.0+PTX"),
    ],
)
def test_generation_names(text: str, expected: str) -> None:
    assert p(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("H100", "9.0"),
        ("h200", "9.0"),
        ("A100", "8.0"),
        ("rtx5090", "12.0"),
        ("RTX 5090", "12.0"),
        ("RTX-5090", "12.0"),
        ("5090", "12.0"),
        ("B200", "10.0"),
        ("B300", "10.3"),
        ("GB10", "12.1"),
        ("DGX Spark", "12.1"),
        ("RTX PRO 6000", "12.0"),
        ("Jetson Thor", "11.0"),
        ("T4", "7.5"),
        ("L4", "8.9"),
        ("L40S", "8.9"),
        ("4090", "8.9"),
        ("3090", "8.6"),
        ("V100", "7.0"),
        ("H100+PTX", "9.0+PTX"),
        ("A100, H100 RTX 5090", "8.0;9.0;12.0"),
    ],
)
def test_gpu_names(text: str, expected: str) -> None:
    assert p(text) == expected


def test_spaced_numbers_are_not_joined_into_product_names() -> None:
    # "50 90" means 5.0 and 9.0, not an RTX 5090.
    assert p("50 90") == "5.0;9.0"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "empty"),
        ("  ; , ", "empty"),
        ("sm_12x", "'sm_12x'"),
        ("4.2", "4.2"),
        ("13.7", "13.7"),
        ("137", "13.7"),
        ("8.0f", "family"),
        ("90f", "family"),
        ("8.6a", "arch-specific"),
        ("75a", "arch-specific"),
        ("garbage", "'garbage'"),
        ("8.0;nonsense;9.0", "'nonsense'"),
        ("8.0\x00", "\\x00"),
        ("8.0\x1b[31m", "\\x1b"),
        ("9.0\x0b12.0", "\\x0b"),
        ("９.０", "\\uff19"),
        ("8.0" + ";8.0" * 300, "too long"),
        ("Hopper+PTX", "Hopper+PTX"),
        ("0.0", "unknown"),
        ("compute_", "compute_"),
        ("RTX", "'RTX'"),
    ],
)
def test_parse_errors(text: str, needle: str) -> None:
    error = raises_arch_error(text)
    assert needle in str(error)


def test_unknown_token_message_lists_accepted_forms() -> None:
    error = raises_arch_error("sm_12x")
    assert str(error) == (
        "unknown GPU architecture 'sm_12x': use forms like 8.0, 9.0a, 12.0+PTX, sm_120, "
        "compute_120, 10.0f, or a name such as Hopper or H100"
    )
    assert error.exit_code == 2


@pytest.mark.parametrize("bad", [None, 12, b"8.0", ["8.0", 9.0]])
def test_non_text_input(bad: object) -> None:
    raises_arch_error(bad)


def test_only_known_ccs_are_valid() -> None:
    ccs = known_ccs()
    assert ccs[0] == "3.5" and ccs[-1] == "12.1"
    for cc in ccs:
        assert p(cc) == cc
    assert arch_info("9.0").generation == "Hopper"
    assert arch_info(CudaArch(12, 1)).min_cuda == Version("12.9")
    with pytest.raises(ArchError):
        arch_info("4.2")


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
# Fuzzing
# --------------------------------------------------------------------------------------------

_TOKENS = [
    "8.0", "8.6+PTX", "9.0a", "90a", "100f", "10.0f", "12.0+ptx", "120", "sm_120", "sm_90a",
    "compute_80", "compute_90a", "compute_120+PTX", "35", "7.5", "11.0", "10.1a", "12.1a",
    "Ampere", "hopper", "BLACKWELL", "Ada", "Lovelace", "Ampere+Tegra", "H100", "rtx5090",
    "RTX", "5090", "PRO", "6000", "DGX", "Spark", "GB10", "L40S", "80-real", "120-virtual",
    # and some that must fail
    "8.0f", "8.6a", "4.2", "13.7", "sm_12x", "compute_", "+PTX", "", "\x00", "9.0\u00a0",
]
_SEPARATORS = st.sampled_from([";", ",", " ", " ; ", ",,", "\t", "\n", ";;", "\x0c"])


def _check(text: str) -> None:
    try:
        result = parse_arch_list(text)
    except ArchError as error:
        assert "\n" not in str(error)
        return
    assert result
    assert parse_arch_list(str(result)) == result
    # Every formatter either works or refuses with ArchError.
    for style in ("torch", "numeric", "dotted", "cmake", "gencode"):
        try:
            format_for(result, style)
        except ArchError:
            pass


@settings(max_examples=300)
@given(st.text())
def test_fuzz_arbitrary_text(text: str) -> None:
    _check(text)


@settings(max_examples=300)
@given(st.lists(st.tuples(st.sampled_from(_TOKENS), _SEPARATORS), max_size=12))
def test_fuzz_token_lists(pairs: list[tuple[str, str]]) -> None:
    _check("".join(token + sep for token, sep in pairs))


@settings(max_examples=200)
@given(st.lists(st.sampled_from([t for t in _TOKENS if t]), min_size=1, max_size=8))
def test_fuzz_iterable_input(tokens: list[str]) -> None:
    try:
        result = parse_arch_list(tokens)
    except ArchError:
        return
    assert parse_arch_list(str(result)) == result
    assert parse_arch_list(str(result).split(";")) == result
