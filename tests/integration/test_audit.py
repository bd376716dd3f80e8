"""The gencode audit on real projects: the package's own setup.py, a real torch (2.11, CUDA 13.0)
and pip, with the stand-in compilers, on the host (nvcc 13.0 at /usr/local/cuda answers the
version queries). Seed 003's hard-coded gencode list and SageAttention's per-extension layout in
miniature (tests/fixtures/hardcoded_gencode, tests/fixtures/routed_kernels)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
IMAGEGEN = str(Path(sys.executable).parent / "imagegen")

pytestmark = pytest.mark.integration


def imagegen(*argv, cwd, **extra_env):
    env = dict(os.environ, CUDA_HOME="/usr/local/cuda", **extra_env)
    return subprocess.run([IMAGEGEN, *map(str, argv)], capture_output=True, text=True, env=env, cwd=cwd, timeout=900)


def test_audit_sees_a_hard_coded_list_and_refuses_it_on_cuda_13(torch_venv, tmp_path):
    t0 = time.time()
    proc = imagegen("plan", "--audit", "--native", "--source", FIXTURES / "hardcoded_gencode", "--arch", "9.0",
                    "--python-exe", torch_venv / "bin" / "python", "--work", tmp_path / "w", "--json", cwd=tmp_path)
    seconds = time.time() - t0
    assert proc.returncode == 3, proc.stderr[-2000:]
    got = json.loads(proc.stdout)["audit"]
    assert got["verdict"] == "refused"
    (ext,) = got["extensions"]
    assert ext["module"] == "hardcoded_gencode._C" and ext["sass"] == ["sm_70", "sm_80", "sm_86"] and ext["ptx"] == []
    assert "-O3" in ext["nvcc_flags"] and "--use_fast_math" in ext["nvcc_flags"]
    assert any("sm_70 was dropped in CUDA 13.0" in r for r in got["refusals"])
    assert any("no extension would carry sm_90" in r for r in got["refusals"])
    assert any("not requested" in w for w in got["warnings"])
    # the header probe ran on the recorded flags (its CUDAContext.h needs cusparse.h, which this host's
    # toolkit lacks: a warning, the fixture includes no ATen/cuda/ header)
    assert got["probe"]["mode"] == "on" and [p["compiler"] for p in ext["probe"]] == ["nvcc"], got
    assert proc.stderr.strip().splitlines()[-1].startswith("imagegen: error: cannot build hardcoded-gencode")
    assert seconds < 60, f"the audit took {seconds:.0f} s"  # seconds, not a compile (a bound, not a benchmark)


def test_audit_knows_which_archs_each_extension_may_take(torch_venv, tmp_path):
    common = ["--native", "routed-kernels", "--recipe-dir", FIXTURES / "routed_kernels", "--arch", "8.0 8.6 9.0 12.0+PTX",
              "--python-exe", torch_venv / "bin" / "python"]
    routed = imagegen("plan", "--audit", *common, "--version", "routed", "--work", tmp_path / "a", "--json", cwd=tmp_path)
    assert routed.returncode == 0, routed.stderr[-2000:]
    exts = {e["module"]: e for e in json.loads(routed.stdout)["audit"]["extensions"]}
    assert exts["routed_kernels._portable"]["sass"] == ["sm_80", "sm_86", "sm_90a", "sm_120"]
    assert exts["routed_kernels._portable"]["ptx"] == ["compute_120"]
    assert exts["routed_kernels._hopper"]["sass"] == ["sm_90a"] and exts["routed_kernels._hopper"]["ptx"] == []
    # Upstream's layout (every extension gets every pair): refused before anything compiles, and
    # `build --native` says the same in seconds instead of failing in ptxas minutes later.
    unrouted = imagegen("plan", "--audit", *common, "--version", "unrouted", "--work", tmp_path / "b", cwd=tmp_path)
    assert unrouted.returncode == 3
    assert "routed_kernels._hopper would be compiled for sm_80, sm_86, sm_120, compute_120" in unrouted.stdout
    t0 = time.time()
    build = imagegen("build", *common, "--version", "unrouted", "--work", tmp_path / "c", "--out", tmp_path / "out",
                     cwd=tmp_path)
    assert build.returncode == 3 and "the gencode audit refuses it" in build.stderr
    assert not list((tmp_path / "out").rglob("*.whl")) and time.time() - t0 < 120


def test_a_catalogue_recipe_fetched_as_its_pypi_sdist_is_audited_natively(torch_venv, tmp_path):
    # A real catalogue package, end to end where GitHub cannot be reached: its sdist from PyPI,
    # checked against the recipe's sha256, then its own setup.py run with the recipe's knobs.
    # Upstream compiles a fixed list of nine archs on CUDA 13 and ignores --arch; with the recipe's
    # arch-list patch (applied to the sdist here) the package's own build compiles what was asked.
    # Without the header probe: causal-conv1d includes ATen/cuda/CUDAContext.h, which needs cusparse.h,
    # and this host's toolkit (/usr/local/cuda: nvcc and the runtime) has none, so the probe rightly
    # refuses a native build here (tests/integration/test_header_probe.py); this test is about the arch patch.
    got = audited_sdist("causal-conv1d", "8.0;9.0+PTX", "causal_conv1d-1.6.1.tar.gz", torch_venv, tmp_path)
    (ext,) = got["extensions"]
    assert ext["module"] == "causal_conv1d_cuda" and ext["sass"] == ["sm_80", "sm_90"] and ext["ptx"] == ["compute_90"]
    assert not any("hard-coded arch list" in w for w in got["warnings"]), got["warnings"]


def audited_sdist(recipe: str, arch: str, sdist: str, torch_venv: Path, tmp_path: Path) -> dict:
    """`plan --audit --native RECIPE --fetch sdist`: the sdist checked against the recipe's sha256, the
    recipe's arch-list patch applied, the package's own setup.py run; its audit, which must be ok."""
    proc = imagegen("plan", "--audit", "--native", recipe, "--fetch", "sdist", "--arch", arch,
                    "--python-exe", torch_venv / "bin" / "python", "--work", tmp_path / "w", "--json", cwd=tmp_path,
                    IMAGEGEN_AUDIT_PROBE="0")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert sdist in proc.stderr and "sha256 ok" in proc.stderr
    assert f"{recipe}-arch-list.patch" in proc.stderr
    got = json.loads(proc.stdout)["audit"]
    assert got["verdict"] == "ok", got
    return got


def test_mamba_ssm_from_its_pypi_sdist_compiles_only_the_archs_asked_for(torch_venv, tmp_path):
    # mamba-ssm's setup.py, like causal-conv1d's, compiles a hard-coded list (nine archs with nvcc 13)
    # whatever TORCH_CUDA_ARCH_LIST says: 62 minutes on 2 cores for `--arch 9.0` before the recipe's
    # arch-list patch. The audit runs the package's own setup.py on the sdist with the patch applied.
    got = audited_sdist("mamba-ssm", "9.0+PTX", "mamba_ssm-2.3.2.post1.tar.gz", torch_venv, tmp_path)
    (ext,) = got["extensions"]
    assert ext["module"] == "selective_scan_cuda" and ext["sass"] == ["sm_90"] and ext["ptx"] == ["compute_90"]


def tiny_kernel_with(tmp_path: Path, torch_venv: Path, keywords: str, prelude: str = "") -> tuple[Path, list]:
    """A copy of the tiny_kernel fixture whose extension also gets ``keywords`` (setup.py source, such as
    'libraries=["cuda"]'), ``prelude`` put before its setup.py; and the arguments of its native audit
    for --arch 9.0 with the test's torch (imagegen's ``--work`` left to the caller)."""
    tree = tmp_path / "tiny_kernel"
    shutil.copytree(FIXTURES / "tiny_kernel", tree)
    setup = tree / "setup.py"
    setup.write_text(prelude + setup.read_text().replace('"csrc/add_one_kernel.cu"])',
                                                         f'"csrc/add_one_kernel.cu"], {keywords})'))
    assert keywords in setup.read_text()
    return tree, ["plan", "--audit", "--native", "--source", tree, "--arch", "9.0",
                  "--python-exe", torch_venv / "bin" / "python", "--json"]


def test_a_link_the_linker_cannot_complete_is_refused_before_anything_compiles(torch_venv, tmp_path):
    # The -lcuda class (SageAttention's _qattn_sm90 on a CPU builder): every compile would pass and the
    # build stop at its last step, `cannot find -lcuda`. This host has no GPU driver, so no libcuda.so
    # where g++ looks; the fixture kernel asks for it as such packages do.
    tree, args = tiny_kernel_with(tmp_path, torch_venv, 'libraries=["cuda"]')
    refused = imagegen(*args, "--work", tmp_path / "a", cwd=tmp_path, IMAGEGEN_AUDIT_PROBE="0")
    assert refused.returncode == 3, refused.stderr[-2000:]
    got = json.loads(refused.stdout)["audit"]
    (ext,) = got["extensions"]
    assert ext["link_missing"] == ["cuda"]
    (line,) = [r for r in got["refusals"] if "-lcuda" in r]
    assert line.startswith("tiny_kernel._C: its link asks for -lcuda, which the linker will not find") and \
        "links_libcuda: true" in line
    # torch's own libraries (-lc10 -ltorch ... -lcudart) are all found: only -lcuda is named
    assert "-lcuda" in refused.stderr.strip().splitlines()[-1]
    # A stub libcuda.so on LIBRARY_PATH (what links_libcuda gives a build): the same cell is buildable.
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    (stubs / "libcuda.so").write_bytes(b"")
    ok = imagegen(*args, "--work", tmp_path / "b", cwd=tmp_path, IMAGEGEN_AUDIT_PROBE="0", LIBRARY_PATH=str(stubs))
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert json.loads(ok.stdout)["audit"]["verdict"] == "ok"


def test_an_include_folder_in_a_submodule_not_checked_out_is_refused_before_anything_compiles(torch_venv, tmp_path):
    # flash-attn, NATTEN and xformers cloned without --recursive: csrc/cutlass is an empty folder, setup.py
    # still hands nvcc -I csrc/cutlass/include, and every compile fails on `cutlass/cutlass.h: No such file`
    # (minutes in, on a big package). The fixture kernel with such a -I and such a .gitmodules.
    # As packages write it (flash-attn: Path(this_dir) / "csrc" / "cutlass" / "include"): absolute, since
    # torch's ninja build runs nvcc in build/temp.*, where a relative -I points elsewhere.
    tree, args = tiny_kernel_with(tmp_path, torch_venv, 'include_dirs=[os.path.join(os.path.dirname('
                                  'os.path.abspath(__file__)), "third_party", "lib", "include")]',
                                  prelude="import os\n")
    (tree / ".gitmodules").write_text('[submodule "third_party/lib"]\n\tpath = third_party/lib\n'
                                      "\turl = https://example.invalid/lib.git\n")
    (tree / "third_party" / "lib").mkdir(parents=True)
    refused = imagegen(*args, "--work", tmp_path / "a", cwd=tmp_path, IMAGEGEN_AUDIT_PROBE="0")
    assert refused.returncode == 3, refused.stderr[-2000:]
    got = json.loads(refused.stdout)["audit"]
    (ext,) = got["extensions"]
    assert ext["include_missing"] == [
        {"path": "third_party/lib/include", "state": "missing", "submodule": "third_party/lib"}]
    (line,) = [r for r in got["refusals"] if "third_party/lib" in r]
    assert line.startswith("tiny_kernel._C: its include folder third_party/lib/include is missing, inside the git"
                           " submodule third_party/lib") and "git submodule update --init --recursive" in line
    assert "git submodule update" in refused.stderr.strip().splitlines()[-1]
    # The submodule checked out: the same cell is buildable, with nothing to say about its includes.
    (tree / "third_party" / "lib" / "include").mkdir()
    (tree / "third_party" / "lib" / "include" / "lib.h").write_text("#pragma once\n")
    ok = imagegen(*args, "--work", tmp_path / "b", cwd=tmp_path, IMAGEGEN_AUDIT_PROBE="0")
    assert ok.returncode == 0, ok.stderr[-2000:]
    audit = json.loads(ok.stdout)["audit"]
    assert audit["verdict"] == "ok" and "include_missing" not in audit["extensions"][0]
