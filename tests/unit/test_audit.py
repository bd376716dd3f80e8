"""The gencode audit's parts that need no torch: the stand-in compiler (a real subprocess), reading
nvcc command lines, folding records into extensions, and the judgement. The whole audit, run on real
setup.py projects with a real torch, is in tests/integration/test_audit.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.version import Version

from imagegen.model.audit import judge, probe_fix

from imagegen.model.audit_report import AuditReport
from imagegen.model import compat
from imagegen.model.arch_parse import parse_arch_list

ROOT = Path(__file__).resolve().parents[2]
BUILDER = ROOT / "imagegen" / "shipped" / "builder"
sys.path.insert(0, str(BUILDER))
import imagegen_audit  # noqa: E402  (stdlib-only script shipped beside imagegen_build.py)
import imagegen_audit_records  # noqa: E402  (what reads the stand-ins' records)


@pytest.mark.parametrize("argv, want", [
    (["-gencode", "arch=compute_90a,code=sm_90a"], [("sass", "sm_90a")]),
    (["-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_120,code=compute_120"],
     [("sass", "sm_80"), ("ptx", "compute_120")]),
    (["--generate-code=arch=compute_80,code=[sm_80,compute_80]"], [("sass", "sm_80"), ("ptx", "compute_80")]),
    (["-arch=sm_86"], [("sass", "sm_86"), ("ptx", "compute_86")]),
    (["-arch", "compute_75"], [("ptx", "compute_75")]),
    (["-arch=compute_90", "-code=sm_90,compute_90"], [("sass", "sm_90"), ("ptx", "compute_90")]),
    (["-arch=native"], [("special", "native")]),
    (["-O3", "-c", "x.cu"], [("default", "")]),
    (["-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_80,code=sm_80"], [("sass", "sm_80")]),
])
def test_nvcc_targets_reads_every_form(argv, want):
    assert imagegen_audit_records.nvcc_targets(argv) == want


def run_stub(tmp_path, tool, *argv, real=None, version=None):
    log = tmp_path / "records.jsonl"
    env = dict(os.environ, IMAGEGEN_AUDIT_LOG=str(log), IMAGEGEN_AUDIT_REAL=json.dumps(real or {}))
    if version:
        env["IMAGEGEN_AUDIT_NVCC_VERSION"] = version
    proc = subprocess.run([sys.executable, str(BUILDER / "imagegen_audit.py"), "stub", tool, *argv], cwd=tmp_path,
                          env=env, capture_output=True, text=True)
    records = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return proc, records


def test_the_stand_in_records_and_writes_what_ninja_expects(tmp_path):
    proc, records = run_stub(tmp_path, "nvcc", "--generate-dependencies-with-compile", "--dependency-output", "obj/a.o.d",
                             "-c", "csrc/a.cu", "-o", "obj/a.o", "-gencode", "arch=compute_90a,code=sm_90a")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "obj" / "a.o").read_bytes() == b""
    assert (tmp_path / "obj" / "a.o.d").read_text().startswith("obj/a.o:")
    assert len(records) == 1 and records[0]["tool"] == "nvcc" and "arch=compute_90a,code=sm_90a" in records[0]["argv"]
    # gcc-style dependency files too (torch's ninja rule for .cpp: -MMD -MF $out.d).
    proc, _ = run_stub(tmp_path, "cxx", "-MMD", "-MF", "obj/b.o.d", "-c", "b.cpp", "-o", "obj/b.o")
    assert proc.returncode == 0 and (tmp_path / "obj" / "b.o.d").exists()


def test_the_stand_in_hands_queries_to_the_real_tool(tmp_path):
    # A query produces nothing: the real tool answers it, and nothing is recorded.
    proc, records = run_stub(tmp_path, "cxx", "--version", real={"cxx": ["/bin/echo", "real-c++"]})
    assert proc.stdout.strip() == "real-c++ --version" and records == []
    # No real nvcc (auditing away from a toolkit): `nvcc -V` answers with the cell's version.
    proc, _ = run_stub(tmp_path, "nvcc", "-V", version="12.8")
    assert proc.returncode == 0 and "release 12.8, V12.8.0" in proc.stdout


def test_fold_attributes_compiles_to_the_extension_that_links_them(tmp_path):
    src = str(tmp_path / "src")
    build = f"{src}/build/temp"
    rec = lambda tool, *argv: {"tool": tool, "cwd": build, "argv": list(argv)}  # noqa: E731
    records = [
        rec("nvcc", "-c", f"{src}/csrc/all.cu", "-o", f"{build}/all.o", "-gencode", "arch=compute_80,code=sm_80",
            "-gencode", "arch=compute_90a,code=sm_90a", "-O3", "-I/x"),
        rec("cxx", "-c", f"{src}/csrc/bind.cpp", "-o", f"{build}/bind.o"),
        rec("nvcc", "-c", f"{src}/csrc/hopper.cu", "-o", f"{build}/hopper.o", "-gencode", "arch=compute_90a,code=sm_90a"),
        rec("ld", "-shared", f"{build}/all.o", f"{build}/bind.o", "-o", f"{src}/build/lib.linux-x86_64-cpython-311/pkg/_all.cpython-311-x86_64-linux-gnu.so"),
        rec("ld", "-shared", f"{build}/hopper.o", "-o", f"{src}/build/lib.linux-x86_64-cpython-311/pkg/_hopper.cpython-311-x86_64-linux-gnu.so"),
        rec("nvcc", "-c", f"{src}/tools/probe.cu", "-o", f"{build}/probe.o", "-arch=sm_75"),
    ]
    out = imagegen_audit_records.fold(records, src)
    exts = {e["module"]: e for e in out["extensions"]}
    assert set(exts) == {"pkg._all", "pkg._hopper"}
    assert exts["pkg._all"]["sass"] == ["sm_80", "sm_90a"] and exts["pkg._all"]["sources"] == ["csrc/all.cu", "csrc/bind.cpp"]
    assert exts["pkg._all"]["nvcc_flags"] == ["-O3"]
    assert exts["pkg._hopper"]["sass"] == ["sm_90a"]
    assert [e["source"] for e in out["unlinked_cuda_compiles"]] == ["tools/probe.cu"]


def report(*exts, ok=True, error_lines=()):
    return AuditReport.from_json({"ok": ok, "exit": 0 if ok else 1, "seconds": 1.0, "error_lines": list(error_lines),
                                  "extensions": [{"module": m, "sass": s, "ptx": p} for m, s, p in exts]})


def test_judge_refuses_a_kernel_compiled_for_an_arch_it_cannot_target():
    r = report(("sageattention._qattn_sm80", ["sm_80", "sm_90a", "sm_120"], ["compute_120"]),
               ("sageattention._qattn_sm90", ["sm_80", "sm_90a", "sm_120"], ["compute_120"]))
    v = judge(r, recipe_name="sageattention", version_label="2.2.0", requested=parse_arch_list("8.0;9.0a;12.0+PTX"),
              nvcc=Version("13.0"), extension_archs={"sageattention._qattn_sm90": parse_arch_list("9.0a")})
    assert not v.ok and len(v.refusals) == 1
    assert "_qattn_sm90 would be compiled for sm_80, sm_120, compute_120" in v.refusals[0]
    routed = report(("sageattention._qattn_sm80", ["sm_80", "sm_90a", "sm_120"], ["compute_120"]),
                    ("sageattention._qattn_sm90", ["sm_90a"], []))
    v = judge(routed, recipe_name="sageattention", version_label="2.2.0", requested=parse_arch_list("8.0;9.0a;12.0+PTX"),
              nvcc=Version("13.0"), extension_archs={"sageattention._qattn_sm90": parse_arch_list("9.0a")})
    assert v.ok and not v.warnings, (v.refusals, v.warnings)  # _qattn_sm90 lacking sm_80 is right, not missing


def test_judge_a_hard_coded_list_seed_003():
    r = report(("k._C", ["sm_70", "sm_80", "sm_86"], []))
    v = judge(r, recipe_name="k", version_label="0.3.0", requested=parse_arch_list("9.0"), nvcc=Version("13.0"))
    assert any("sm_70 was dropped in CUDA 13.0" in x for x in v.refusals)
    assert any("no extension would carry sm_90" in x for x in v.refusals)
    assert any("compiles sm_70, sm_80, sm_86, not requested" in x for x in v.warnings)
    # The same list on CUDA 12.8 for --arch 8.0: buildable, with the unrequested archs named.
    v = judge(r, recipe_name="k", version_label="0.3.0", requested=parse_arch_list("8.0"), nvcc=Version("12.8"))
    assert v.ok and v.warnings == ("k._C compiles sm_70, sm_86, not requested: a hard-coded arch list that ignores --arch",)


def test_judge_warns_about_an_extension_missing_an_arch_the_others_carry():
    r = report(("p._a", ["sm_80", "sm_90"], []), ("p._b", ["sm_80"], []))
    v = judge(r, recipe_name="p", version_label="1", requested=parse_arch_list("8.0;9.0"), nvcc=Version("12.8"))
    assert v.ok and v.warnings == ("p._b would not carry sm_90 (requested); p._a would",)


def test_judge_a_family_cubin_covers_its_minor_versions():
    # flash-attn's sm_80 cubin runs on 8.6: a request the plan mapped is carried.
    v = judge(report(("flash_attn_2_cuda", ["sm_80", "sm_90"], [])), recipe_name="flash-attn", version_label="2.8.3",
              requested=parse_arch_list("8.6;9.0"), nvcc=Version("12.8"))
    assert v.ok and not v.refusals


def test_judge_refuses_a_cpu_only_build_and_a_build_that_stops():
    v = judge(report(("xformers._C", [], [])), recipe_name="xformers", version_label="0.0.35",
              requested=parse_arch_list("9.0"), nvcc=Version("12.8"), force_hint="the recipe sets FORCE_CUDA=1")
    assert not v.ok and "compiles no CUDA code" in v.refusals[0] and "FORCE_CUDA=1" in v.refusals[0]
    lines = ["error: subprocess-exited-with-error", "RuntimeError: CUDA 12.8 or higher is required for compute capability 12.0.",
             "error: metadata-generation-failed"]
    v = judge(report(ok=False, error_lines=lines), recipe_name="sageattention", version_label="2.2.0",
              requested=parse_arch_list("12.0"), nvcc=Version("12.6"))
    assert not v.ok and "RuntimeError: CUDA 12.8 or higher is required for compute capability 12.0." in v.refusals[0]


def test_a_cmake_error_is_the_reason_with_its_message_and_what_to_do():
    # Real output (NATTEN 0.21.6 + its C++20 patch at torch 2.14.1 with Debian's CMake 3.25.1, 2026-11-29): the
    # reason is on the indented lines under "CMake Error"; setup.py's CalledProcessError only says cmake failed.
    from tests.unit.builder_script import builder_module
    text = (ROOT / "tests" / "fixtures" / "audit" / "natten-cmake-3.25-cuda20.txt").read_text()
    lines = builder_module("imagegen_build")._error_lines(text)
    assert lines[0] == ('CMake Error in CMakeLists.txt: Target "natten" requires the language dialect "CUDA20" (with'
                        ' compiler extensions). But the current compiler "NVIDIA" does not support this, or CMake does'
                        ' not know the flags to enable it.')
    v = judge(report(ok=False, error_lines=lines), recipe_name="natten", version_label="0.21.6",
              requested=parse_arch_list("9.0a"), nvcc=Version("13.0"))
    (why,) = v.refusals
    assert ('natten 0.21.6: its own build stops before compiling anything (exit 1): CMake: language dialect "CUDA20"'
            " unknown to this CMake (nvcc's C++20 flag came in CMake 3.26): put CMake 3.26 or newer first on PATH") in why
    assert "CalledProcessError" not in why
    other = ["CMake Error at CMakeLists.txt:3 (project): No CMAKE_CUDA_COMPILER could be found."]
    v = judge(report(ok=False, error_lines=other), recipe_name="x", version_label="1", requested=parse_arch_list("9.0"),
              nvcc=Version("13.0"))
    assert v.refusals[0].endswith("No CMAKE_CUDA_COMPILER could be found. (this is the package's build with the flags"
                                  " imagegen would pass; --no-audit skips the audit)")


# ------------------------------------------------------------------ the audit's own speed (issue 15)


@pytest.mark.parametrize("arg", ['plain', 'with "quotes" and \\ backslash', "new\nline\ttab\x01", "ünïcode ✓",
                                 "bad byte \udcff", ""])
def test_the_stand_ins_hand_written_json_is_json(arg):
    # The stand-in writes its record without importing json (milliseconds per compiled file).
    assert json.loads(imagegen_audit._json_str(arg)) == arg
    assert imagegen_audit._json_str(arg) == json.dumps(arg, ensure_ascii=False) or "\udcff" in arg


def test_a_record_with_odd_arguments_reads_back(tmp_path):
    odd = ['-DNAME="a b"', "-Xcompiler=-O3\\x", "ü"]
    proc, records = run_stub(tmp_path, "cxx", "-c", "a.cpp", "-o", "a.o", *odd)
    assert proc.returncode == 0, proc.stderr
    assert records[0]["argv"] == ["-c", "a.cpp", "-o", "a.o", *odd] and records[0]["cwd"] == str(tmp_path)


def test_version_queries_ask_the_real_tool_once_per_audit(tmp_path):
    counter = tmp_path / "asked"
    tool = tmp_path / "real-c++"
    tool.write_text(f"#!/bin/sh\necho x >> {counter}\necho \"version 1.2.3 $*\"\necho to-stderr >&2\nexit 0\n")
    tool.chmod(0o755)
    cache = tmp_path / "queries"
    cache.mkdir()
    env = dict(os.environ, IMAGEGEN_AUDIT_LOG=str(tmp_path / "r.jsonl"), IMAGEGEN_AUDIT_REAL=json.dumps({"cxx": [str(tool)]}),
               IMAGEGEN_AUDIT_QUERIES=str(cache))

    def ask(*argv):
        return subprocess.run([sys.executable, "-S", str(BUILDER / "imagegen_audit.py"), "stub", "cxx", *argv],
                              env=env, capture_output=True, text=True)
    first, second = ask("-dumpfullversion", "-dumpversion"), ask("-dumpfullversion", "-dumpversion")
    assert first.stdout == second.stdout == "version 1.2.3 -dumpfullversion -dumpversion\n"
    assert first.stderr == second.stderr == "to-stderr\n" and first.returncode == second.returncode == 0
    assert counter.read_text().count("x") == 1
    # anything but a pure version query goes to the real tool every time (it may read stdin or files)
    ask("-E", "-dM", "-"), ask("-E", "-dM", "-")
    assert counter.read_text().count("x") == 3


def test_stand_ins_start_python_without_site(tmp_path):
    env = {"PATH": "/usr/bin:/bin"}
    imagegen_audit.install_stubs(str(tmp_path), env, sys.executable, str(BUILDER / "imagegen_audit.py"), None)
    assert " -S " in (tmp_path / "stubs" / "cxx").read_text()
    assert os.path.isdir(env["IMAGEGEN_AUDIT_QUERIES"])


@pytest.mark.skipif(not shutil.which("ccache"), reason="needs ccache (scripts/test.sh installs it)")
def test_ccache_in_front_of_a_stand_in_calls_only_the_stand_in(tmp_path):
    # torch 2.13+ writes `cxx = ccache <CXX>` into its ninja file when ccache is on PATH. A working
    # ccache first runs the compiler with -E, which a stand-in hands to the real compiler (xformers
    # 0.0.32 with torch 2.14: ~1 s per host source). The audit's environment turns both off.
    real = tmp_path / "real-cxx"
    calls = tmp_path / "real-calls"
    real.write_text("#!/bin/sh\necho \"$@\" >> %s\nexec c++ \"$@\"\n" % calls)
    real.chmod(0o755)
    env = {"PATH": os.environ["PATH"], "CXX": str(real), "CCACHE_DIR": str(tmp_path / "cache"), "HOME": str(tmp_path)}
    imagegen_audit.install_stubs(str(tmp_path / "work"), env, sys.executable, str(BUILDER / "imagegen_audit.py"), None)
    assert env["TORCH_NO_COMPILER_WRAPPER"] == "1" and "CCACHE_DIR" not in env
    (tmp_path / "a.cpp").write_text("int f() { return 1; }\n")
    proc = subprocess.run(["ccache", env["CXX"], "-c", str(tmp_path / "a.cpp"), "-o", str(tmp_path / "a.o")],
                          env=env, capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    records = (tmp_path / "work" / "records.jsonl").read_text().splitlines()
    assert len(records) == 1 and not calls.exists()  # recorded once; the real compiler never ran
    # the same call without the audit's CCACHE_DISABLE: ccache preprocesses with the real compiler
    env.pop("CCACHE_DISABLE")
    env["CCACHE_DIR"] = str(tmp_path / "cache")
    subprocess.run(["ccache", env["CXX"], "-c", str(tmp_path / "a.cpp"), "-o", str(tmp_path / "b.o")],
                   env=env, capture_output=True, text=True, cwd=tmp_path)
    assert "-E" in calls.read_text().split()


def test_a_relative_cuda_home_is_shadowed_by_links_that_resolve(tmp_path, monkeypatch):
    # CUDA_HOME=relative/path (a user's shell): the shadow's links must still reach the toolkit, not
    # dangle (they did, and the audit stopped at "File exists: .../cuda/include").
    home = tmp_path / "toolkit"
    (home / "include").mkdir(parents=True)
    (home / "include" / "cuda.h").write_text("/* cuda */\n")
    (home / "bin").mkdir()
    monkeypatch.chdir(tmp_path)
    work = tmp_path / "work"
    imagegen_audit.install_stubs(str(work), {"PATH": "/usr/bin:/bin"}, sys.executable, str(BUILDER / "imagegen_audit.py"),
                                 "toolkit")
    assert (work / "cuda" / "include" / "cuda.h").read_text() == "/* cuda */\n"


def _project(tree: Path, pyproject: str | None, backend: str | None = None) -> Path:
    tree.mkdir(parents=True)
    if pyproject is not None:
        (tree / "pyproject.toml").write_text(pyproject)
    if backend is not None:
        (tree / "_backend").mkdir()
        (tree / "_backend" / "hooks.py").write_text(backend)
    (tree / "setup.py").write_text("import os\nprint('setup.py ran in', os.getcwd())\n"
                                   "raise SystemExit('stop here: the legacy backend ran setup.py')\n")
    return tree


def test_the_audit_runs_the_build_wheel_hook_pip_would(tmp_path):
    # An in-tree backend (backend-path) gets the call pip's hook runner would make, in the tree.
    backend = ("import os\n"
               "def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):\n"
               "    name = 'p-1-py3-none-any.whl'\n"
               "    open(os.path.join(wheel_directory, name), 'w').write(os.getcwd())\n"
               "    return name\n")
    tree = _project(tmp_path / "a", '[build-system]\nrequires = []\nbuild-backend = "hooks"\nbackend-path = ["_backend"]\n',
                    backend)
    cmd = imagegen_audit.build_wheel_command(sys.executable, str(tmp_path / "w"), str(tree), str(tmp_path / "dist"))
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "dist" / "p-1-py3-none-any.whl").read_text() == str(tree)
    # No pyproject.toml, or no build-backend in it: setuptools' legacy backend runs setup.py, as pip does.
    for name, pyproject in (("b", None), ("c", '[build-system]\nrequires = ["setuptools"]\n')):
        tree = _project(tmp_path / name, pyproject)
        cmd = imagegen_audit.build_wheel_command(sys.executable, str(tmp_path / "w"), str(tree), str(tmp_path / "dist"))
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path)
        assert proc.returncode != 0 and "the legacy backend ran setup.py" in proc.stderr
        assert f"setup.py ran in {tree}" in proc.stdout


def test_judge_refuses_a_plain_target_where_the_kernels_need_the_arch_specific_one():
    # xformers 0.0.32/0.0.33's bundled FA3 got plain sm_90 for a 9.0 request: nvcc compiles it, but
    # the wgmma kernels become traps. The recipe's table says 9.0a.
    fa3 = {"xformers.flash_attn_3._C": parse_arch_list("8.0;9.0a")}
    plain = report(("xformers.flash_attn_3._C", ["sm_80", "sm_90"], []))
    v = judge(plain, recipe_name="xformers", version_label="0.0.33.post2", requested=parse_arch_list("8.0;9.0"),
              nvcc=Version("13.0"), extension_archs=fa3)
    assert not v.ok
    assert any("flash_attn_3._C would be compiled for sm_90: its kernels need sm_90a" in r and "ask for 9.0a" in r
               for r in v.refusals), v.refusals
    routed = report(("xformers.flash_attn_3._C", ["sm_80", "sm_90a"], []))
    v = judge(routed, recipe_name="xformers", version_label="0.0.33.post2", requested=parse_arch_list("8.0;9.0a"),
              nvcc=Version("13.0"), extension_archs=fa3)
    assert v.ok, v.refusals


def test_ld_queries_are_not_links():
    assert not imagegen_audit._producing("ld", ["--help"]) and not imagegen_audit._producing("ld", ["-v"])
    assert imagegen_audit._producing("ld", ["-shared", "a.o", "-o", "x.so"])
    assert imagegen_audit._producing("ld", ["a.o", "-ox.so"])


# --------------------------------------------------------------------------------------------
# Issue 37: each compile's C++ standard, recorded by the stand-ins and judged against the torch


def test_fold_records_the_standard_arguments_of_every_compile(tmp_path):
    src = str(tmp_path / "src")
    build = f"{src}/build/temp"
    rec = lambda tool, *argv: {"tool": tool, "cwd": build, "argv": list(argv)}  # noqa: E731
    records = [
        rec("nvcc", "-c", f"{src}/a.cu", "-o", f"{build}/a.o", "-std=c++17", "-Xcompiler", "-fPIC",
            "-gencode", "arch=compute_90,code=sm_90"),
        rec("nvcc", "-c", f"{src}/b.cu", "-o", f"{build}/b.o", "--std", "c++17", "-Xcompiler", "-std=c++17",
            "-gencode", "arch=compute_90,code=sm_90"),
        rec("cxx", "-c", f"{src}/api.cpp", "-o", f"{build}/api.o", "-O3", "-std=c++17", "-std=c++20"),
        rec("cxx", "-c", f"{src}/plain.cpp", "-o", f"{build}/plain.o"),
        rec("ld", "-shared", f"{build}/a.o", f"{build}/b.o", f"{build}/api.o", f"{build}/plain.o", "-o",
            f"{src}/build/lib.linux-x86_64-cpython-312/flash_attn_2_cuda.cpython-312-x86_64-linux-gnu.so"),
    ]
    ext = imagegen_audit_records.fold(records, src)["extensions"][0]
    assert ext["std_args"] == [{"tool": "nvcc", "args": ["-std=c++17"]},
                               {"tool": "nvcc", "args": ["--std", "c++17", "-Xcompiler", "-std=c++17"]},
                               {"tool": "cxx", "args": ["-std=c++17", "-std=c++20"]},
                               {"tool": "cxx", "args": []}]
    assert imagegen_audit_records.std_args(["-Xcompiler=-std=gnu++17", "/std:c++20", "-Xcompiler", "-O3"]) == \
        ["-Xcompiler=-std=gnu++17", "/std:c++20"]
    audited = AuditReport.from_json({"ok": True, "exit": 0, "extensions": [ext]}).extensions[0]
    assert audited.lowest_std.flag == "-std=c++17"


def test_a_stable_abi_compile_is_left_to_the_probe_not_to_the_standard_check(tmp_path):
    # torch 2.14's stable headers (torch/csrc/stable/library.h, tensor.h) parse as C++17 (g++ -fsyntax-only in
    # the torch 2.14.1 builder image), where torch/extension.h #errors: a stable-ABI compile (flash-attn-3's
    # flash_api_stable.cpp, xformers 0.0.35) is not held to torch's extension minimum; the probe judges it.
    src = str(tmp_path / "src")
    build = f"{src}/build/temp"
    rec = lambda tool, *argv: {"tool": tool, "cwd": build, "argv": list(argv)}  # noqa: E731
    records = [
        rec("cxx", "-c", f"{src}/api_stable.cpp", "-o", f"{build}/s.o", "-std=c++17", "-DTORCH_TARGET_VERSION=0x020e000000000000"),
        rec("nvcc", "-c", f"{src}/k.cu", "-o", f"{build}/k.o", "-std=c++17", "-DTORCH_STABLE_ONLY",
            "-gencode", "arch=compute_90,code=sm_90"),
        rec("ld", "-shared", f"{build}/s.o", f"{build}/k.o", "-o",
            f"{src}/build/lib.linux-x86_64-cpython-312/pkg/_C.cpython-312-x86_64-linux-gnu.so"),
        rec("cxx", "-c", f"{src}/api.cpp", "-o", f"{build}/a.o", "-std=c++17"),
        rec("ld", "-shared", f"{build}/a.o", "-o", f"{src}/build/lib.linux-x86_64-cpython-312/pkg/_D.cpython-312-x86_64-linux-gnu.so"),
    ]
    stable, plain = imagegen_audit_records.fold(records, src)["extensions"]
    assert stable["std_args"] == [] and stable["stable_abi_sources"] == 2
    assert plain["std_args"] == [{"tool": "cxx", "args": ["-std=c++17"]}] and plain["stable_abi_sources"] == 0
    report = AuditReport.from_json({"ok": True, "exit": 0, "extensions": [dict(stable, module="pkg._C"), dict(plain, module="pkg._D")]})
    v = judge_std(report, "2.14")
    assert v.refusals == ("pkg._D compiles with -std=c++17 but torch 2.14's headers require C++20 or later: use a"
                          " recipe fix (by_torch patch) or the package's release that picks the standard from torch",)


def std_report(*std_args):
    ext = {"module": "flash_attn_2_cuda", "sass": ["sm_90"], "ptx": [],
           "std_args": [{"tool": tool, "args": list(args)} for tool, args in std_args]}
    return AuditReport.from_json({"ok": True, "exit": 0, "seconds": 1.0, "extensions": [ext]})


def judge_std(report, torch):
    return judge(report, recipe_name="flash-attn", version_label="2.8.3", requested=parse_arch_list("9.0"),
                 nvcc=Version("13.0"), torch=compat.torch_table()[torch])


UPSTREAM_2_8_3 = (("nvcc", ("-std=c++17",)), ("cxx", ("-std=c++17",)))
PATCHED = (("nvcc", ("-std=c++20",)), ("cxx", ("-std=c++20",)))


def test_the_audit_refuses_a_standard_the_torch_headers_reject():
    v = judge_std(std_report(*UPSTREAM_2_8_3), "2.14")
    assert not v.ok and v.refusals == (
        "flash_attn_2_cuda compiles with -std=c++17 but torch 2.14's headers require C++20 or later: use a recipe fix"
        " (by_torch patch) or the package's release that picks the standard from torch",)
    assert v.as_dict()["verdict"] == "refused" and v.as_dict()["extensions"][0]["cxx_std"] == "-std=c++17"


def test_the_audit_warns_for_torch_2_12_and_passes_older_torch():
    v = judge_std(std_report(*UPSTREAM_2_8_3), "2.12")
    assert v.ok and any("torch 2.12 builds its own extensions as C++20" in w for w in v.warnings)
    v = judge_std(std_report(*UPSTREAM_2_8_3), "2.11")
    assert v.ok and not v.warnings


def test_the_audit_sees_the_recipe_fix():
    # The by_torch patch makes the build pass -std=c++20 for torch >= 2.12: the same extension passes.
    for torch in ("2.12", "2.14"):
        v = judge_std(std_report(*PATCHED), torch)
        assert v.ok and not v.warnings, (v.refusals, v.warnings)


def test_one_cause_is_one_refusal_line_and_the_probe_that_agrees_is_a_note():
    # SageAttention's four extensions at -std=c++17 against torch 2.14, its header probe failing on torch's
    # #error for both compilers: one line names the standard and the four modules (was six lines).
    error = "torch/csrc/api/include/torch/all.h:5:2: error: #error C++20 or later compatible compiler is required to use PyTorch."
    modules = ["sageattention._qattn_sm80", "sageattention._qattn_sm89", "sageattention._qattn_sm90", "sageattention._fused"]
    probe = [{"compiler": c, "tool": c, "what": "preprocess", "ok": False, "error": error, "seconds": 1.0} for c in ("c++", "nvcc")]
    report = AuditReport.from_json({"ok": True, "exit": 0, "seconds": 5.1, "probe": {"mode": "on", "seconds": 3.0},
                                    "extensions": [{"module": m, "sass": ["sm_90a"], "ptx": [], "probe": probe,
                                                    "std_args": [{"tool": "nvcc", "args": ["-std=c++17"]}]}
                                                   for m in modules]})
    v = judge_std(report, "2.14")
    assert v.refusals == (
        f"{', '.join(modules)}: each compiles with -std=c++17 but torch 2.14's headers require C++20 or later: use a"
        " recipe fix (by_torch patch) or the package's release that picks the standard from torch",)
    assert [n for n in v.notes if "confirms" in n] == [
        f"header probe with {c} for {', '.join(modules)} confirms the standard: {error}" for c in ("c++", "nvcc")]
    # A probe failing for another reason still refuses on its own line, as does one for a module the
    # standard check let through.
    other = "ATen/cuda/CUDAContextLight.h:10:10: fatal error: cusparse.h: No such file or directory"
    mixed = AuditReport.from_json({"ok": True, "exit": 0, "extensions": [
        {"module": "a", "sass": ["sm_90"], "std_args": [{"tool": "nvcc", "args": ["-std=c++17"]}],
         "probe": [dict(probe[1], error=other)]},
        {"module": "b", "sass": ["sm_90"], "std_args": [{"tool": "nvcc", "args": ["-std=c++20"]}], "probe": [probe[1]]}]})
    v = judge_std(mixed, "2.14")
    assert len(v.refusals) == 3 and v.refusals[0].startswith("a compiles with -std=c++17")
    assert any(r.startswith("a: torch's headers do not compile with nvcc") and "cusparse.h" in r for r in v.refusals)
    assert any(r.startswith("b: torch's headers do not compile with nvcc") and "#error C++20" in r for r in v.refusals)


def test_one_compile_left_at_cxx17_is_enough_to_refuse():
    v = judge_std(std_report(("nvcc", ("-std=c++20", "-Xcompiler", "-std=c++17")), ("cxx", ("-std=c++20",))), "2.14")
    assert not v.ok and "compiles with -std=c++17" in v.refusals[0]


def test_a_report_without_standards_is_not_judged_on_them():
    # Written by an older builder image (no std_args), or a compile that names no standard.
    v = judge_std(report(("flash_attn_2_cuda", ["sm_90"], [])), "2.14")
    assert v.ok
    assert judge_std(std_report(("cxx", ())), "2.14").ok


def test_judge_cell_judges_against_the_cells_own_torch():
    # What `imagegen plan --audit` and `imagegen build`'s pre-flight (engine, native, pulled image) call.
    from imagegen.model.audit import judge_cell
    from imagegen.model.catalogue import load_catalogue
    from imagegen.plan.matrix import make_cell
    fa = load_catalogue().get("flash-attn")
    report = std_report(*UPSTREAM_2_8_3)
    for torch, ok in (("2.11", True), ("2.14", False)):
        cell = make_cell(fa, fa.version(None), torch, "13.0", "3.12", parse_arch_list("9.0"), "runpod")
        assert judge_cell(report, cell).ok is ok, torch


# ------------------------------------------------------------------- a user's own tree: its own edit


def _planned_cell(tmp_path, monkeypatch, *argv):
    from imagegen.commands import common
    from imagegen.model.catalogue import load_catalogue
    from imagegen.plan import request
    from imagegen.plan.config import Config
    from tests.unit.command_helpers import parse
    monkeypatch.chdir(tmp_path)  # no project config or lock file of the checkout
    args = parse("plan", *argv, "--cuda", "13.0", "--python", "3.12", "--arch", "9.0", "--flavor", "pypi")
    [cell] = request.planned(common.resolved(args, Config()), load_catalogue(), common.lock(args)).cells
    return cell


def _own_tree(root, std="-std=c++17"):
    root.mkdir()
    (root / "setup.py").write_text("from setuptools import setup\nsetup(name='my-kernels', version='1.0')\n"
                                   f"# nvcc flags: {std}\n")
    return root


def test_the_audit_of_a_users_own_tree_names_the_edit_to_its_setup_py_not_a_recipe_fix(tmp_path, monkeypatch):
    from imagegen.model.audit import judge_cell
    tree = _own_tree(tmp_path / "my-kernels")
    cell = _planned_cell(tmp_path, monkeypatch, "--source", tree, "--torch", "2.14")
    v = judge_cell(std_report(*UPSTREAM_2_8_3), cell)
    assert v.refusals == ("flash_attn_2_cuda compiles with -std=c++17 but torch 2.14's headers require C++20 or"
                          " later: edit setup.py: -std=c++17 -> -std=c++20 (or drop it: torch then picks the standard)",)
    # The header probe's own failure on the standard says the same edit.
    assert probe_fix("error: #error C++20 or later compatible compiler is required", "setup.py").startswith(
        "edit setup.py: build with -std=c++20")


def test_the_audit_of_a_users_tree_with_a_hard_coded_gencode_names_the_flag_to_drop(tmp_path, monkeypatch):
    from imagegen.model.audit import judge_cell
    # The fixture's own list (sm_70, sm_80, sm_86), what the audit of its build records on CUDA 13.
    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "hardcoded_gencode"
    cell = _planned_cell(tmp_path, monkeypatch, "--source", fixture, "--torch", "2.11")
    v = judge_cell(report(("hardcoded_gencode._C", ["sm_70", "sm_80", "sm_86"], [])), cell)
    [dropped] = [r for r in v.refusals if "sm_70 was dropped in CUDA 13.0" in r]
    assert dropped.endswith(": drop -gencode arch=compute_70,code=sm_70 from setup.py")
    assert any("no extension would carry sm_90 (requested)" in r and "(edit setup.py: add sm_90" in r for r in v.refusals)
    assert not any("by_torch" in r or "recipe" in r for r in v.refusals)


def test_a_catalogue_recipe_and_a_fork_of_one_keep_the_recipe_fix(tmp_path, monkeypatch):
    from imagegen.model.audit import judge_cell
    fork = tmp_path / "my-flash-attn"
    fork.mkdir()
    (fork / "setup.py").write_text("from setuptools import setup\nsetup(name='flash_attn', version='2.8.3')\n")
    for argv in (["fa2", "--version", "2.8.3"], ["--source", fork]):
        cell = _planned_cell(tmp_path, monkeypatch, *argv, "--torch", "2.14")
        v = judge_cell(std_report(*UPSTREAM_2_8_3), cell)
        assert any("use a recipe fix (by_torch patch)" in r for r in v.refusals), (argv, v.refusals)
