"""The audit's link lookup: each -l library an extension's recorded link asks for, looked up where the
linker will look (the link's -L folders, LIBRARY_PATH, the real compiler driver's own search through
its -print-file-name, here the host's real g++), and the judgement of a library it would not find
(the -lcuda class: a CPU builder without the driver compiles everything, then stops at the link)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from packaging.version import Version

from imagegen.model.audit import judge, link_fix

from imagegen.model.audit_report import AuditReport
from imagegen.model.arch_parse import parse_arch_list

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "imagegen" / "shipped" / "builder"))
import imagegen_audit as audit  # noqa: E402  (stdlib-only script shipped beside imagegen_build.py)
import imagegen_audit_links as links  # noqa: E402  (the link lookup, beside it)

GXX = shutil.which("g++")
MISSING = "imagegen_no_such_library_4f2a"


def link(cwd: Path, *args: str, out: str = "build/lib/pkg/_C.cpython-311-x86_64-linux-gnu.so") -> dict:
    return {"tool": "cxx", "cwd": str(cwd), "argv": ["-shared", "build/temp/a.o", *args, "-o", out]}


def env_with(real: dict, **extra: str) -> dict:
    return {audit.REAL_ENV: json.dumps(real), "PATH": "/usr/bin:/bin", **extra}


@pytest.mark.parametrize("argv, folders, names", [
    (["-L/a", "-L", "b", "-lc10", "-l", "torch", "-l:libexact.so.1", "-lcuda"], ["/a", "b"],
     ["c10", "torch", ":libexact.so.1", "cuda"]),
    (["-shared", "x.o", "-o", "x.so", "-Wl,-rpath,/r", "-L"], [], []),
    (["-Wl,-L,/w1", "-Wl,-L/w2,--as-needed", "-lx"], ["/w1", "/w2"], ["x"]),
])
def test_link_arguments(argv, folders, names):
    assert links._link_args(argv) == (folders, names)


def test_each_library_is_looked_up_where_the_linker_looks(tmp_path):
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libfoo.so").write_bytes(b"")
    (tmp_path / "lib" / "libexact.so.1").write_bytes(b"")
    (tmp_path / "stubs").mkdir()
    (tmp_path / "stubs" / "libbar.a").write_bytes(b"")
    record = link(tmp_path, "-Llib", "-lfoo", "-l:libexact.so.1", "-lbar", "-lm", f"-l{MISSING}", "-lbar")
    env = env_with({"cxx": [GXX]}, LIBRARY_PATH=str(tmp_path / "stubs"))
    # -lfoo and -l:libexact.so.1 in the link's -L folder (relative to its cwd), -lbar on LIBRARY_PATH,
    # -lm in g++'s own search: only the unknown one is missing, once
    assert links.missing_libraries([record], env) == {"pkg._C": [MISSING]}
    # without LIBRARY_PATH, -lbar is missing too
    assert links.missing_libraries([record], env_with({"cxx": [GXX]})) == {"pkg._C": ["bar", MISSING]}


def test_a_compiler_that_cannot_be_asked_reports_nothing(tmp_path):
    record = link(tmp_path, f"-l{MISSING}")
    assert links.missing_libraries([record], env_with({"cxx": [str(tmp_path / "no-such-g++")]})) == {}
    assert links.missing_libraries([record], env_with({})) == {}


def test_compiles_are_not_links(tmp_path):
    compile_record = {"tool": "cxx", "cwd": str(tmp_path), "argv": ["-c", "a.cpp", "-o", "a.o", f"-l{MISSING}"]}
    assert links.missing_libraries([compile_record], env_with({"cxx": [GXX or "g++"]})) == {}


def test_add_link_missing_fills_each_extension(tmp_path):
    report = {"extensions": [{"module": "pkg._C"}, {"module": "pkg._other"}]}
    links.add_link_missing(report, [link(tmp_path, f"-l{MISSING}")], env_with({"cxx": [GXX]}))
    assert report["extensions"] == [{"module": "pkg._C", "link_missing": [MISSING]},
                                    {"module": "pkg._other", "link_missing": []}]


def verdict(*exts):
    report = AuditReport.from_json({
        "ok": True, "exit": 0, "seconds": 3.0,
        "extensions": [{"module": m, "sass": ["sm_90"], "ptx": [], "link_missing": missing} for m, missing in exts]})
    return judge(report, recipe_name="pkg", version_label="1.0", requested=parse_arch_list("9.0"), nvcc=Version("13.0"))


def test_a_library_the_linker_will_not_find_refuses_the_cell():
    v = verdict(("pkg._qattn_sm90", ["cuda"]), ("pkg._fused", ["cuda", "nvshmem"]), ("pkg._ok", []))
    assert not v.ok
    assert v.refusals == (
        "pkg._qattn_sm90, pkg._fused: its link asks for -lcuda, which the linker will not find (not in the link's -L"
        " folders, LIBRARY_PATH or the compiler's own search): the build would stop at `cannot find -lcuda`;"
        " libcuda.so is the GPU driver's, absent on a host without one (a CPU builder, a pypi toolkit): in a builder"
        " image the recipe's `links_libcuda: true` puts a stub libcuda.so on LIBRARY_PATH; natively, put a folder"
        " holding one on LIBRARY_PATH (the toolkit's lib64/stubs, or build where the driver is installed)",
        "pkg._fused: its link asks for -lnvshmem, which the linker will not find (not in the link's -L folders,"
        " LIBRARY_PATH or the compiler's own search): the build would stop at `cannot find -lnvshmem`; install what"
        " provides libnvshmem.so, or put its folder on LIBRARY_PATH")
    assert v.as_dict()["extensions"][1]["link_missing"] == ["cuda", "nvshmem"]
    assert "link_missing" not in v.as_dict()["extensions"][2]


def test_every_library_found_passes_and_a_hostile_list_is_bounded():
    assert verdict(("pkg._C", [])).ok
    report = AuditReport.from_json({"ok": True, "exit": 0, "extensions": [
        {"module": "pkg._C", "sass": ["sm_90"], "link_missing": [f"l{i}" for i in range(500)] + [5, None]}]})
    assert len(report.extensions[0].link_missing) == 20


def test_link_fix_names_the_recipe_switch_for_the_driver():
    assert "links_libcuda: true" in link_fix("cuda")
    assert link_fix("z") == "install what provides libz.so, or put its folder on LIBRARY_PATH"
