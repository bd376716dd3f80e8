"""The audit's header probe without compilers: a recorded compile turned into the probe's command
line (g++ and nvcc forms), one probe per distinct flag set, the report, the judgement and the skip
switch. The probe with real compilers and torch 2.14.1's headers is
tests/integration/test_header_probe.py."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from packaging.version import Version

from imagegen.model.audit import judge, probe_fix

from imagegen.model.audit_report import AuditReport
from imagegen.model.arch_parse import parse_arch_list

ROOT = Path(__file__).resolve().parents[2]
BUILDER = ROOT / "imagegen" / "shipped" / "builder"
sys.path.insert(0, str(BUILDER))
import imagegen_audit as audit  # noqa: E402  (stdlib-only script shipped beside imagegen_build.py)
import imagegen_audit_probe as probe  # noqa: E402  (the header probe, beside it)
import imagegen_audit_records as audit_records  # noqa: E402

SRC = "/w/src"
BUILD = "/w/src/build/temp.linux-x86_64-cpython-311"
INC = ["-I/site/torch/include", "-I/site/torch/include/torch/csrc/api/include", "-I/w/cuda/include",
       "-I/usr/include/python3.11"]
# What torch's ninja rules record (cxx: `$cxx -MMD -MF $out.d $cflags -c $in -o $out $post_cflags`;
# cuda: `$nvcc -MD -MF $out.d $cuda_cflags -c $in -o $out $cuda_post_cflags`), as the stand-ins see them.
HOST = ["-MMD", "-MF", f"{BUILD}/csrc/bind.o.d", "-Wsign-compare", "-DNDEBUG", "-g", "-O3", "-fPIC", *INC, "-c",
        f"{SRC}/csrc/bind.cpp", "-o", f"{BUILD}/csrc/bind.o", "-DTORCH_API_INCLUDE_EXTENSION_H",
        "-DTORCH_EXTENSION_NAME=_C", "-std=c++17"]
NVCC = ["-MD", "-MF", f"{BUILD}/csrc/k.o.d", *INC, "-c", f"{SRC}/csrc/k.cu", "-o", f"{BUILD}/csrc/k.o",
        "-D__CUDA_NO_HALF_OPERATORS__", "--expt-relaxed-constexpr", "--compiler-options", "'-fPIC'", "-O3",
        "-Xcompiler", "-fno-strict-aliasing", "-gencode", "arch=compute_90a,code=sm_90a",
        "-gencode=arch=compute_80,code=sm_80", "--generate-code=arch=compute_120,code=[sm_120,compute_120]",
        "-std=c++17", "--threads", "4", "-ccbin", "/w/stubs/cc"]
STUBS = {"/w/stubs/cc": "/usr/bin/gcc", "/w/cuda/bin/nvcc": "/usr/local/cuda/bin/nvcc"}


def test_a_host_compile_becomes_a_preprocessing_probe_of_torch_extension_h():
    cmd = probe.probe_command("host", HOST, "/w/probe/imagegen_probe.cpp", "/w/probe/p0.out")
    assert cmd == ["-Wsign-compare", "-DNDEBUG", "-g", "-O3", "-fPIC", *INC, "-DTORCH_API_INCLUDE_EXTENSION_H",
                   "-std=c++17",  # not -DTORCH_EXTENSION_NAME: per extension, and no header reads it
                   "-E", "-Wfatal-errors", "-x", "c++", "/w/probe/imagegen_probe.cpp", "-o", "/w/probe/p0.out"]
    full = probe.probe_command("host", HOST, "/w/probe/imagegen_probe.cpp", "/w/probe/p0.out", "full")
    assert full[-5:] == ["-fsyntax-only", "-Wfatal-errors", "-x", "c++", "/w/probe/imagegen_probe.cpp"]
    assert "-o" not in full and "-c" not in full


def test_an_nvcc_compile_keeps_its_flags_but_no_target():
    cmd = probe.probe_command("nvcc", NVCC, "/w/probe/imagegen_probe.cu", "/w/probe/p1.out", stubs=STUBS)
    assert cmd == [*INC, "-D__CUDA_NO_HALF_OPERATORS__", "--expt-relaxed-constexpr", "--compiler-options", "'-fPIC'",
                   "-O3", "-Xcompiler", "-fno-strict-aliasing", "-std=c++17", "--threads", "4",
                   "-ccbin", "/usr/bin/gcc",  # the C stand-in torch handed nvcc -> the real compiler
                   "-Xcompiler=-Wfatal-errors", "-E", "-x", "cu", "/w/probe/imagegen_probe.cu", "-o", "/w/probe/p1.out"]
    full = probe.probe_command("nvcc", NVCC, "/w/probe/imagegen_probe.cu", "/w/probe/p1.out", "full", STUBS)
    assert full[-10:] == ["-ccbin", "/usr/bin/gcc", "-Xcudafe", "--error_limit=1", "-c", "-x", "cu",
                          "/w/probe/imagegen_probe.cu", "-o", "/w/probe/p1.out"]
    assert not any("arch" in a or "code=" in a for a in full)


@pytest.mark.parametrize("argv, want", [
    (["-O3", "-c", "a.cpp", "-oa.o", "-MFa.d", "-Wp,-MD,a.d", "-Ifoo"], ["-O3", "-Ifoo"]),
    (["--output-file=a.o", "--dependency-output=a.d", "-x", "cu", "-dc", "a.cu", "-DX=1"], ["-DX=1"]),
    (["-arch=sm_86", "-code", "sm_86", "--gpu-architecture", "compute_86", "-Xptxas", "-v"], ["-Xptxas", "-v"]),
    (["-ccbin=/w/stubs/cc", "-std", "c++20"], ["-ccbin=/usr/bin/gcc", "-std", "c++20"]),
    (["-DTORCH_EXTENSION_NAME=_C", "-D", "TORCH_EXTENSION_NAME=_C", "-DX"], ["-DX"]),
    (["-isystem", "/x/include", "-include", "pre.h", "-odir", "/w/o", "-opt-info", "inline"],
     ["-isystem", "/x/include", "-include", "pre.h", "-opt-info", "inline"]),
])
def test_probe_flags_drop_what_the_probe_replaces(argv, want):
    assert probe.probe_flags(argv, STUBS) == want


@pytest.mark.parametrize("tool, argv, kind", [
    ("cxx", ["-c", "a.cpp", "-o", "a.o"], "host"),
    ("cc", ["-c", "a.cc", "-o", "a.o"], "host"),  # setuptools compiles C++ with $CC
    ("cc", ["-c", "a.c", "-o", "a.o"], None),  # C: torch's headers are C++
    ("cxx", ["-x", "c++", "-c", "a.inc", "-o", "a.o"], "host"),
    ("cxx", ["/c", "a.cpp", "/Foa.obj", "/std:c++17"], None),  # MSVC's spelling
    ("nvcc", ["-c", "a.cu", "-o", "a.o"], "nvcc"),
    ("ld", ["a.o", "-o", "x.so"], None),
    ("cxx", ["-shared", "a.o", "-o", "x.so"], None),
])
def test_what_is_probed(tool, argv, kind):
    assert probe.probe_kind(tool, argv) == kind


def rec(tool, argv):
    return {"tool": tool, "cwd": BUILD, "argv": list(argv)}


def link(module, *objs):
    return rec("ld", ["-shared", *objs, "-o", f"{SRC}/build/lib.linux-x86_64-cpython-311/pkg/{module}.cpython-311-x86_64-linux-gnu.so"])


def host_of(src, *extra):
    return rec("cxx", ["-MMD", "-MF", f"{BUILD}/{src}.o.d", *INC, "-c", f"{SRC}/{src}.cpp", "-o", f"{BUILD}/{src}.o", *extra])


def nvcc_of(src, *extra):
    return rec("nvcc", [*INC, "-c", f"{SRC}/{src}.cu", "-o", f"{BUILD}/{src}.o", *extra])


@pytest.fixture()
def torch_headers(monkeypatch):
    """The records' include paths need not exist: every compile counts as one of torch's headers."""
    monkeypatch.setattr(probe, "has_torch_headers", lambda argv, cwd: True)


def test_only_compiles_with_torchs_include_folder_are_probed(tmp_path):
    (tmp_path / "site" / "torch" / "include" / "torch").mkdir(parents=True)
    (tmp_path / "site" / "torch" / "include" / "torch" / "extension.h").write_text("")
    assert probe.has_torch_headers(["-c", "a.cpp", f"-I{tmp_path}/site/torch/include"], "/")
    assert probe.has_torch_headers(["-isystem", "site/torch/include"], str(tmp_path))  # relative to the compile's folder
    assert not probe.has_torch_headers(["-I/usr/include/python3.11", "-c", "a.cpp"], "/")
    records = [rec("cxx", ["-I/usr/include", "-c", f"{SRC}/plain.cpp", "-o", f"{BUILD}/plain.o"]),
               link("_plain", f"{BUILD}/plain.o")]
    section, per_module = probe.run_probes(records, ENV, str(tmp_path), runner=Runner())
    assert section["runs"] == [] and per_module == {}


class Runner:
    """Stands in for the compilers: answers each probe from ``answers`` (substring of the arguments ->
    (exit status, output)), exit 0 otherwise; remembers what it ran."""

    def __init__(self, answers=None):
        self.answers = answers or {}
        self.ran = []

    def __call__(self, cmd, args, cwd, env):
        self.ran.append((cmd, args))
        for needle, (rc, text) in self.answers.items():
            if needle in " ".join(args):
                return rc, text, 0.5
        return 0, "", 0.5


ENV = {audit.REAL_ENV: json.dumps({"nvcc": ["/usr/local/cuda/bin/nvcc"], "cxx": ["g++"], "cc": ["gcc"]})}


def test_extensions_with_identical_flags_are_probed_once(tmp_path, torch_headers):
    same = ("-std=c++20", "-O3")
    # SageAttention's layout: one extension per arch family, the same flags but their targets
    records = [host_of("a", *same, "-DTORCH_EXTENSION_NAME=_a"),
               nvcc_of("ka", "-gencode=arch=compute_80,code=sm_80", *same, "-DTORCH_EXTENSION_NAME=_a"),
               host_of("b", *same, "-DTORCH_EXTENSION_NAME=_b"),
               nvcc_of("kb", "-gencode=arch=compute_90a,code=sm_90a", *same, "-DTORCH_EXTENSION_NAME=_b"),
               host_of("c", "-std=c++17"),
               link("_a", f"{BUILD}/a.o", f"{BUILD}/ka.o"), link("_b", f"{BUILD}/b.o", f"{BUILD}/kb.o"),
               link("_c", f"{BUILD}/c.o")]
    runner = Runner()
    section, per_module = probe.run_probes(records, ENV, str(tmp_path), runner=runner)
    # a and b: the same host flags (their sources and outputs differ) and the same nvcc flags
    assert [(r["tool"], r["modules"]) for r in section["runs"]] == [
        ("cxx", ["pkg._a", "pkg._b"]), ("nvcc", ["pkg._a", "pkg._b"]), ("cxx", ["pkg._c"])]
    assert len(runner.ran) == 3 and runner.ran[0][0] == ["g++"] and runner.ran[1][0] == ["/usr/local/cuda/bin/nvcc"]
    assert section["mode"] == "on" and section["not_probed"] == 0
    assert per_module["pkg._a"] == per_module["pkg._b"] == [
        {"compiler": "g++", "tool": "cxx", "what": "preprocess", "seconds": 0.5, "ok": True, "error": ""},
        {"compiler": "nvcc", "tool": "nvcc", "what": "preprocess", "seconds": 0.5, "ok": True, "error": ""}]
    assert (tmp_path / "probe" / "imagegen_probe.cu").read_text().startswith(
        "#include <torch/extension.h>\n#include <ATen/cuda/CUDAContext.h>\n")


def test_extensions_built_in_folders_of_their_own_share_a_probe_when_their_flags_mean_the_same(tmp_path, torch_headers):
    # SageAttention 2.2 with EXT_PARALLEL: each extension compiles in its own build folder, with the
    # same flags; 8 probes became 2. A relative include folder is read against each compile's folder.
    def at(cwd, r):
        return dict(r, cwd=cwd)
    same = ("-std=c++20", f"-I{SRC}/csrc")
    records = [at(f"{BUILD}/a", host_of("a", *same, "-isystem", "../../third")),
               at(f"{BUILD}/b", host_of("b", *same, "-isystem", "../../third")),
               at(f"{BUILD}/a", nvcc_of("ka", *same, "--include-path=../inc")),
               at(f"{BUILD}/b", nvcc_of("kb", *same, "--include-path=../inc")),
               at(f"{BUILD}/c/d", nvcc_of("kc", *same, "--include-path=../inc")),  # ../inc is elsewhere here
               at(f"{BUILD}/a", host_of("e", *same, "@flags.rsp")),
               at(f"{BUILD}/b", host_of("f", *same, "@flags.rsp")),  # its own flags file: its own probe
               link("_a", f"{BUILD}/a.o", f"{BUILD}/ka.o"), link("_b", f"{BUILD}/b.o", f"{BUILD}/kb.o"),
               link("_c", f"{BUILD}/kc.o"), link("_e", f"{BUILD}/e.o"), link("_f", f"{BUILD}/f.o")]
    runner = Runner()
    section, _ = probe.run_probes(records, ENV, str(tmp_path), runner=runner)
    assert [(r["tool"], r["modules"]) for r in section["runs"]] == [
        ("cxx", ["pkg._a", "pkg._b"]), ("nvcc", ["pkg._a", "pkg._b"]), ("nvcc", ["pkg._c"]),
        ("cxx", ["pkg._e"]), ("cxx", ["pkg._f"])]
    assert len(runner.ran) == 5
    assert runner.ran[0][1][len(INC):len(INC) + 4] == ["-std=c++20", f"-I{SRC}/csrc", "-isystem", "../../third"]  # as recorded


@pytest.mark.parametrize("argv, stable", [
    (["-DTORCH_TARGET_VERSION=0x0209000000000000"], True),  # flash-attn-3's flash_api_stable.cpp, torch >= 2.9
    (["-D", "TORCH_TARGET_VERSION=0x020a000000000000"], True),
    (["-DTORCH_STABLE_ONLY"], True),
    (["--define-macro", "TORCH_STABLE_ONLY"], True), (["--define-macro=TORCH_TARGET_VERSION=1"], True),
    (["-DTORCH_API_INCLUDE_EXTENSION_H", "-DTORCH_EXTENSION_NAME=_C"], False),
    (["-DTORCH_TARGET_VERSION_X=1", "-UTORCH_STABLE_ONLY"], False),
    (["-D"], False),
])
def test_a_stable_abi_compile_is_told_by_its_defines(argv, stable):
    assert audit_records.stable_abi(["-O3", *argv]) is stable


def test_a_stable_abi_compile_is_probed_with_the_stable_headers(tmp_path, torch_headers):
    # flash-attn-3 3.0.0 with torch 2.11 on the H100 (docs/records/gpu-results/2026-11-27-fa3): flash_api_stable.cpp
    # compiles with -DTORCH_TARGET_VERSION, and torch/extension.h #errors on that define by design, so the
    # probe of torch/extension.h refused a wheel that then built and passed its check.
    stable = ("-DTORCH_TARGET_VERSION=0x0209000000000000", "-std=c++17")
    records = [host_of("flash_api_stable", *stable), nvcc_of("k", "-std=c++17"), host_of("other", "-std=c++17"),
               link("_C", f"{BUILD}/flash_api_stable.o", f"{BUILD}/k.o", f"{BUILD}/other.o")]
    runner = Runner()
    probe.run_probes(records, ENV, str(tmp_path), runner=runner)
    units = [args[args.index("-x") + 2] for _, args in runner.ran]
    assert [u.rsplit("/", 1)[-1] for u in units] == ["imagegen_probe_stable.cpp", "imagegen_probe.cu", "imagegen_probe.cpp"]
    assert (tmp_path / "probe" / "imagegen_probe_stable.cpp").read_text() == (
        '#include <torch/csrc/stable/library.h>\nstatic_assert(false, "imagegen-probe: end of the headers");\n')


@pytest.mark.skipif(not shutil.which("g++"), reason="needs g++")
def test_the_stable_probe_passes_where_torch_extension_h_stops_at_its_error(tmp_path):
    # torch 2.11's guard, verbatim in its first and 13th lines: the real g++ on the real probe units
    inc = tmp_path / "site" / "torch" / "include"
    (inc / "torch" / "csrc" / "stable").mkdir(parents=True)
    (inc / "torch" / "extension.h").write_text(
        "#if !defined(TORCH_STABLE_ONLY) && !defined(TORCH_TARGET_VERSION)\n#else\n#error \"This file should not be"
        " included when either TORCH_STABLE_ONLY or TORCH_TARGET_VERSION is defined.\"\n#endif\n")
    (inc / "torch" / "csrc" / "stable" / "library.h").write_text("#pragma once\n")
    build = tmp_path / "build"
    build.mkdir()
    argv = [f"-I{inc}", "-DTORCH_TARGET_VERSION=0x0209000000000000", "-std=c++17", "-c", f"{SRC}/flash_api_stable.cpp",
            "-o", f"{build}/flash_api_stable.o"]
    plain = [f"-I{inc}", "-std=c++17", "-c", f"{SRC}/other.cpp", "-o", f"{build}/other.o"]
    records = [{"tool": "cxx", "cwd": str(build), "argv": argv}, {"tool": "cxx", "cwd": str(build), "argv": plain},
               link("_C", f"{build}/flash_api_stable.o", f"{build}/other.o")]
    env = {audit.REAL_ENV: json.dumps({"cxx": [shutil.which("g++")]})}
    section, _ = probe.run_probes(records, env, str(tmp_path / "work"))
    stable_run, plain_run = section["runs"]
    assert stable_run["ok"] is True and stable_run["error"] == ""
    # the same headers, probed without the define: torch/extension.h is fine
    assert plain_run["ok"] is True
    # and torch/extension.h with the define is what the probe used to compile: the #error
    rc, text, _ = probe._run_probe([shutil.which("g++")], probe.probe_command(
        "host", argv, str(tmp_path / "work" / "probe" / "imagegen_probe.cpp"), str(tmp_path / "x.out")), str(build), {})
    assert rc != 0 and "TORCH_STABLE_ONLY or TORCH_TARGET_VERSION" in text


def test_the_number_of_probes_is_bounded(tmp_path, torch_headers):
    records = [host_of(f"s{i}", f"-DV={i}") for i in range(5)] + [link("_x", *(f"{BUILD}/s{i}.o" for i in range(5)))]
    section, _ = probe.run_probes(records, ENV, str(tmp_path), runner=Runner(), limit=3)
    assert len(section["runs"]) == 3 and section["not_probed"] == 2


STD_ERROR = ("/site/torch/include/torch/csrc/api/include/torch/all.h:5:2: error: #error C++20 or later compatible"
             " compiler is required to use PyTorch.")
CUSPARSE = "/site/torch/include/ATen/cuda/CUDAContextLight.h:10:10: fatal error: cusparse.h: No such file or directory"


def test_a_failed_probe_reports_the_first_error_line_from_the_headers_path(tmp_path, torch_headers):
    records = [host_of("a", "-std=c++17"), nvcc_of("k", "-std=c++20"), link("_a", f"{BUILD}/a.o", f"{BUILD}/k.o")]
    runner = Runner({"-std=c++17": (1, f"In file included from x.h:1,\n{STD_ERROR}\n    5 | #error C++20\ncompilation terminated due to -Wfatal-errors.\n"),
                     "-std=c++20": (1, f"{CUSPARSE}\ncompilation terminated.\n")})
    section, per_module = probe.run_probes(records, ENV, str(tmp_path), runner=runner)
    host, nvcc = per_module["pkg._a"]
    assert not host["ok"] and host["error"] == ("torch/csrc/api/include/torch/all.h:5:2: error: #error C++20 or later"
                                                 " compatible compiler is required to use PyTorch.")
    assert not nvcc["ok"] and nvcc["error"] == ("ATen/cuda/CUDAContextLight.h:10:10: fatal error: cusparse.h: No such"
                                                 " file or directory")


@pytest.mark.parametrize("rc, text, ok", [
    (0, "", True),
    # parsing (IMAGEGEN_AUDIT_PROBE=full): the static_assert after the headers is the only error
    (1, 'p.cpp:2:15: error: static assertion failed: imagegen-probe: end of the headers\ncompilation terminated.', True),
    (2, 'p.cu(3): error: static assertion failed with "imagegen-probe: end of the headers"\nError limit reached.', True),
    (2, 'x.h(40): error: identifier "foo" is undefined\nError limit reached.', False),
    (1, "nvcc fatal   : Unsupported gpu architecture 'compute_70'", False),
    (1, "something went wrong", False),
])
def test_probe_outcome(rc, text, ok):
    assert probe._probe_outcome(rc, text, ())[0] is ok


def test_first_error_reads_gcc_nvcc_and_edg_lines():
    assert probe.first_error("warning: x\nx.h(40): error: identifier \"foo\" is undefined\n") \
        == 'x.h(40): error: identifier "foo" is undefined'
    assert probe.first_error("nvcc fatal   : Value 'c++99' is not defined for option 'std'") \
        == "nvcc fatal   : Value 'c++99' is not defined for option 'std'"
    assert probe.first_error("In file included from a.h:3,\n                 from b.h:4:\n") == ""
    assert probe.first_error("g++: error: unrecognized command-line option '-fbogus'") \
        == "g++: error: unrecognized command-line option '-fbogus'"
    assert probe.first_error("cc1plus: warning: x\nx.h:3:1: note: error here") == ""
    assert probe.first_error(STD_ERROR, ["/site/torch/include", "/site/torch/include/torch/csrc/api/include"]) \
        .startswith("torch/csrc/api/include/torch/all.h:5:2: error: #error")


def test_the_compiler_is_named_past_its_ccache_wrapper():
    assert probe._compiler_name("cxx", {"cxx": ["/usr/bin/ccache", "g++-12"]}) == "g++-12"
    assert probe._compiler_name("nvcc", {"nvcc": ["/usr/local/cuda/bin/nvcc"]}) == "nvcc"
    assert probe._compiler_name("cc", {}) == "cc"


def test_a_compiler_that_cannot_run_is_not_a_failure(tmp_path, torch_headers):
    records = [host_of("a"), link("_a", f"{BUILD}/a.o")]
    env = {audit.REAL_ENV: json.dumps({"cxx": ["/nonexistent/g++"]})}
    section, per_module = probe.run_probes(records, env, str(tmp_path))
    assert per_module["pkg._a"][0]["ok"] is None and "cannot run /nonexistent/g++" in per_module["pkg._a"][0]["error"]


@pytest.mark.parametrize("value, mode", [("", "on"), ("1", "on"), ("0", "off"), ("off", "off"), ("no", "off"),
                                         ("full", "full"), ("FULL", "full")])
def test_the_switch(value, mode):
    assert probe.probe_mode({probe.PROBE_ENV: value} if value else {}) == mode


def test_add_probe_off_runs_nothing(tmp_path):
    report = {"extensions": [{"module": "pkg._a"}]}
    probe.add_probe(report, [host_of("a"), link("_a", f"{BUILD}/a.o")], {probe.PROBE_ENV: "0"}, str(tmp_path))
    assert report["probe"] == {"mode": "off", "seconds": 0.0, "runs": [], "not_probed": 0}
    assert "probe" not in report["extensions"][0]


def test_the_audit_step_has_a_no_probe_switch():
    text = (BUILDER / "imagegen_build.py").read_text()
    assert '"--no-probe"' in text and '"off" if args.no_probe else None' in text


# --------------------------------------------------------------------------------------------
# The judgement


def probed(*exts, mode="on", seconds=2.5):
    return AuditReport.from_json({
        "ok": True, "exit": 0, "seconds": 6.0, "probe": {"mode": mode, "seconds": seconds},
        "extensions": [{"module": m, "sass": ["sm_90"], "ptx": [], "probe": p} for m, p in exts]})


def run_of(compiler, ok, error=""):
    return {"compiler": compiler, "tool": {"g++": "cxx"}.get(compiler, compiler), "what": "preprocess", "ok": ok,
            "error": error, "seconds": 1.2}


def verdict(report):
    return judge(report, recipe_name="pkg", version_label="1.0", requested=parse_arch_list("9.0"), nvcc=Version("13.0"))


def test_the_judgement_refuses_with_the_compilers_first_error_line_and_the_fix():
    std = "torch/csrc/api/include/torch/all.h:5:2: error: #error C++20 or later compatible compiler is required to use PyTorch."
    v = verdict(probed(("pkg._a", [run_of("g++", False, std), run_of("nvcc", False, std)]),
                       ("pkg._b", [run_of("g++", False, std)])))
    assert not v.ok
    assert v.refusals == (
        f"pkg._a, pkg._b: torch's headers do not compile with g++ and the build's own flags (header probe): {std};"
        " build with -std=c++20 (a recipe fix: by_torch patch, or the package's release that picks the standard from"
        " torch) (IMAGEGEN_AUDIT_PROBE=0 skips the probe)",
        f"pkg._a: torch's headers do not compile with nvcc and the build's own flags (header probe): {std};"
        " build with -std=c++20 (a recipe fix: by_torch patch, or the package's release that picks the standard from"
        " torch) (IMAGEGEN_AUDIT_PROBE=0 skips the probe)")
    ext = v.as_dict()["extensions"][0]
    assert ext["probe"][0] == {"compiler": "g++", "what": "preprocess", "ok": False, "error": std, "seconds": 1.2}
    assert v.as_dict()["probe"] == {"mode": "on", "seconds": 2.5}


def test_the_judgement_names_the_missing_toolkit_header():
    error = "ATen/cuda/CUDAContextLight.h:10:10: fatal error: cusparse.h: No such file or directory"
    v = verdict(probed(("pkg._a", [run_of("g++", True), run_of("nvcc", False, error)])))
    assert v.refusals == (f"pkg._a: torch's headers do not compile with nvcc and the build's own flags (header probe):"
                          f" {error}; the CUDA toolkit (CUDA_HOME) has no cusparse.h: install its cusparse headers (the"
                          " toolkit's cusparse development package, or the nvidia-cusparse wheel's include/ on the"
                          " include path) (IMAGEGEN_AUDIT_PROBE=0 skips the probe)",)
    assert probe_fix('x.h(3): catastrophic error: cannot open source file "cublasLt.h"').startswith(
        "the CUDA toolkit (CUDA_HOME) has no cublasLt.h: install its cublas headers")
    assert probe_fix("mylib/foo.h:1:10: fatal error: foo.h: No such file or directory") \
        == "foo.h is not on the include path: install what provides it"
    assert probe_fix("x.h(40): error: identifier \"foo\" is undefined") == ""


def test_a_missing_cuda_header_the_package_never_includes_is_a_warning():
    error = "ATen/cuda/CUDAContextLight.h:10:10: fatal error: cusparse.h: No such file or directory"
    r = probed(("pkg._a", [run_of("g++", True), run_of("nvcc", False, error)]))
    for aten_cuda, refused in ((True, True), (None, True), (False, False)):
        report = AuditReport.from_json({"ok": True, "exit": 0, "seconds": 6.0,
                                        "probe": {"mode": "on", "seconds": 2.5, "aten_cuda_included": aten_cuda},
                                        "extensions": [{"module": "pkg._a", "sass": ["sm_90"], "probe": [
                                            run_of("g++", True), run_of("nvcc", False, error)]}]})
        v = verdict(report)
        assert (not v.ok) is refused, aten_cuda
        if not refused:
            assert v.warnings == (f"pkg._a: ATen/cuda/CUDAContext.h does not compile with nvcc and the build's own flags"
                                  f" (header probe): {error}; the CUDA toolkit (CUDA_HOME) has no cusparse.h: install its"
                                  " cusparse headers (the toolkit's cusparse development package, or the nvidia-cusparse"
                                  " wheel's include/ on the include path); the package's sources include no ATen/cuda/"
                                  " header, so its build may not need it",)
    assert not verdict(r).ok  # a report without the answer: as if they did


def test_includes_aten_cuda_reads_the_source_tree(tmp_path):
    (tmp_path / "csrc").mkdir()
    (tmp_path / "csrc" / "k.cu").write_text("#include <torch/extension.h>\n")
    (tmp_path / "README.md").write_text("uses ATen/cuda/CUDAContext.h")  # not code
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "gen.h").write_text("#include <ATen/cuda/CUDAContext.h>")  # build output: skipped
    assert probe.includes_aten_cuda(str(tmp_path)) is False
    (tmp_path / "csrc" / "util.cuh").write_text('#include "ATen/cuda/CUDAContext.h"\n')
    assert probe.includes_aten_cuda(str(tmp_path)) is True
    assert probe.includes_aten_cuda(str(tmp_path / "nope")) is None
    assert probe.includes_aten_cuda(str(tmp_path), max_files=1) is True  # too big to read: the strict answer


def test_a_passing_skipped_or_unrun_probe_does_not_refuse():
    v = verdict(probed(("pkg._a", [run_of("g++", True), run_of("nvcc", True)])))
    assert v.ok and v.notes == ("header probe: torch's headers preprocessed with the flags of 1 extension(s) in 2.5 s",)
    v = verdict(probed(("pkg._a", []), mode="off", seconds=0))
    assert v.ok and v.notes == ("header probe skipped (IMAGEGEN_AUDIT_PROBE=0)",)
    v = verdict(probed(("pkg._a", [run_of("nvcc", None, "timed out after 240 s")])))
    assert v.ok and "header probe with nvcc for pkg._a did not run: timed out after 240 s" in v.notes
    # a report written before the probe existed: nothing said
    old = AuditReport.from_json({"ok": True, "exit": 0, "seconds": 1.0,
                                 "extensions": [{"module": "pkg._a", "sass": ["sm_90"], "ptx": []}]})
    assert verdict(old).ok and verdict(old).notes == () and "probe" not in verdict(old).as_dict()


def test_a_hostile_probe_section_is_bounded():
    runs = [{"compiler": "x" * 10_000, "ok": "yes", "error": ["no"], "seconds": "slow"}] * 100
    r = AuditReport.from_json({"ok": True, "exit": 0, "seconds": 1.0, "probe": "nope",
                               "extensions": [{"module": "m", "sass": ["sm_90"], "probe": runs}]})
    assert len(r.extensions[0].probe) == 20 and r.extensions[0].probe[0].ok is None
    assert len(r.extensions[0].probe[0].compiler) <= 300 and r.probe_mode == ""


def test_the_build_phases_are_read_from_the_records_timestamps():
    records = [{"t": 103.0}, {"t": 101.5}, {"t": 104.25}, {"tool": "nvcc"}]
    assert audit_records.phases(records, 100.0, 110.0) == {"records": 3, "before": 1.5, "compiles": 2.75, "after": 5.75}
    assert audit_records.phases([], 100.0, 102.5) == {"records": 0, "before": 2.5, "compiles": 0.0, "after": 0.0}
