"""Tests for imagegen.model.arch_data: the archs.yaml facts (capabilities, names, GPUs, torch states) and arch_error."""

from __future__ import annotations

from importlib.resources import files
from typing import Any

import pytest
from packaging.version import Version

from imagegen import yamlio
from imagegen.errors import ArchError
from imagegen.model.arch import CudaArch, arch_from_notation
from imagegen.model.arch_data import _build_data, arch_error, arch_info, arch_table, known_ccs
from imagegen.model.arch_parse import parse_arch_list


def p(text: str) -> str:
    """Parse and print canonically: the shortest way to state expectations."""
    return str(parse_arch_list(text))


def test_only_known_ccs_are_valid() -> None:
    ccs = known_ccs()
    assert ccs[0] == "3.5" and ccs[-1] == "12.1"
    for cc in ccs:
        assert p(cc) == cc
    assert arch_info("9.0").generation == "Hopper"
    assert arch_info(CudaArch(12, 1)).min_cuda == Version("12.9")
    with pytest.raises(ArchError):
        arch_info("4.2")


def _raw() -> dict[str, Any]:
    """A fresh copy of the packaged archs.yaml as read from disk, to break on purpose."""
    text = (files("imagegen") / "resources/compat/archs.yaml").read_text(encoding="utf-8")
    return yamlio.load(text)


def test_arch_table_is_loaded_once_and_matches_the_file() -> None:
    assert arch_table() is arch_table()
    rebuilt = _build_data(_raw())
    assert rebuilt.infos == arch_table().infos
    assert rebuilt.named == arch_table().named
    assert rebuilt.gpus == arch_table().gpus
    assert rebuilt.torch_states == arch_table().torch_states


def test_known_ccs_are_oldest_first_and_unique() -> None:
    ccs = known_ccs()
    as_tuples = [tuple(int(x) for x in cc.split(".")) for cc in ccs]
    assert as_tuples == sorted(as_tuples)
    assert len(set(ccs)) == len(ccs)
    assert {"7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "11.0", "12.0"} <= set(ccs)


def test_arch_info_facts() -> None:
    thor_old = arch_info("10.1")
    assert thor_old.max_cuda == Version("12.9") and thor_old.dropped_in == Version("13.0")
    assert thor_old.note and "11.0" in thor_old.note
    assert arch_info("9.0").a_min_cuda == Version("12.0")
    assert arch_info("8.0").a_min_cuda is None and arch_info("8.0").max_cuda is None
    assert arch_info("3.5").dropped_in == Version("12.0")
    assert "H100" in arch_info("9.0").gpus
    # an entry's variant and flags do not matter: the capability does
    assert arch_info(CudaArch(12, 0, "a", sass=False, ptx=True)) is arch_info("12.0")
    for cc in known_ccs():
        info = arch_info(cc)
        assert info.cc == cc
        assert (info.max_cuda is None) == (info.dropped_in is None)


def test_arch_info_unknown_is_one_line_arch_error() -> None:
    with pytest.raises(ArchError) as info:
        arch_info("4.2")
    assert str(info.value).startswith("unknown compute capability '4.2': known are 3.5, 3.7, 5.0")
    assert str(info.value).endswith(", 12.1")
    assert info.value.exit_code == 2
    with pytest.raises(ArchError) as info:
        arch_info("9.0\x1b[2J")
    assert "\x1b" not in str(info.value) and "\\x1b" in str(info.value)


def test_family_minimum_and_named_expansions() -> None:
    data = arch_table()
    assert data.family_min_cuda == Version("12.9")
    assert all(name == name.lower() for name in data.named)
    assert data.named["hopper"] == (CudaArch(9, 0, ptx=True),)
    assert data.named["blackwell+tegra"] == (CudaArch(11, 0),)
    assert data.named["lovelace"] == data.named["ada"]


def test_gpu_aliases_are_sass_only_and_never_a_notation() -> None:
    gpus = arch_table().gpus
    assert gpus["rtxpro6000"] == CudaArch(12, 0)
    assert gpus["h100"] == CudaArch(9, 0)
    for key, arch in gpus.items():
        assert arch.sass and not arch.ptx and arch.variant == "", key
        assert arch_from_notation(key) is None, key
        assert arch.cc in known_ccs(), key


def test_torch_states_accumulate_oldest_first() -> None:
    states = arch_table().torch_states
    sinces = [since for since, _ in states]
    assert sinces == sorted(sinces) and sinces[0] == (2, 4)
    by_since = dict(states)
    assert "10.0" not in by_since[(2, 4)] and "9.0a" in by_since[(2, 4)]
    assert "10.0" in by_since[(2, 6)]
    assert "10.1" in by_since[(2, 8)] and "10.1" not in by_since[(2, 9)]
    assert "11.0" in by_since[(2, 9)]
    for _, values in states:
        assert not any(value.endswith("f") for value in values)
        assert not any("+" in value for value in values)


def test_torch_states_are_sorted_whatever_the_file_order() -> None:
    raw = _raw()
    raw["torch_accepts"].reverse()
    assert _build_data(raw).torch_states == arch_table().torch_states


@pytest.mark.parametrize(
    ("arch", "token"),
    [(CudaArch(9, 0, "a"), "9.0a"), (CudaArch(10, 0, "f"), "100f"), (CudaArch(12, 1, "a"), "sm_121a"),
     (CudaArch(7, 5), "7.5"), (CudaArch(12, 0, sass=False, ptx=True), "compute_120")],
)
def test_arch_error_accepts_real_targets(arch: CudaArch, token: str) -> None:
    assert arch_error(arch, token, arch_table().infos) is None


def test_arch_error_messages() -> None:
    infos = arch_table().infos
    unknown = arch_error(CudaArch(4, 2), "sm_42", infos)
    assert unknown is not None
    assert unknown.startswith("unknown compute capability 4.2 in 'sm_42': known are 3.5, ")
    assert arch_error(CudaArch(8, 6, "a"), "8.6a", infos) == (
        "'8.6a': arch-specific (a) targets exist only for compute capability 9.0 and newer; use 8.6"
    )
    assert arch_error(CudaArch(9, 0, "f"), "90f", infos) == (
        "'90f': family (f) targets exist only for compute capability 10.0 and newer; use 9.0"
    )
    # the capability check comes first, and the token is quoted escaped
    assert "'4.2a\\x00'" in (arch_error(CudaArch(4, 2, "a"), "4.2a\x00", infos) or "")
    # the facts it judges against are the ones passed in
    assert arch_error(CudaArch(9, 0), "9.0", {}) is not None


@pytest.mark.parametrize(
    ("break_it", "needle"),
    [
        (lambda raw: raw["archs"].append(dict(raw["archs"][0])), "duplicate cc"),
        (lambda raw: raw["archs"][0].update(cc="35"), "bad or duplicate cc"),
        (lambda raw: raw["archs"][-1].update(max_cuda="13.0"), "go together"),
        (lambda raw: raw["named"].update(Mystery="4.2"), "unknown arch"),
        (lambda raw: raw["named"].update(Mystery="Hopper"), "bad arch"),
        (lambda raw: raw["gpus"].update({"100": "9.0"}), "collides"),
        (lambda raw: raw["gpus"].update({"Hop-per": "9.0"}), "collides"),
        (lambda raw: raw["gpus"].update({"x100": "4.2"}), "unknown arch"),
        (lambda raw: raw["torch_accepts"][0]["add"].append("8.0f8"), "bad arch"),
    ],
)
def test_build_data_refuses_inconsistent_facts(break_it: Any, needle: str) -> None:
    # arch_table() turns these into "the packaged archs.yaml is broken: ..." (an ArchError).
    raw = _raw()
    break_it(raw)
    with pytest.raises(ValueError, match=needle):
        _build_data(raw)


def test_build_data_missing_section_is_a_key_error() -> None:
    raw = _raw()
    del raw["family_min_cuda"]
    with pytest.raises(KeyError):
        _build_data(raw)
