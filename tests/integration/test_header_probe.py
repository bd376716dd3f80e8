"""The audit's header probe with real compilers and torch 2.14.1's real headers (issue 37).

torch 2.14's headers #error below C++20, and ATen/cuda/CUDAContextLight.h includes cusparse.h: the
probe must see both with the flags an extension's build records. An importable torch 2.14 would cost
its whole wheel (555 MB) and its CUDA libraries, so this test does not run a setup.py: it builds the
compile records torch 2.14's BuildExtension writes (its ninja rules: `$cxx -MMD -MF $out.d $cflags -c
$in -o $out $post_cflags`, `$nvcc -MD -MF $out.d $cuda_cflags -c $in -o $out $cuda_post_cflags`) for a
package whose setup.py passes ``extra_compile_args={"cxx": [..., STD], "nvcc": [..., STD]}``, with the
include paths and nvcc flags read from the wheel's own torch/utils/cpp_extension.py, and runs the
probe (imagegen_audit_probe.add_probe) and the judgement (imagegen.model.audit.judge) on them.

Fetched once per session, by HTTP range requests (tests/integration/wheel_members.py): torch 2.14.1's
``torch/include/`` (~14 MB of the 555 MB wheel) and the cuBLAS/cuSPARSE/cuSOLVER headers its
cuda-toolkit 13.0.3 pins (~4 MB each of wheels of 146-423 MB). The compilers are this host's g++ and
nvcc 13.0 at /usr/local/cuda; the toolkits are symlink farms of it, with those headers (and without
cusparse.h). A missing part fails the test, never skips it.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import sys
import sysconfig
import time
from pathlib import Path

import pytest
from packaging.version import Version
from wheel_members import extract, wheel_url

from imagegen.model.audit import judge

from imagegen.model.audit_report import AuditReport
from imagegen.model.arch_parse import parse_arch_list

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "imagegen" / "shipped" / "builder"))
import imagegen_audit  # noqa: E402  (the script shipped into builder images)
import imagegen_audit_probe  # noqa: E402
import imagegen_audit_records  # noqa: E402

CUDA = Path("/usr/local/cuda")
TORCH = ("torch", "2.14.1")
# torch 2.14.1 requires cuda-toolkit[cublas,cusolver,cusparse,...]==13.0.3, which pins these
CUDA_HEADERS = (("nvidia-cublas", "13.1.1.3"), ("nvidia-cusparse", "12.6.3.3"), ("nvidia-cusolver", "12.0.4.66"))
FETCHED: dict[str, object] = {}


def _fetch(project: str, version: str, wanted, dest: Path) -> None:
    name, url, size = wheel_url(project, version)
    FETCHED[name] = extract(url, size, wanted, dest)


@pytest.fixture(scope="session")
def headers(tmp_path_factory):
    """(torch's site folder with include/ and utils/cpp_extension.py, the CUDA libraries' include/)."""
    given = os.environ.get("IMAGEGEN_TEST_HEADER_CACHE")  # a folder kept between runs (development)
    cache = Path(given) if given else tmp_path_factory.mktemp("torch-2.14.1-headers")
    done = cache / ".complete"
    if not done.is_file():
        started = time.monotonic()
        _fetch(*TORCH, lambda n: n.startswith("torch/include/") or n == "torch/utils/cpp_extension.py", cache / "torch")
        for project, version in CUDA_HEADERS:
            _fetch(project, version, lambda n: n.startswith("nvidia/cu13/include/") and n.endswith(".h"), cache / "nvidia")
        done.write_text(json.dumps({"seconds": round(time.monotonic() - started, 1),
                                    "fetched": {k: v.__dict__ for k, v in FETCHED.items()}}, indent=1))
    site = cache / "torch" / "torch"
    for need in (site / "include" / "torch" / "extension.h", site / "include" / "ATen" / "cuda" / "CUDAContext.h",
                 site / "utils" / "cpp_extension.py", cache / "nvidia" / "nvidia" / "cu13" / "include" / "cusparse.h"):
        assert need.is_file(), f"{need} was not fetched"
    return site, cache / "nvidia" / "nvidia" / "cu13" / "include"


@pytest.fixture(scope="session")
def compilers():
    nvcc = CUDA / "bin" / "nvcc"
    gxx, gcc = shutil.which("g++"), shutil.which("gcc")
    missing = [what for what, ok in (("nvcc at /usr/local/cuda/bin", nvcc.is_file()), ("g++", gxx), ("gcc", gcc)) if not ok]
    if missing:
        pytest.fail(f"the header probe test needs {', '.join(missing)} (the CUDA 13.0 toolkit and GCC)")
    py_include = sysconfig.get_paths()["include"]
    if not Path(py_include, "Python.h").is_file():
        pytest.fail(f"the header probe test needs Python's headers ({py_include}/Python.h: torch/extension.h includes them)")
    return {"nvcc": [str(nvcc)], "cxx": [gxx], "cc": [gcc]}, py_include


def _toolkit(folder: Path, extra_include: Path, leave_out: tuple[str, ...] = ()) -> Path:
    """A CUDA_HOME: /usr/local/cuda's entries as symlinks, include/ with the CUDA libraries' headers
    added and ``leave_out`` missing."""
    folder.mkdir()
    for entry in CUDA.iterdir():
        if entry.name != "include":
            (folder / entry.name).symlink_to(entry)
    include = folder / "include"
    include.mkdir()
    for source in (CUDA / "include", extra_include):
        for entry in source.iterdir():
            if entry.name not in leave_out and not (include / entry.name).exists():
                (include / entry.name).symlink_to(entry)
    return folder


@pytest.fixture(scope="session")
def toolkits(headers, tmp_path_factory):
    _, cuda_include = headers
    base = tmp_path_factory.mktemp("toolkits")
    return {"full": _toolkit(base / "cuda", cuda_include),
            "no-cusparse": _toolkit(base / "cuda-no-cusparse", cuda_include, ("cusparse.h", "cusparse_v2.h"))}


def _cpp_extension_facts(site: Path) -> tuple[list[str], list[str]]:
    """include_paths("cuda") without CUDA_HOME/include, and COMMON_NVCC_FLAGS, as the wheel's own
    cpp_extension.py defines them (checked, not assumed)."""
    text = (site / "utils" / "cpp_extension.py").read_text()
    tree = ast.parse(text)
    nvcc_flags = next(ast.literal_eval(n.value) for n in ast.walk(tree) if isinstance(n, ast.Assign)
                      and any(getattr(t, "id", None) == "COMMON_NVCC_FLAGS" for t in n.targets))
    include_paths = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "include_paths")
    body = ast.get_source_segment(text, include_paths)
    assert "os.path.join(lib_include, 'torch', 'csrc', 'api', 'include')" in body and "_join_cuda_home('include')" in body
    assert "$cxx -MMD -MF $out.d $cflags -c $in -o $out $post_cflags" in text
    assert "$nvcc {nvcc_gendeps} $cuda_cflags -c $in -o $out $cuda_post_cflags" in text
    include = site / "include"
    return [str(include), str(include / "torch" / "csrc" / "api" / "include")], nvcc_flags


KERNEL = """#include <torch/extension.h>
%s
__global__ void add_one(float* x, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] += 1.f; }
"""


def _records(site: Path, cuda_home: Path, py_include: str, std: str, tmp: Path, modules=("_C",),
             stream_header: str = "#include <ATen/cuda/CUDAContext.h>") -> list[dict]:
    """What the audit's stand-ins record for a package with one .cpp and one .cu per extension whose
    setup.py hard-codes ``-std=STD`` for both compilers (torch adds its own -std only without one);
    the package's sources are written too (the audit reads whether they include ATen/cuda/ headers)."""
    torch_includes, nvcc_common = _cpp_extension_facts(site)
    includes = [f"-I{p}" for p in (*torch_includes, str(cuda_home / "include"), py_include)]
    build, src = tmp / "build" / "temp.linux-x86_64-cpython-311", tmp / "src"
    (src / "csrc").mkdir(parents=True, exist_ok=True)
    records = []
    for module in modules:
        (src / "csrc" / f"{module}.cpp").write_text("#include <torch/extension.h>\n")
        (src / "csrc" / f"{module}_k.cu").write_text(KERNEL % stream_header)
        defines = ["-DTORCH_API_INCLUDE_EXTENSION_H", f"-DTORCH_EXTENSION_NAME={module}"]
        cxx = ["-MMD", "-MF", f"{build}/{module}.o.d", "-Wsign-compare", "-DNDEBUG", "-g", "-fwrapv", "-O3", "-Wall",
               "-fPIC", *includes, "-c", f"{src}/csrc/{module}.cpp", "-o", f"{build}/{module}.o", "-O3", f"-std={std}",
               *defines]
        nvcc = ["-MD", "-MF", f"{build}/{module}_k.o.d", *includes, "-c", f"{src}/csrc/{module}_k.cu", "-o",
                f"{build}/{module}_k.o", *nvcc_common, "--compiler-options", "'-fPIC'", "-O3", f"-std={std}",
                *defines, "-gencode=arch=compute_90a,code=sm_90a", "-gencode=arch=compute_80,code=sm_80",
                "-ccbin", str(tmp / "stubs" / "cc")]
        records += [{"tool": "cxx", "cwd": str(build), "argv": cxx}, {"tool": "nvcc", "cwd": str(build), "argv": nvcc},
                    {"tool": "ld", "cwd": str(build), "argv": ["-shared", f"{build}/{module}.o", f"{build}/{module}_k.o",
                     "-o", f"{tmp}/build/lib.linux-x86_64-cpython-311/pkg/{module}.cpython-311-x86_64-linux-gnu.so"]}]
    return records


def _audit(records, real, tmp: Path, mode: str = "on"):
    """The report the audit step writes (fold, then the probe) and the judgement imagegen makes of it."""
    (tmp / "build" / "temp.linux-x86_64-cpython-311").mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, **{imagegen_audit.REAL_ENV: json.dumps(real)})
    report = imagegen_audit_records.fold(records, str(tmp / "src"))
    report.update({"ok": True, "exit": 0, "seconds": 0.0})
    imagegen_audit_probe.add_probe(report, records, env, str(tmp), mode, str(tmp / "src"))
    verdict = judge(AuditReport.from_json(report), recipe_name="pkg", version_label="0.1",
                    requested=parse_arch_list("8.0 9.0a"), nvcc=Version("13.0"))
    for run in report["probe"]["runs"]:
        print(f"probe {mode} {run['compiler']} {run['what']}: {run['ok']} in {run['seconds']} s {run['error']}")
    return report, verdict


STD_LINE = ("torch/csrc/api/include/torch/all.h:5:2: error: #error C++20 or later compatible compiler is required to"
            " use PyTorch.")


@pytest.mark.parametrize("mode", ["on", "full"])
def test_cxx17_is_refused_with_torch_2_14s_error_line(headers, compilers, toolkits, tmp_path, mode):
    site, _ = headers
    real, py_include = compilers
    report, verdict = _audit(_records(site, toolkits["full"], py_include, "c++17", tmp_path), real, tmp_path, mode)
    runs = {r["compiler"]: r for r in report["probe"]["runs"]}
    assert set(runs) == {"g++", "nvcc"}, report["probe"]
    for run in runs.values():
        assert run["ok"] is False and run["error"] == STD_LINE, run
    assert not verdict.ok
    assert f"_C: torch's headers do not compile with g++ and the build's own flags (header probe): {STD_LINE};" \
        " build with -std=c++20" in verdict.refusals[0]


def test_cxx20_passes_and_identical_flags_are_probed_once(headers, compilers, toolkits, tmp_path):
    site, _ = headers
    real, py_include = compilers
    # two extensions of one package: their flags differ only in -DTORCH_EXTENSION_NAME, which no header reads
    records = _records(site, toolkits["full"], py_include, "c++20", tmp_path, modules=("_a", "_b"))
    report, verdict = _audit(records, real, tmp_path)
    assert [(r["compiler"], r["ok"]) for r in report["probe"]["runs"]] == [("g++", True), ("nvcc", True)], report["probe"]
    assert all(r["modules"] == ["pkg._a", "pkg._b"] for r in report["probe"]["runs"])
    assert verdict.ok, verdict.refusals
    assert [p["what"] for p in report["extensions"][0]["probe"]] == ["preprocess", "preprocess"]


def test_a_toolkit_without_cusparse_h_is_refused_naming_it(headers, compilers, toolkits, tmp_path):
    site, _ = headers
    real, py_include = compilers
    report, verdict = _audit(_records(site, toolkits["no-cusparse"], py_include, "c++20", tmp_path), real, tmp_path)
    runs = {r["compiler"]: r for r in report["probe"]["runs"]}
    assert runs["g++"]["ok"] is True  # torch/extension.h alone needs no cuSPARSE
    assert runs["nvcc"]["ok"] is False
    assert runs["nvcc"]["error"] == "ATen/cuda/CUDAContextLight.h:10:10: fatal error: cusparse.h: No such file or directory"
    assert verdict.refusals == (
        f"pkg._C: torch's headers do not compile with nvcc and the build's own flags (header probe): {runs['nvcc']['error']};"
        " the CUDA toolkit (CUDA_HOME) has no cusparse.h: install its cusparse headers (the toolkit's cusparse development"
        " package, or the nvidia-cusparse wheel's include/ on the include path) (IMAGEGEN_AUDIT_PROBE=0 skips the probe)",)


def test_without_atens_cuda_headers_in_its_sources_a_missing_cusparse_h_is_a_warning(headers, compilers, toolkits,
                                                                                     tmp_path):
    # The package includes torch/extension.h only: its build never reads cusparse.h.
    site, _ = headers
    real, py_include = compilers
    records = _records(site, toolkits["no-cusparse"], py_include, "c++20", tmp_path, stream_header="")
    report, verdict = _audit(records, real, tmp_path)
    assert report["probe"]["aten_cuda_included"] is False
    assert verdict.ok and any("cusparse.h" in w and "its build may not need it" in w for w in verdict.warnings), verdict


def test_what_was_fetched(headers):
    """The download: a few MB of each wheel, never the wheel."""
    site, _ = headers
    info = json.loads((site.parent.parent / ".complete").read_text())
    print(json.dumps(info, indent=1))
    for name, got in info["fetched"].items():
        assert got["fetched_bytes"] < 40 << 20 and got["fetched_bytes"] < got["wheel_bytes"] / 5, (name, got)
