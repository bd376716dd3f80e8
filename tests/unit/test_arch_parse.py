"""Tests for imagegen.model.arch_parse: every notation, name and separator into one ArchList; refusals; fuzzing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from imagegen.errors import ArchError
from imagegen.model.arch import MAX_INPUT_CHARS, ArchList, CudaArch
from imagegen.model.arch_format import format_for
from imagegen.model.arch_parse import as_arch_list, parse_arch_list


def p(text: str) -> str:
    """Parse and print canonically: the shortest way to state expectations."""
    return str(parse_arch_list(text))


def raises_arch_error(text: object) -> ArchError:
    with pytest.raises(ArchError) as info:
        parse_arch_list(text)  # type: ignore[arg-type]
    message = str(info.value)
    assert message and "\n" not in message
    return info.value


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


# --------------------------------------------------------------------------------------------
# More parsing, and as_arch_list
# --------------------------------------------------------------------------------------------


def test_names_and_notations_merge() -> None:
    assert p("Hopper 9.0") == "9.0+PTX"
    assert p("H100 compute_90") == "9.0+PTX"
    assert p("RTX 5090 H100") == "9.0;12.0"
    assert p("jetson  thor;rtx\t5090") == "11.0;12.0"
    assert p("RTX5090+PTX") == "12.0+PTX"


def test_spaced_product_name_takes_ptx_suffix() -> None:
    assert p("RTX 5090+PTX") == "12.0+PTX"


def test_product_name_words_are_not_joined_across_list_separators() -> None:
    # Only spaces join words of a name: ';' and ',' always end a token.
    assert "'RTX'" in str(raises_arch_error("RTX;5090"))
    assert "'RTX'" in str(raises_arch_error("RTX,5090"))


def test_generator_input() -> None:
    assert str(parse_arch_list(text for text in ("8.0", "H100"))) == "8.0;9.0"


def test_input_length_limit_is_inclusive() -> None:
    text = " " * (MAX_INPUT_CHARS - 3) + "8.0"
    assert len(text) == MAX_INPUT_CHARS
    assert p(text) == "8.0"
    error = raises_arch_error(text + " ")
    assert str(error) == (
        f"the GPU architecture list is too long ({MAX_INPUT_CHARS + 1} characters, at most {MAX_INPUT_CHARS})"
    )
    # an iterable is measured joined with ';'
    raises_arch_error(["8.0"] * 251)


def test_non_text_messages() -> None:
    assert str(raises_arch_error(12)) == "a GPU architecture list must be text, not int"
    assert str(raises_arch_error(["8.0", None])) == "a GPU architecture list must contain only strings"


def test_as_arch_list_passes_an_arch_list_through() -> None:
    archs = parse_arch_list("8.0 9.0")
    assert as_arch_list(archs) is archs


@pytest.mark.parametrize(
    "value",
    [
        "8.0;12.0+PTX",
        ["8.0", "12.0+PTX"],
        ("sm_80", "compute_120", "sm_120"),
        [CudaArch(12, 0, ptx=True), CudaArch(8, 0)],
        (arch for arch in (CudaArch(8, 0), CudaArch(12, 0, sass=False, ptx=True), CudaArch(12, 0))),
    ],
)
def test_as_arch_list_takes_text_strings_or_entries(value: object) -> None:
    result = as_arch_list(value)  # type: ignore[arg-type]
    assert isinstance(result, ArchList)
    assert str(result) == "8.0;12.0+PTX"


@pytest.mark.parametrize("empty", [ArchList(), "", " ; ", [], ()])
def test_as_arch_list_refuses_empty(empty: object) -> None:
    with pytest.raises(ArchError, match="the GPU architecture list is empty: use forms like"):
        as_arch_list(empty)  # type: ignore[arg-type]


def test_as_arch_list_refuses_mixed_items() -> None:
    with pytest.raises(ArchError, match="ArchList takes CudaArch entries, not str"):
        as_arch_list([CudaArch(8, 0), "9.0"])  # type: ignore[list-item]
    with pytest.raises(ArchError):
        as_arch_list(["8.0", "nonsense"])
