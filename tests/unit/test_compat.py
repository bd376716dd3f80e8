"""Tests for imagegen.model.compat: torch/CUDA/Python tables, the refresh overlay, flag forms, index URLs.
The flavors and base images are tested in test_base_images.py."""

from __future__ import annotations

import pytest
from packaging.version import Version

from imagegen.errors import CompatError, UnsafeValueError, UsageError
from imagegen.model import compat


# --------------------------------------------------------------------------------------------
# The tables
# --------------------------------------------------------------------------------------------


def test_torch_table_is_in_version_order() -> None:
    table = compat.torch_table()
    assert list(table)[:2] == ["2.4", "2.5"]
    keys = [row.key for row in table.values()]
    assert keys == sorted(keys)
    assert list(table).index("2.10") == list(table).index("2.9") + 1  # numeric, not text, order


def test_torch_series_row() -> None:
    row = compat.torch_table()["2.8"]
    assert row.latest == "2.8.0"
    assert row.key == (2, 8)
    assert row.cuda == ("cu126", "cu128", "cu129")
    assert row.pypi_default == "cu128"
    assert row.cxx11_abi and row.manylinux == "manylinux_2_28"
    assert row.pythons == ["3.9", "3.10", "3.11", "3.12", "3.13"]
    assert row.supports_python("3.9") and row.supports_python("3.13")
    assert not row.supports_python("3.8") and not row.supports_python("3.14")
    assert compat.torch_table()["2.10"].pythons[-1] == "3.14"
    assert not compat.torch_table()["2.6"].cxx11_abi


def test_tables_agree_with_each_other() -> None:
    cudas = compat.cuda_table()
    for series, row in compat.torch_table().items():
        assert set(row.cuda) <= set(cudas), series
        assert row.pypi_default in row.cuda, series
        assert row.latest.startswith(series + "."), series
        assert row.pythons and all(row.supports_python(py) for py in row.pythons), series


def test_cuda_variant_row() -> None:
    cu128 = compat.cuda_table()["cu128"]
    assert (cu128.major, cu128.minor, cu128.dotted) == (12, 8, "12.8")
    assert cu128.version == Version("12.8")
    assert str(cu128) == "cu128"
    assert cu128.toolkit == "12.8.1" and cu128.pypi_toolkit is None and cu128.pypi_extras == ()
    cu130 = compat.cuda_table()["cu130"]
    assert cu130.pypi_toolkit == "13.0.3" and "nvcc" in cu130.pypi_extras
    assert compat.cuda_table()["cu132"].ubuntu == ("24.04",)


# --------------------------------------------------------------------------------------------
# --torch, --cuda, --python as users write them
# --------------------------------------------------------------------------------------------


def test_torch_series_resolves_the_release_to_install() -> None:
    row, version = compat.torch_series("2.8")
    assert row is compat.torch_table()["2.8"] and version == "2.8.0"
    assert compat.torch_series(" 2.8.1 ")[1] == "2.8.1"
    assert compat.torch_series("2.10")[1] == compat.torch_table()["2.10"].latest


@pytest.mark.parametrize("bad", ["2", "latest", "2.8.0.1", "2.8.0+cu128", "", "v2.8"])
def test_torch_series_bad_form_is_usage_error(bad: str) -> None:
    with pytest.raises(UsageError, match="is not a torch version like 2.8 or 2.8.0"):
        compat.torch_series(bad)


def test_torch_series_unknown_is_compat_error_naming_the_known() -> None:
    with pytest.raises(CompatError) as info:
        compat.torch_series("1.13")
    message = str(info.value)
    assert message.startswith("torch 1.13 is not in imagegen's compatibility table (known: 2.4, 2.5, ")
    assert "run `imagegen refresh`" in message
    assert info.value.exit_code == 3


@pytest.mark.parametrize("text", ["12.8", "12.8.1", "cu128", "128", "CU128", " cu128 "])
def test_cuda_variant_forms(text: str) -> None:
    assert compat.cuda_variant(text) is compat.cuda_table()["cu128"]


def test_cuda_variant_errors() -> None:
    assert compat.cuda_variant("13.0").name == "cu130"
    assert compat.cuda_variant("11.8").name == "cu118"
    with pytest.raises(CompatError) as info:
        compat.cuda_variant("12.5")
    assert str(info.value) == (
        "CUDA 12.5 has no torch wheels (known: cu118, cu121, cu124, cu126, cu128, cu129, cu130, cu132);"
        " `imagegen refresh` adds what PyPI has since"
    )
    for bad in ("cu1280", "13", "twelve", "12", ""):
        with pytest.raises(UsageError, match="is not a CUDA version like 12.8 or cu128"):
            compat.cuda_variant(bad)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("3.12", "3.12"), ("312", "3.12"), ("py312", "3.12"), ("cp312", "3.12"), ("3.12.4", "3.12"), ("CP39", "3.9"),
     ("310", "3.10"), (" 3.14 ", "3.14")],
)
def test_validate_python_forms(text: str, expected: str) -> None:
    assert compat.validate_python(text) == expected


@pytest.mark.parametrize("bad", ["2.7", "3", "python3.12", "3.1234", "cp2", "", "3.12-dev"])
def test_validate_python_errors(bad: str) -> None:
    with pytest.raises(UsageError) as info:
        compat.validate_python(bad)
    assert str(info.value) == f"--python {bad!r} is not a CPython version like 3.12 (or 312, cp312)"


def test_torch_index_url() -> None:
    series = compat.torch_table()["2.8"]
    assert compat.torch_index_url(series, compat.cuda_variant("cu128")) is None  # PyPI's default variant
    assert compat.torch_index_url(series, compat.cuda_variant("cu126")) == "https://download.pytorch.org/whl/cu126"
    assert compat.torch_index_url(compat.torch_table()["2.11"], compat.cuda_variant("cu128")) == (
        "https://download.pytorch.org/whl/cu128"
    )
    mirror = "https://mirror.example/whl/{cuda}"
    assert compat.torch_index_url(series, compat.cuda_variant("cu128"), mirror) == "https://mirror.example/whl/cu128"
    assert compat.torch_index_url(series, compat.cuda_variant("cu126"), "") == "https://download.pytorch.org/whl/cu126"
    with pytest.raises(UnsafeValueError, match="torch index URL"):
        compat.torch_index_url(series, compat.cuda_variant("cu126"), "https://x/$(id)")


def test_parse_version() -> None:
    assert compat.parse_version("1.2.3", "--version") == Version("1.2.3")
    with pytest.raises(UsageError) as info:
        compat.parse_version("abc", "--version")
    assert str(info.value) == "--version 'abc' is not a version"


def test_an_overlay_row_without_the_cxx_minimums_takes_torchs_own_standard(tmp_path, monkeypatch):
    # A row `imagegen refresh` wrote before torch.yaml had cxx_std_min: the standard torch itself
    # compiles with is the safe minimum (a newer series only ever raised it).
    (tmp_path / "torch.yaml").write_text('series:\n  "2.16":\n    latest: "2.16.0"\n    python: ["3.11", "3.15"]\n'
                                         '    cuda: [cu132]\n    pypi_default: cu132\n    cxx11_abi: true\n'
                                         '    manylinux: manylinux_2_28\n    cxx_std: "20"\n')
    monkeypatch.setenv("IMAGEGEN_COMPAT_DIR", str(tmp_path))
    compat.reload()
    try:
        row = compat.torch_table()["2.16"]
        assert (row.min_cxx_std(), row.min_cxx_std(msvc=True)) == (20, 20)
        assert compat.torch_table()["2.13"].min_cxx_std(msvc=True) == 20
    finally:
        monkeypatch.undo()  # the suite's own (empty) overlay folder again
        compat.reload()
