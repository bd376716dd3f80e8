"""The Windows build scripts' helper (imagegen/shipped/windows/imagegen_windows.py), run for real on
this OS: the recipe's patches against a real git tree (applied, already applied and skipped with a log
line, fitting neither), the pinned source fetched from a real repository, retag of a real wheel that pip
then installs, the arch check on real cuobjdump output (captured from cuobjdump 13.5 of PyPI's
nvidia-cuda-cuobjdump on the fixture wheel's extension; the real tool is run too where one is found),
the torch/nvcc check with stand-ins, the import test in a fresh venv, and the move into the wheelhouse
with a build record that imagegen.wheelhouse.records accepts."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from imagegen.wheelhouse import records
from imagegen.shipped.builder.imagegen_wheeltools import find_cuobjdump
from imagegen.model.arch_parse import parse_arch_list
from imagegen.model.catalogue import load_catalogue
from imagegen.model.compat import cuda_variant
from imagegen.render.windows import HELPER_MODULES, build_document
from tests.unit.builder_script import builder_module
from tests.unit.test_windows import windows_cell

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "imagegen" / "shipped" / "windows"))
sys.path.insert(0, str(ROOT / "imagegen" / "shipped" / "builder"))  # imagegen_wheeltools, written beside it
import imagegen_windows as W  # noqa: E402  (stdlib-only helper embedded in the Windows scripts)
import imagegen_windows_archs as A  # noqa: E402  (its arch check, written beside it)
import imagegen_windows_host as H  # noqa: E402  (its checks of the machine, written beside it)

FIXTURES = ROOT / "tests" / "fixtures"
TINY_KERNEL = next((FIXTURES / "wheels").glob("tiny_kernel-*.whl"))
LISTING = (FIXTURES / "windows" / "cuobjdump-tiny_kernel.txt").read_text()
NO_DEVICE_CODE = (FIXTURES / "windows" / "cuobjdump-no-device-code.txt").read_text()
HERE_PY = "%d.%d" % sys.version_info[:2]


def git(*args, cwd=None) -> str:
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t")
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def repo_with_patch(tmp_path: Path) -> tuple[Path, str, str]:
    """A git repository with one commit, and a patch (as `git diff` writes it) against that commit."""
    repo = tmp_path / "upstream"
    repo.mkdir()
    git("init", "-q", cwd=repo)
    (repo / "setup.py").write_text("ARCHS = ['8.0']\nprint('one')\nprint('two')\n")
    git("add", ".", cwd=repo)
    git("commit", "-q", "-m", "one", cwd=repo)
    (repo / "setup.py").write_text("ARCHS = ['8.0', '12.0']\nprint('one')\nprint('two')\n")
    patch = git("diff", cwd=repo)
    git("checkout", "-q", "--", "setup.py", cwd=repo)
    return repo, git("rev-parse", "HEAD", cwd=repo).strip(), patch


def doc_for(cell_python: str = HERE_PY, **source) -> dict:
    """The build document of SageAttention 2.2.0 (torch 2.8, cu128, sm_80/sm_90a/sm_120+PTX) as
    render writes it, with the cell's Python set to ``cell_python`` and the source overridden."""
    sage = load_catalogue().get("sage")
    version = sage.version("2.2.0")
    cell = windows_cell(sage, version, parse_arch_list("8.0;9.0;12.0+PTX"), "2.8", cuda_variant("12.8"), "3.12")
    doc = build_document(sage, version, [cell])
    doc["cells"][0]["python"] = cell_python
    doc["source"].update(source)
    return doc


def write_doc(tmp_path: Path, doc: dict) -> Path:
    path = tmp_path / "build.json"
    path.write_text(json.dumps(doc))
    return path


def make_wheel(folder: Path, name: str = "tinypkg", version: str = "1.2.0", module: str = "X = 1\n") -> Path:
    """A real (pure) wheel: module, METADATA, WHEEL and a RECORD with every file's sha256."""
    folder.mkdir(parents=True, exist_ok=True)
    info = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": module.encode(),
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
             f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    rows = [(n, "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b"=").decode(), str(len(d)))
            for n, d in files.items()]
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows + [(f"{info}/RECORD", "", "")])
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for n, d in files.items():
            zf.writestr(n, d)
        zf.writestr(f"{info}/RECORD", buf.getvalue())
    return path


def stand_in(folder: Path, name: str, stdout: str, code: int = 0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    exe = folder / name
    exe.write_text(f"#!/bin/sh\ncat <<'EOF'\n{stdout}EOF\nexit {code}\n")
    exe.chmod(0o755)
    return exe


# --------------------------------------------------------------------------------------- patches


def test_a_patch_that_fits_is_applied_then_skipped_when_already_there(tmp_path, capsys):
    repo, _, text = repo_with_patch(tmp_path)
    patch = {"name": "add-sm120.patch", "reason": "sm_120", "text": text}
    W.apply_patch(patch, str(repo))
    assert "'12.0'" in (repo / "setup.py").read_text()
    assert "applying patch add-sm120.patch: sm_120" in capsys.readouterr().out
    W.apply_patch(patch, str(repo))  # a second cell (or run) on the same tree: not an error
    out = capsys.readouterr().out
    assert "patch add-sm120.patch is already in the source" in out and "not applied again" in out
    assert (repo / "setup.py").read_text().count("'12.0'") == 1


def test_a_patch_that_fits_neither_way_fails(tmp_path):
    repo, _, text = repo_with_patch(tmp_path)
    (repo / "setup.py").write_text("something else entirely\n")
    with pytest.raises(W.Failed, match="neither applies to the source .* nor is already in it"):
        W.apply_patch({"name": "add-sm120.patch", "text": text}, str(repo))


def test_fetch_clones_the_pinned_commit_applies_patches_and_clears_an_earlier_build(tmp_path, capsys):
    repo, commit, text = repo_with_patch(tmp_path)
    doc = doc_for(url=str(repo), ref=commit, commit=commit, submodules=False)
    doc["patches"] = [{"name": "add-sm120.patch", "reason": "sm_120", "text": text}]
    src = tmp_path / "src"
    assert W.main(["fetch", "--doc", str(write_doc(tmp_path, doc)), "--src", str(src)]) == 0
    assert "'12.0'" in (src / "setup.py").read_text()
    assert git("config", "core.autocrlf", cwd=src).strip() == "false"  # LF, as the patches are
    (src / "build" / "temp").mkdir(parents=True)  # the first cell's objects
    capsys.readouterr()
    assert W.main(["fetch", "--doc", str(tmp_path / "build.json"), "--src", str(src)]) == 0
    out = capsys.readouterr().out
    assert "source already present" in out and "already in the source" in out and not (src / "build").exists()


def test_fetch_with_a_copy_clones_into_the_folder_and_patches_only_the_copy(tmp_path, capsys):
    """--src-dir on a folder the script clones into: it is the user's, so it stays at the pin (unpatched)."""
    repo, commit, text = repo_with_patch(tmp_path)
    doc = doc_for(url=str(repo), ref=commit, commit=commit, submodules=False)
    doc["patches"] = [{"name": "add-sm120.patch", "reason": "sm_120", "text": text}]
    src, copy = tmp_path / "theirs", tmp_path / "work" / "src"
    for _ in range(2):
        assert W.main(["fetch", "--doc", str(write_doc(tmp_path, doc)), "--src", str(src), "--copy", str(copy)]) == 0
        assert "'12.0'" in (copy / "setup.py").read_text() and "'12.0'" not in (src / "setup.py").read_text()
        assert git("status", "--porcelain", cwd=src) == "" and git("rev-parse", "HEAD", cwd=src).strip() == commit
    out = capsys.readouterr().out
    assert "the recipe's patches go on the build's copy, not on %s: add-sm120.patch" % src in out
    assert "copying the fetched tree" in out


def test_fetch_refuses_a_checkout_at_another_commit(tmp_path, capsys):
    repo, commit, _ = repo_with_patch(tmp_path)
    doc = doc_for(url=str(repo), ref=commit, commit="0" * 40)
    assert W.main(["fetch", "--doc", str(write_doc(tmp_path, doc)), "--src", str(repo)]) == 1
    assert "not the pinned 000000000000" in capsys.readouterr().err


def test_a_local_tree_is_built_from_a_patched_copy_and_never_written_to(tmp_path, capsys):
    """Issue 34 item 3: --src-dir on the user's own checkout (seed 002's clone of main with local fixes)."""
    repo, _, text = repo_with_patch(tmp_path)
    (repo / "setup.py").write_text((repo / "setup.py").read_text() + "# the user's own fix\n")
    (repo / "build").mkdir()  # the user's own earlier build
    before = {p.relative_to(repo): p.read_bytes() for p in repo.rglob("*") if p.is_file()}
    doc = doc_for(kind="local", url=None, ref="", commit=None)
    doc["patches"] = [{"name": "add-sm120.patch", "reason": "sm_120", "text": text}]
    copy = tmp_path / "work" / "src"
    for _ in range(2):  # a second run starts from a fresh copy
        assert W.main(["fetch", "--doc", str(write_doc(tmp_path, doc)), "--src", str(repo), "--copy", str(copy)]) == 0
        assert "'12.0'" in (copy / "setup.py").read_text() and "# the user's own fix" in (copy / "setup.py").read_text()
        assert not (copy / "build").exists()
    assert {p.relative_to(repo): p.read_bytes() for p in repo.rglob("*") if p.is_file()} == before
    assert "copying the local tree" in capsys.readouterr().out


def test_a_local_tree_that_is_not_there_or_no_copy_is_one_line(tmp_path, capsys):
    doc = write_doc(tmp_path, doc_for(kind="local", url=None, ref="", commit=None))
    assert W.main(["fetch", "--doc", str(doc), "--src", str(tmp_path / "gone"), "--copy", str(tmp_path / "c")]) == 1
    assert "the local tree" in capsys.readouterr().err
    assert W.main(["fetch", "--doc", str(doc), "--src", str(tmp_path)]) == 1
    assert "a local tree is built from a copy of it: give --copy DIR" in capsys.readouterr().err



def test_a_fetched_commit_without_a_project_at_its_subdir_is_named_as_fetched(tmp_path, capsys):
    repo, commit, _ = repo_with_patch(tmp_path)
    doc = doc_for(url=str(repo), ref=commit, commit=commit, submodules=False, subdir="csrc")
    src, copy = tmp_path / "theirs", tmp_path / "work" / "src"
    assert W.main(["fetch", "--doc", str(write_doc(tmp_path, doc)), "--src", str(src), "--copy", str(copy)]) == 1
    err = capsys.readouterr().err
    assert "the fetched tree %s is not there, or has no setup.py or pyproject.toml" % (src / "csrc") in err
    assert "local" not in err

# ----------------------------------------------------------------------------------------- retag


def test_retag_gives_the_local_version_and_pip_installs_the_result(tmp_path):
    wheel = make_wheel(tmp_path / "dist")
    doc = write_doc(tmp_path, doc_for())
    assert W.main(["retag", "--doc", str(doc), "--cell", "sage-2_2_0-torch2_8-cu128-py312", "--dist",
                   str(tmp_path / "dist")]) == 0
    [new] = [p for p in (tmp_path / "dist").iterdir() if p.suffix == ".whl"]
    assert new.name == "tinypkg-1.2.0+cu128torch2.8-py3-none-any.whl"
    with zipfile.ZipFile(new) as zf:
        assert b"Version: 1.2.0+cu128torch2.8" in zf.read("tinypkg-1.2.0+cu128torch2.8.dist-info/METADATA")
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-index", "--no-deps",
                    "--target", str(target), str(new)], check=True, capture_output=True)
    assert (target / "tinypkg-1.2.0+cu128torch2.8.dist-info").is_dir()
    assert not wheel.exists()


def test_retag_matches_the_linux_builders(tmp_path):
    build = builder_module("imagegen_build_for_windows_retag")
    wheel = make_wheel(tmp_path / "in")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    ours = Path(W.retag(str(wheel), "cu130torch2.11", str(tmp_path / "a")))
    theirs = Path(build.retag(str(wheel), "cu130torch2.11", str(tmp_path / "b")))
    assert ours.name == theirs.name
    with zipfile.ZipFile(ours) as a, zipfile.ZipFile(theirs) as b:
        assert a.namelist() == b.namelist()
        assert all(a.read(n) == b.read(n) for n in a.namelist())


def test_a_wheel_with_a_local_version_already_is_left_alone(tmp_path):
    assert W.retag(str(TINY_KERNEL), "cu128torch2.8", str(tmp_path)) == str(TINY_KERNEL)


def test_retag_wants_exactly_one_wheel(tmp_path):
    (tmp_path / "dist").mkdir()
    with pytest.raises(W.Failed, match="expected one wheel"):
        W.the_wheel(str(tmp_path / "dist"))


# ---------------------------------------------------------------------------------------- verify


def expected(archs: str) -> list[dict]:
    return [{"cc": a.cc, "sass": a.sm if a.sass else None, "ptx": a.compute if a.ptx else None}
            for a in parse_arch_list(archs)]


def test_cuobjdumps_real_listing_is_read():
    assert A.listed_targets(LISTING) == {"sm_80", "sm_90", "compute_90"}
    assert A.listed_targets(NO_DEVICE_CODE) == set()
    assert A.listed_targets("PTX file    1: x.1.sm_90a.ptx\nELF file    2: y.2.sm_100f.cubin\n") == {"compute_90a", "sm_100f"}


@pytest.mark.parametrize("archs, problem", [
    ("8.0;9.0", None),
    ("8.0;9.0+PTX", None),
    ("8.0;12.0", "lacks sm_120"),  # a requested SASS missing
    ("8.0+PTX;9.0", "lacks compute_80"),  # +PTX asked, the PTX missing
    ("9.0a", "lacks sm_90a"),  # the variant counts: plain sm_90 is not sm_90a
])
def test_the_decision_on_missing_sass_and_ptx(archs, problem):
    problems, lines = A.judge(expected(archs), {"pkg/_C.cp312-win_amd64.pyd": A.listed_targets(LISTING)}, {})
    assert (problems == []) if problem is None else (problem in problems[0])
    assert lines[0].startswith("pkg/_C.cp312-win_amd64.pyd: compute_90, sm_80, sm_90")


def test_an_extension_held_to_the_archs_its_kernels_can_target():
    listings = {"sageattention/_qattn_sm90.cp312-win_amd64.pyd": {"sm_90a"},
                "sageattention/_qattn_sm80.cp312-win_amd64.pyd": {"sm_80", "sm_90a"}}
    problems, _ = A.judge(expected("8.0;9.0a"), listings, {"sageattention._qattn_sm90": ["9.0"]})
    assert problems == []
    problems, _ = A.judge(expected("8.0;9.0a"), listings, {})
    assert problems == ["sageattention/_qattn_sm90.cp312-win_amd64.pyd lacks sm_80 (has sm_90a)"]


def test_a_wheel_without_device_code_fails():
    problems, _ = A.judge(expected("8.0"), {"pkg/_helper.pyd": set()}, {})
    assert problems and "no CUDA extension" in problems[0]


def verify_doc(tmp_path: Path, archs: str) -> Path:
    doc = doc_for()
    doc["cells"][0].update(expected=expected(archs), archs=archs)
    doc["extension_archs"] = {}
    return write_doc(tmp_path, doc)


@pytest.mark.parametrize("archs, code", [("8.0;9.0+PTX", 0), ("8.0;12.0", 1)])
def test_verify_runs_cuobjdump_on_each_extension_of_the_wheel(tmp_path, capsys, archs, code):
    dist = tmp_path / "dist"
    dist.mkdir()
    (dist / TINY_KERNEL.name).write_bytes(TINY_KERNEL.read_bytes())
    exe = stand_in(tmp_path / "bin", "cuobjdump", LISTING)
    assert W.main(["verify", "--doc", str(verify_doc(tmp_path, archs)), "--cell", "sage-2_2_0-torch2_8-cu128-py312",
                   "--dist", str(dist), "--cuobjdump", str(exe)]) == code
    report = json.loads((dist / W.VERIFY_FILE).read_text())
    assert report["ok"] is (code == 0)
    assert report["extensions"] == {"tiny_kernel/_C.cpython-311-x86_64-linux-gnu.so": ["compute_90", "sm_80", "sm_90"]}
    if code:
        assert "lacks sm_120" in capsys.readouterr().err


def test_verify_with_the_real_cuobjdump(tmp_path):
    exe = find_cuobjdump()
    if exe is None:  # the test extra installs one (nvidia-cuda-cuobjdump): its absence is a broken set-up
        pytest.fail("no cuobjdump here: pip install -e '.[test]' (nvidia-cuda-cuobjdump)")
    dist = tmp_path / "dist"
    dist.mkdir()
    (dist / TINY_KERNEL.name).write_bytes(TINY_KERNEL.read_bytes())
    assert W.main(["verify", "--doc", str(verify_doc(tmp_path, "8.0;9.0+PTX")), "--cell",
                   "sage-2_2_0-torch2_8-cu128-py312", "--dist", str(dist), "--cuobjdump", exe]) == 0


def test_a_cuobjdump_that_fails_is_a_failure(tmp_path):
    exe = stand_in(tmp_path / "bin", "cuobjdump", "cuobjdump fatal   : Could not open input file\n", code=1)
    with pytest.raises(A.CuobjdumpFailed, match="cuobjdump failed"):
        A.list_extension(str(exe), str(tmp_path / "x.pyd"))
    quiet = stand_in(tmp_path / "bin2", "cuobjdump", NO_DEVICE_CODE, code=255)
    assert A.list_extension(str(quiet), str(tmp_path / "x.pyd")) == set()


# ----------------------------------------------------------------------------------------- check


def fake_torch(tmp_path: Path, version: str, cuda: str | None) -> Path:
    pkg = tmp_path / "fake" / "torch"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(f"__version__ = {version!r}\nclass version:\n    cuda = {cuda!r}\n")
    return pkg.parent


@pytest.mark.parametrize("torch, cuda, nvcc, problem", [
    ("2.8.0+cu128", "12.8", "12.8", None),
    ("2.9.1+cu128", "12.8", "12.8", "torch 2.9.1+cu128 is installed, the cell asks for torch 2.8.0"),
    ("2.8.0", None, "12.8", "CPU-only"),
    ("2.8.0+cu128", "12.8", "13.0", "nvcc's major must equal torch's CUDA major"),
    ("2.8.0+cu128", "12.8", "12.6", "point CUDA_PATH_V12_8 at the 12.8 toolkit"),
])
def test_check_compares_torch_and_nvcc_with_the_cell(tmp_path, monkeypatch, capsys, torch, cuda, nvcc, problem):
    monkeypatch.setenv("PYTHONPATH", str(fake_torch(tmp_path, torch, cuda)))
    bindir = tmp_path / "cuda" / "bin"
    stand_in(bindir, "nvcc", f"Cuda compilation tools, release {nvcc}, V{nvcc}.41\n")
    monkeypatch.setenv("PATH", os.pathsep.join([str(bindir), os.environ["PATH"]]))
    code = W.main(["check", "--doc", str(write_doc(tmp_path, doc_for())), "--cell", "sage-2_2_0-torch2_8-cu128-py312"])
    out, err = capsys.readouterr()
    if problem is None:
        assert code == 0 and "as the cell asks" in out
    else:
        assert code == 1 and problem in err and err.count("\n") == 1


def test_check_refuses_another_python(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PYTHONPATH", str(fake_torch(tmp_path, "2.8.0", "12.8")))
    assert W.main(["check", "--doc", str(write_doc(tmp_path, doc_for("3.99"))), "--cell",
                   "sage-2_2_0-torch2_8-cu128-py312"]) == 1
    assert "the cell is for Python 3.99" in capsys.readouterr().err


def test_nvcc_release_is_read_from_its_version_output():
    assert H.nvcc_release("Cuda compilation tools, release 12.8, V12.8.93\nBuild cuda_12.8.r12.8") == (12, 8)
    assert H.nvcc_release("") is None


# ----------------------------------------------------------------------------------------- smoke


def test_smoke_imports_the_wheel_in_a_fresh_venv_that_sees_the_cells_environment(tmp_path, capsys):
    make_wheel(tmp_path / "dist", module="import jinja2\nX = 1\n")
    doc = doc_for()
    # jinja2 is in this interpreter's (the cell's) environment only: the fresh venv sees it through the .pth
    doc["cells"][0].update(smoke_imports=["tinypkg", "jinja2"], smoke_driver_imports=[])
    code = W.main(["smoke", "--doc", str(write_doc(tmp_path, doc)), "--cell", "sage-2_2_0-torch2_8-cu128-py312",
                   "--dist", str(tmp_path / "dist"), "--venv", str(tmp_path / "smoke")])
    assert code == 0, capsys.readouterr()
    assert json.loads((tmp_path / "dist" / W.SMOKE_FILE).read_text()) == {"imports": {"tinypkg": "ok", "jinja2": "ok"},
                                                                          "ok": True}
    assert "smoke: import tinypkg: ok" in capsys.readouterr().out


def test_smoke_fails_when_a_module_does_not_import(tmp_path, capsys):
    make_wheel(tmp_path / "dist")
    doc = doc_for()
    doc["cells"][0].update(smoke_imports=["tinypkg", "tinypkg_missing"], smoke_driver_imports=[])
    assert W.main(["smoke", "--doc", str(write_doc(tmp_path, doc)), "--cell", "sage-2_2_0-torch2_8-cu128-py312",
                   "--dist", str(tmp_path / "dist"), "--venv", str(tmp_path / "smoke")]) == 1
    assert "cannot import tinypkg_missing" in capsys.readouterr().err


def test_an_import_that_needs_the_gpu_driver_is_skipped_on_a_machine_without_one():
    # The judgement the Windows helper shares with the Linux build (imagegen_wheeltools.judge_imports).
    results = {"pkg": "ok", "pkg._sm90": "error: ImportError: DLL load failed while importing _sm90: not found",
               "pkg._x": "error: ImportError: no module"}
    report, failed = W.wheeltools.judge_imports({"results": results}, ["pkg", "pkg._x", "pkg._sm90"], has_driver=False)
    assert report["pkg._sm90"].startswith("skipped: needs a GPU driver") and failed == ["pkg._x"]
    _, failed = W.wheeltools.judge_imports({"results": results}, ["pkg", "pkg._sm90"], has_driver=True)
    assert failed == ["pkg._sm90"]  # with a driver, a DLL that does not load is a broken wheel


def test_an_import_that_needs_a_declared_requirement_is_skipped_on_windows_too():
    # Review leftover of issue 37's smoke rule: the Windows helper's import test skips an import that
    # failed only for a module the wheel declares (Requires-Dist), and fails one it does not declare.
    found = {"results": {"pkg": "error: ModuleNotFoundError: No module named 'einops'",
                         "pkg.b": "error: ModuleNotFoundError: No module named 'undeclared'"},
             "missing": {"pkg": "einops", "pkg.b": "undeclared"}, "requires": ["Einops"]}
    report, failed = W.wheeltools.judge_imports(found, ["pkg", "pkg.b"], has_driver=True)
    assert report["pkg"].startswith("skipped: needs einops, a runtime requirement") and failed == ["pkg.b"]


# ----------------------------------------------------------------------------------------- place


def test_place_moves_a_tested_wheel_into_the_layout_with_a_record_collect_accepts(tmp_path):
    dist = tmp_path / "dist"
    wheel = make_wheel(dist, version="1.2.0+cu128torch2.8")
    (dist / W.SMOKE_FILE).write_text(json.dumps({"imports": {"tinypkg": "ok"}, "ok": True}))
    (dist / W.VERIFY_FILE).write_text(json.dumps({"ok": True, "problems": [], "extensions": {}}))
    wheelhouse = tmp_path / "wheelhouse"
    assert W.main(["place", "--doc", str(write_doc(tmp_path, doc_for())), "--cell", "sage-2_2_0-torch2_8-cu128-py312",
                   "--dist", str(dist), "--wheelhouse", str(wheelhouse), "--started", "0"]) == 0
    folder = wheelhouse / "sageattention-2.2.0" / "torch2.8" / "cu128"
    assert sorted(p.name for p in folder.iterdir()) == [wheel.name, wheel.name + ".imagegen.json"]
    record = records.read(folder / (wheel.name + ".imagegen.json"))
    assert record.cell == "sage-2_2_0-torch2_8-cu128-py312" and str(record.requested) == "8.0;9.0;12.0+PTX"
    assert record.doc["flavor"] == "windows" and record.doc["torch"] == "2.8.0" and record.doc["cuda"] == "cu128"


def test_the_windows_record_is_the_linux_builds_record_with_its_test_results(tmp_path):
    # one schema for both builds (imagegen_records.build_record, the module the script writes beside the
    # helper): the Linux build's keys, the smoke and verify results added at once
    from tests.unit.executor_fixtures import tiny_cell
    from imagegen.render.dockerfile import cell_document

    wheel = make_wheel(tmp_path / "dist")
    doc = doc_for()
    windows = W.build_record(doc, doc["cells"][0], str(wheel), {"ok": True}, {"ok": True}, None)
    W.records.write_build_record(cell_document(tiny_cell()), {"TORCH_CUDA_ARCH_LIST": "8.0"}, str(wheel), 0.0)
    linux = json.loads((tmp_path / "dist" / (wheel.name + W.records.RECORD_SUFFIX)).read_text())
    assert set(windows) == set(linux) | {"smoke", "verify"}
    assert windows["sha256"] == linux["sha256"] == hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert windows["duration_s"] is None and windows["source"] == {k: doc["source"][k] for k in ("kind", "url", "ref",
                                                                                                   "commit")}


def test_place_refuses_a_wheel_that_was_not_tested(tmp_path, capsys):
    dist = tmp_path / "dist"
    make_wheel(dist)
    (dist / W.VERIFY_FILE).write_text(json.dumps({"ok": True}))
    wheelhouse = tmp_path / "wheelhouse"
    assert W.main(["place", "--doc", str(write_doc(tmp_path, doc_for())), "--cell", "sage-2_2_0-torch2_8-cu128-py312",
                   "--dist", str(dist), "--wheelhouse", str(wheelhouse)]) == 1
    assert "has not passed its smoke step" in capsys.readouterr().err and not wheelhouse.exists()


def test_an_unknown_cell_or_document_is_one_line(tmp_path, capsys):
    assert W.main(["check", "--doc", str(write_doc(tmp_path, doc_for())), "--cell", "nope"]) == 1
    assert "no cell 'nope'" in capsys.readouterr().err
    (tmp_path / "other.json").write_text("{}")
    assert W.main(["check", "--doc", str(tmp_path / "other.json"), "--cell", "x"]) == 1
    assert "not an imagegen Windows build document" in capsys.readouterr().err


@pytest.mark.parametrize("folder, name", [("windows", "imagegen_windows.py"), *HELPER_MODULES])
def test_the_helper_and_its_modules_are_ascii_and_end_no_powershell_here_string(folder, name):
    text = (ROOT / "imagegen" / "shipped" / folder / name).read_text()
    assert text.isascii()
    assert not any(line.lstrip().startswith("'@") for line in text.splitlines())


def test_the_helper_imports_only_the_standard_library_and_the_modules_written_beside_it():
    import ast

    # nvidia: find_cuobjdump looks in PyPI's NVIDIA wheels when they are there (an ImportError is no cuobjdump)
    beside = {name[:-3] for _, name in HELPER_MODULES} | {"nvidia"}
    for folder, name in [("windows", "imagegen_windows.py"), *HELPER_MODULES]:
        tree = ast.parse((ROOT / "imagegen" / "shipped" / folder / name).read_text())
        imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                    for alias in node.names}
        imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert imported - beside <= set(sys.stdlib_module_names), name


def test_the_helper_finds_cuobjdump_as_imagegen_verify_does(monkeypatch, tmp_path):
    # one function (imagegen_wheeltools.find_cuobjdump) for the helper, the in-build script and verify:
    # IMAGEGEN_CUOBJDUMP names one or turns it off, as for `imagegen verify`
    import imagegen_wheeltools

    assert W.find_cuobjdump is imagegen_wheeltools.find_cuobjdump
    monkeypatch.setenv("IMAGEGEN_CUOBJDUMP", "none")
    assert W.find_cuobjdump() is None
    monkeypatch.setenv("IMAGEGEN_CUOBJDUMP", str(tmp_path / "cuobjdump.exe"))
    assert W.find_cuobjdump() == str(tmp_path / "cuobjdump.exe")
    monkeypatch.delenv("IMAGEGEN_CUOBJDUMP")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    (tmp_path / "cuda" / "bin").mkdir(parents=True)
    (tmp_path / "cuda" / "bin" / "cuobjdump.exe").write_text("")
    monkeypatch.setenv("CUDA_PATH", str(tmp_path / "cuda"))  # what NVIDIA's Windows installer sets
    assert W.find_cuobjdump() == str(tmp_path / "cuda" / "bin" / "cuobjdump.exe")
