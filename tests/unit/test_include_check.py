"""The audit's include lookup: each include folder an extension's recorded compiles ask for inside the
package's tree, found missing or empty, and the git submodule it lies in (a checkout without
`--recursive`: flash-attn's csrc/cutlass, xformers' third_party/cutlass); and the judgement: a refusal
inside a submodule, a warning elsewhere. Real folders on disk; .gitmodules read as text."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from packaging.version import Version

from imagegen.model.arch_parse import parse_arch_list
from imagegen.model.audit import judge
from imagegen.model.audit_report import AuditReport, MissingInclude

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "imagegen" / "shipped" / "builder"))
import imagegen_audit_includes as includes  # noqa: E402  (stdlib-only script shipped beside imagegen_build.py)

GITMODULES = """[submodule "csrc/cutlass"]
\tpath = csrc/cutlass
\turl = https://github.com/NVIDIA/cutlass.git
[submodule "third_party/ck"]
\tpath = "third_party/ck"
\turl = https://example.invalid/ck.git
"""


def compile_and_link(tree: Path, *include_args: str, cwd: Path | None = None) -> list[dict]:
    """One nvcc compile with ``include_args`` and the link of its object into pkg._C."""
    cwd = cwd or tree
    obj = str(tree / "build" / "temp" / "k.o")
    return [{"tool": "nvcc", "cwd": str(cwd), "argv": ["-c", str(tree / "csrc" / "k.cu"), *include_args, "-o", obj]},
            {"tool": "cxx", "cwd": str(tree),
             "argv": ["-shared", obj, "-o", "build/lib/pkg/_C.cpython-311-x86_64-linux-gnu.so"]}]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "csrc" / "cutlass").mkdir(parents=True)  # an uninitialised submodule: an empty folder
    (tmp_path / "csrc" / "own").mkdir()
    (tmp_path / "csrc" / "own" / "k.h").write_text("#pragma once\n")
    (tmp_path / ".gitmodules").write_text(GITMODULES)
    return tmp_path


@pytest.mark.parametrize("argv, folders", [
    (["-I/a", "-I", "b", "-isystem", "c", "-isystemd", "--include-path", "e", "--include-path=f", "-Ig h"],
     ["/a", "b", "c", "d", "e", "f", "g h"]),
    (["-O3", "-DX=1", "-c", "k.cu", "-o", "k.o", "-Xcompiler", "-fPIC"], []),
])
def test_include_arguments_in_every_spelling(argv, folders):
    assert includes._include_args(argv) == folders


def test_submodule_paths_are_read_as_text_and_kept_inside_the_tree(tmp_path):
    (tmp_path / ".gitmodules").write_text(GITMODULES + "\tpath = ../outside\n\tpath = /abs\n\tpath=.\n")
    assert includes.submodule_paths(str(tmp_path)) == ["csrc/cutlass", "third_party/ck"]
    (tmp_path / ".gitmodules").write_bytes(b"\tpath = x\n" * (includes.MAX_GITMODULES_BYTES // 10 + 1))
    assert includes.submodule_paths(str(tmp_path)) == []  # larger than any real one: not read
    (tmp_path / ".gitmodules").unlink()
    (tmp_path / ".gitmodules").symlink_to("/etc/hostname")
    assert includes.submodule_paths(str(tmp_path)) == []  # a link out of the tree: not followed
    assert includes.submodule_paths(str(tmp_path / "nowhere")) == []


def test_an_empty_submodule_and_a_missing_folder_are_found_and_the_rest_passed_over(tree):
    records = compile_and_link(tree, "-I", "csrc/cutlass/include", "-Icsrc/cutlass", "-I", "csrc/own",
                               "-isystem", "/usr/include", "-I", "csrc/generated", "-I", "../../outside",
                               "-I", "third_party/ck/include")
    assert includes.missing_includes(records, str(tree)) == {"pkg._C": [
        {"path": "csrc/cutlass/include", "state": "missing", "submodule": "csrc/cutlass"},
        {"path": "csrc/cutlass", "state": "empty", "submodule": "csrc/cutlass"},
        {"path": "csrc/generated", "state": "missing", "submodule": ""},
        {"path": "third_party/ck/include", "state": "missing", "submodule": "third_party/ck"},
    ]}
    # A link in the tree to a folder outside it is not followed (nothing outside the tree is read).
    (tree / "csrc" / "out").symlink_to(tree.parent)
    assert includes.missing_includes(compile_and_link(tree, "-I", "csrc/out/nothing-here"), str(tree)) == {}
    # A compile that runs in a build folder of its own (CMake) names the same folders from there.
    cmake = compile_and_link(tree, "-I", "../csrc/cutlass/include", cwd=tree / "build")
    assert includes.missing_includes(cmake, str(tree))["pkg._C"][0]["path"] == "csrc/cutlass/include"
    # Checked out but trimmed (a vendored copy of CUTLASS's include/ alone): a folder missing there is
    # no submodule left out, so it is not tied to one (a warning, not a refusal).
    (tree / "csrc" / "cutlass" / "include").mkdir()
    (tree / "csrc" / "cutlass" / "include" / "cutlass.h").write_text("")
    trimmed = compile_and_link(tree, "-I", "csrc/cutlass/examples/common", "-I", "csrc/cutlass/include")
    assert includes.missing_includes(trimmed, str(tree)) == {"pkg._C": [
        {"path": "csrc/cutlass/examples/common", "state": "missing", "submodule": ""}]}
    # Checked out: nothing to say.
    (tree / "csrc" / "cutlass" / "include" / "cutlass").mkdir()
    (tree / "csrc" / "cutlass" / "include" / "cutlass" / "cutlass.h").write_text("")
    checked_out = compile_and_link(tree, "-Icsrc/cutlass/include", "-Icsrc/cutlass")
    assert includes.missing_includes(checked_out, str(tree)) == {}


def test_the_report_gets_a_list_for_every_extension(tree):
    report = {"extensions": [{"module": "pkg._C"}, {"module": "pkg._other"}]}
    includes.add_include_missing(report, compile_and_link(tree, "-Icsrc/cutlass/include"), str(tree))
    assert report["extensions"][0]["include_missing"] == [
        {"path": "csrc/cutlass/include", "state": "missing", "submodule": "csrc/cutlass"}]
    assert report["extensions"][1]["include_missing"] == []


def verdict(include_missing: list) -> tuple:
    report = AuditReport.from_json({"ok": True, "exit": 0, "seconds": 1.0, "extensions": [
        {"module": "pkg._C", "sass": ["sm_90"], "ptx": [], "sources": ["csrc/k.cu"],
         "cuda_sources": [{"source": "csrc/k.cu", "targets": ["sass:sm_90"]}], "include_missing": include_missing}]})
    got = judge(report, recipe_name="pkg", version_label="1.0", requested=parse_arch_list("9.0"), nvcc=Version("13.0"))
    return report, got


def test_a_submodule_not_checked_out_is_refused_and_a_folder_elsewhere_is_a_warning():
    report, got = verdict([{"path": "csrc/cutlass/include", "state": "missing", "submodule": "csrc/cutlass"},
                           {"path": "csrc/generated", "state": "empty", "submodule": ""}])
    assert report.extensions[0].include_missing == (MissingInclude("csrc/cutlass/include", "missing", "csrc/cutlass"),
                                                    MissingInclude("csrc/generated", "empty", ""))
    assert got.refusals == (
        "pkg._C: its include folder csrc/cutlass/include is missing, inside the git submodule csrc/cutlass"
        " (.gitmodules): the tree has not got its submodules, and a compile that includes from there fails"
        " (`No such file or directory`): run `git submodule update --init --recursive` in the tree, or build from"
        " the recipe's source (imagegen fetches its submodules)",)
    assert got.warnings == ("pkg._C: its include folder csrc/generated is empty in the tree: a compile that includes"
                            " from it will fail (`No such file or directory`)",)
    shown = got.as_dict()["extensions"][0]["include_missing"]
    assert shown[0] == {"path": "csrc/cutlass/include", "state": "missing", "submodule": "csrc/cutlass"}


def test_the_report_is_read_with_bounds_and_nothing_else_trusted():
    _, got = verdict([{"path": "a", "state": "exploded", "submodule": 5}, {"path": ""}, "x", None,
                      *({"path": f"p{i}", "state": "empty", "submodule": ""} for i in range(40))])
    (ext,) = got.report.extensions
    assert ext.include_missing[0] == MissingInclude("a", "missing", "") and len(ext.include_missing) == 17
    assert not got.refusals and len(got.warnings) == 17
