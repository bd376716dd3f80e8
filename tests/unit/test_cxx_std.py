"""The C++ standard a compile uses, read from every spelling, and judged against each torch series'
headers (issue 37: torch 2.14's headers #error below C++20)."""

from __future__ import annotations

import pytest

from imagegen.model import compat
from imagegen.model.cxx_std import LATEST, CxxStd, effective, judge, parse_value, standard_year, standards

TABLE = compat.torch_table()


@pytest.mark.parametrize("argv, want", [
    (["-std=c++17"], [(2017, "-std=c++17", False)]),
    (["--std=c++20"], [(2020, "--std=c++20", False)]),
    (["--std", "c++17"], [(2017, "--std=c++17", False)]),          # nvcc's two-word form
    (["-std", "c++14"], [(2014, "-std=c++14", False)]),
    (["-std=gnu++17"], [(2017, "-std=gnu++17", False)]),
    (["-std=gnu++2a"], [(2020, "-std=gnu++2a", False)]),          # draft names
    (["-std=c++1z"], [(2017, "-std=c++1z", False)]),
    (["-std=c++2b"], [(2023, "-std=c++2b", False)]),
    (["/std:c++17"], [(2017, "/std:c++17", False)]),              # MSVC
    (["/std:c++latest"], [(LATEST, "/std:c++latest", False)]),
    (["-std:c++20"], [(2020, "-std:c++20", False)]),
    (["-Xcompiler", "-std=c++17"], [(2017, "-std=c++17", True)]),  # nvcc hands it to the host compiler
    (["-Xcompiler=/std:c++20"], [(2020, "/std:c++20", True)]),
    (["--compiler-options", "'-O3,-std=gnu++14'"], [(2014, "-std=gnu++14", True)]),
    (["-Xcompiler", "-O3,-fPIC"], []),
    (["-std=c11", "-O3", "-c", "x.cpp"], []),                      # C, not C++
    (["-O3", "-c", "x.cu"], []),
])
def test_standards_reads_every_spelling(argv, want):
    assert [(s.year, s.flag, s.host) for s in standards(argv)] == want


def test_the_effective_standard_is_the_last_per_compiler_and_the_older_of_nvcc_and_host():
    assert effective(["-std=c++17", "-O3", "-std=c++20"]).year == 2020  # the last one wins
    assert effective(["-std=c++20", "-Xcompiler", "-std=c++17"]).flag == "-std=c++17"  # the host compiles headers too
    assert effective(["-std=c++17", "-Xcompiler=-std=c++20"]).year == 2017
    assert effective(["-O3"]) is None


def test_parse_value_and_standard_year():
    assert parse_value("c++17") == 2017 and parse_value("GNU++20") == 2020 and parse_value("c++0x") == 2011
    assert parse_value("c17") is None and parse_value("c++18") is None
    assert standard_year(20) == 2020 and standard_year("17") == 2017 and standard_year(98) == 1998
    with pytest.raises(ValueError):
        standard_year(18)


def test_the_minimums_are_data_per_series():
    want = {"2.11": (17, 17, "17"), "2.12": (17, 17, "20"), "2.13": (17, 20, "20"), "2.14": (20, 20, "20"),
            "2.15": (20, 20, "20")}
    for series, (gcc, msvc, default) in want.items():
        s = TABLE[series]
        assert (s.min_cxx_std(), s.min_cxx_std(msvc=True), s.cxx_std) == (gcc, msvc, default), series
    assert all(s.min_cxx_std() == 17 for k, s in TABLE.items() if compat.major_minor(k) < (2, 14))


C17 = CxxStd(2017, "-std=c++17")


def test_judge_per_torch_series():
    assert judge("flash_attn_2_cuda", C17, TABLE["2.11"]) is None
    warned = judge("flash_attn_2_cuda", C17, TABLE["2.12"])
    assert warned.kind == "warn" and "torch 2.12 builds its own extensions as C++20" in warned.text
    assert "MSVC" not in warned.text  # 2.12's headers take C++17 with MSVC too
    assert "MSVC (Windows) needs C++20" in judge("x", C17, TABLE["2.13"]).text
    refused = judge("flash_attn_2_cuda", C17, TABLE["2.14"])
    assert refused.kind == "refuse"
    assert refused.text == ("flash_attn_2_cuda compiles with -std=c++17 but torch 2.14's headers require C++20 or later:"
                            " use a recipe fix (by_torch patch) or the package's release that picks the standard"
                            " from torch")
    assert judge("x", CxxStd(2020, "-std=c++20"), TABLE["2.14"]) is None
    assert judge("x", CxxStd(LATEST, "/std:c++latest"), TABLE["2.14"], msvc=True) is None


def test_judge_with_msvc_refuses_from_2_13():
    msvc17 = CxxStd(2017, "/std:c++17")
    assert judge("x", msvc17, TABLE["2.12"], msvc=True) is None
    refused = judge("x", msvc17, TABLE["2.13"], msvc=True, fix="use --torch 2.12 or older")
    assert refused.kind == "refuse"
    assert refused.text == ("x compiles with /std:c++17 but torch 2.13's headers require C++20 or later with MSVC:"
                            " use --torch 2.12 or older")
    assert "with MSVC" not in judge("x", msvc17, TABLE["2.14"], msvc=True).text  # every compiler needs it there
