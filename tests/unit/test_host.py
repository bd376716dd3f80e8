"""Tests for imagegen.executors.host: probing this host's toolchain (the interpreter's Python and
torch read without importing torch, CUDA_HOME found directly or through an nvcc wrapper, nvcc's
release, the GPUs nvidia-smi lists), the toolchain's description, and the pre-flight that turns a
recipe and archs into a native cell or a one-line CompatError. Stand-in interpreters, nvcc and
nvidia-smi are small executables in tmp_path, first on PATH."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from packaging.version import Version

from imagegen.errors import CompatError, EngineError
from imagegen.executors.host import gpus, nvcc_version, probe, probe_python
from imagegen.model.cell import HostToolchain
from imagegen.plan.matrix import preflight
from imagegen.model.arch_parse import parse_arch_list
from tests.unit.executor_fixtures import executable, python_stand_in, tiny_recipe


def _nvcc(path: Path, release: str) -> Path:
    return executable(path, f"#!/bin/sh\necho 'nvcc: NVIDIA (R) Cuda compiler driver'\n"
                            f"echo 'Cuda compilation tools, release {release}, V{release}.88'\n")


def _cuda_home(folder: Path, release: str) -> Path:
    """A CUDA toolkit folder as torch.utils.cpp_extension accepts it: bin/nvcc and the runtime headers."""
    _nvcc(folder / "bin" / "nvcc", release)
    (folder / "include").mkdir(parents=True)
    (folder / "include" / "cuda_runtime.h").write_text("/* stand-in */\n")
    return folder


def _nvidia_smi(bin_dir: Path, *lines: str) -> None:
    # Shell built-ins only: PATH is the stand-ins' folder alone.
    executable(bin_dir / "nvidia-smi", "#!/bin/sh\n" + "".join(f"echo '{line}'\n" for line in lines))


@pytest.fixture
def bin_dir(tmp_path, monkeypatch) -> Path:
    """An empty folder that is all of PATH: nothing of this machine's nvcc or nvidia-smi is seen."""
    folder = tmp_path / "bin"
    folder.mkdir()
    monkeypatch.setenv("PATH", str(folder))
    for var in ("CUDA_HOME", "CUDA_PATH", "PYTHONPATH"):
        monkeypatch.delenv(var, raising=False)
    return folder


def test_probe_takes_the_interpreters_answer_nvccs_release_and_the_gpus(tmp_path, bin_dir):
    cuda = _cuda_home(tmp_path / "cuda-13.0", "13.0")
    exe = python_stand_in(tmp_path / "python3.12", f"""
        import json, sys
        assert sys.argv[1] == "-c" and "cuda_home_candidates" in sys.argv[2]  # the probe script itself
        print("a sitecustomize banner that is not JSON")
        print(json.dumps({{"python": "3.12", "torch": "2.11.0", "torch_cuda": "13.0", "cuda_home": {str(cuda)!r}}}))
    """)
    _nvidia_smi(bin_dir, "NVIDIA H100 80GB HBM3, 9.0", "NVIDIA H100 80GB HBM3, 9.0", "NVIDIA RTX PRO 6000, 12.0")
    host = probe(str(exe))
    assert host == HostToolchain(python_exe=str(exe), python="3.12", torch="2.11.0", torch_cuda="13.0",
                                 cuda_home=str(cuda), nvcc=Version("13.0"),
                                 gpus=("NVIDIA H100 80GB HBM3 (9.0)", "NVIDIA H100 80GB HBM3 (9.0)",
                                       "NVIDIA RTX PRO 6000 (12.0)"))
    assert set(host.ccs) == {"9.0", "12.0"} and len(host.ccs) == 2  # one entry per compute capability
    assert host.describe() == ("Python 3.12, torch 2.11.0 (CUDA 13.0), nvcc 13.0, GPUs: NVIDIA H100 80GB HBM3 (9.0),"
                               " NVIDIA H100 80GB HBM3 (9.0), NVIDIA RTX PRO 6000 (12.0)")


def test_the_probe_script_reads_torch_from_its_metadata_without_importing_it(tmp_path, bin_dir, monkeypatch):
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("raise RuntimeError('the probe must not import torch')\n")
    (site / "torch" / "version.py").write_text("__version__ = '2.8.0+cu128'\ncuda = '12.8'\n")
    (site / "torch-2.8.0+cu128.dist-info").mkdir()
    (site / "torch-2.8.0+cu128.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: torch\nVersion: 2.8.0+cu128\n")
    monkeypatch.setenv("PYTHONPATH", str(site))
    cuda = _cuda_home(tmp_path / "cuda-12.8", "12.8")
    monkeypatch.setenv("CUDA_HOME", str(cuda))
    host = probe(sys.executable)
    assert (host.python, host.torch, host.torch_cuda) == ("%d.%d" % sys.version_info[:2], "2.8.0", "12.8")
    assert (host.cuda_home, host.nvcc, host.gpus) == (str(cuda), Version("12.8"), ())
    assert host.describe().endswith("nvcc 12.8, no GPU")


def test_the_probe_script_follows_an_nvcc_wrapper_to_its_toolkit(tmp_path, bin_dir):
    # A wrapper on PATH (like /usr/local/bin/nvcc -> exec /usr/local/cuda-13.0/bin/nvcc) whose own
    # folder has no headers: CUDA_HOME is the folder it execs into.
    cuda = _cuda_home(tmp_path / "toolkits" / "cuda-13.0", "13.0")
    executable(bin_dir / "nvcc", f"#!/bin/sh\nexec {cuda}/bin/nvcc \"$@\"\n")
    host = probe(sys.executable)
    assert host.cuda_home == str(cuda) and host.nvcc == Version("13.0")


def test_a_cuda_home_without_the_runtime_headers_is_passed_over(tmp_path, bin_dir, monkeypatch):
    headless = tmp_path / "headless"
    _nvcc(headless / "bin" / "nvcc", "12.4")  # nvcc, but no include/cuda_runtime.h
    cuda = _cuda_home(tmp_path / "cuda-12.8", "12.8")
    monkeypatch.setenv("CUDA_HOME", str(headless))
    monkeypatch.setenv("CUDA_PATH", str(cuda))
    assert probe(sys.executable).cuda_home == str(cuda)


@pytest.mark.parametrize("script, says", [
    ("import sys\nsys.stderr.write('Traceback (most recent call last):\\nSyntaxError: invalid syntax\\n')\n"
     "sys.exit(1)\n",
     "SyntaxError: invalid syntax"),
    ("print('{\"torch\": \"2.11.0\"}')\n", "no output"),  # JSON, but no Python version in it
    ("", "no output"),
])
def test_an_interpreter_that_does_not_answer_like_python_is_an_engine_error(tmp_path, bin_dir, script, says):
    exe = python_stand_in(tmp_path / "python", script)
    with pytest.raises(EngineError) as info:
        probe(str(exe))
    assert str(info.value) == f"cannot run {exe} as Python: {says}" and info.value.exit_code == 4


def test_probe_python_reads_an_interpreter_once_and_in_bounded_time(tmp_path):
    """render --shell --python-exe's probe (issue 34 item 3): Python, torch and its CUDA; no GPU or nvcc asked."""
    info = probe_python(sys.executable)
    assert info["python"] == "%d.%d" % sys.version_info[:2] and "torch" in info or "torch_error" in info
    slow = python_stand_in(tmp_path / "slow-python", "import time\ntime.sleep(30)\n")
    with pytest.raises(EngineError, match=r"did not answer within 1 s$"):
        probe_python(str(slow), timeout=1)


def test_a_missing_interpreter_is_named_in_the_error(tmp_path, bin_dir):
    with pytest.raises(EngineError, match=r"^Python interpreter .*/no-python not found$"):
        probe(str(tmp_path / "no-python"))
    not_executable = tmp_path / "python.txt"
    not_executable.write_text("print(1)\n")
    with pytest.raises(EngineError, match=r"^cannot run Python interpreter .*python\.txt: permission denied$"):
        probe(str(not_executable))


def test_nvcc_version_prefers_cuda_homes_nvcc_over_the_one_on_path(tmp_path, bin_dir):
    cuda = _cuda_home(tmp_path / "cuda", "12.8")
    _nvcc(bin_dir / "nvcc", "13.0")
    assert nvcc_version(str(cuda)) == Version("12.8")
    assert nvcc_version(None) == Version("13.0")
    assert nvcc_version(str(tmp_path / "no-toolkit")) == Version("13.0")  # no nvcc there: PATH's


def test_nvcc_version_skips_what_cannot_run_or_names_no_release(tmp_path, bin_dir):
    broken = tmp_path / "broken"
    (broken / "bin").mkdir(parents=True)
    (broken / "bin" / "nvcc").write_text("not executable")  # OSError on start: the next candidate
    assert nvcc_version(str(broken)) is None
    executable(bin_dir / "nvcc", "#!/bin/sh\necho 'nvcc: command wrapper, no toolkit'\nexit 1\n")
    assert nvcc_version(str(broken)) is None
    _nvcc(bin_dir / "nvcc", "12.6")
    assert nvcc_version(str(broken)) == Version("12.6")


def test_gpus_reads_name_and_compute_capability_from_nvidia_smi(bin_dir):
    _nvidia_smi(bin_dir, "NVIDIA A100-SXM4-80GB, 8.0", "garbage without a comma", "NVIDIA L4, 8.9")
    assert gpus() == ("NVIDIA A100-SXM4-80GB (8.0)", "NVIDIA L4 (8.9)")


def test_describe_says_what_is_missing():
    host = HostToolchain(python_exe="/usr/bin/python3", python="3.11", torch=None, torch_cuda=None, cuda_home=None,
                         nvcc=None, gpus=())
    assert host.describe() == "Python 3.11, torch missing (CUDA -), nvcc missing, no GPU"
    assert host.ccs == []


def _host(**changes) -> HostToolchain:
    fields = dict(python_exe="/opt/venv/bin/python", python="3.11", torch="2.11.0", torch_cuda="13.0", cuda_home=None,
                  nvcc=Version("13.0"), gpus=())
    fields.update(changes)
    return HostToolchain(**fields)


def test_preflight_makes_the_native_cell_of_this_hosts_toolchain():
    recipe = tiny_recipe()
    cell = preflight(recipe, recipe.version(None), parse_arch_list("8.0;9.0+PTX"), _host())
    assert cell.buildable and cell.flavor == "native" and cell.name == "tiny-kernel-0_1_0-torch2_11-cu130-py311"
    assert (cell.base.ref, cell.base.python, cell.base.toolkit, cell.base.nvcc) == ("native", "/opt/venv/bin/python",
                                                                                   "host", Version("13.0"))
    assert (cell.torch_version, cell.cuda.name, cell.python) == ("2.11.0", "cu130", "3.11")
    assert str(cell.archs) == "8.0;9.0+PTX"
    other = preflight(recipe, recipe.version(None), parse_arch_list("12.0"),
                      _host(torch="2.8.0", torch_cuda="12.8", nvcc=Version("12.8")))
    assert other.name == "tiny-kernel-0_1_0-torch2_8-cu128-py311" and other.base.nvcc == Version("12.8")


@pytest.mark.parametrize("changes, says", [
    ({"torch": None}, "torch is not importable by /opt/venv/bin/python: install the torch you build for first"),
    ({"nvcc": None}, "nvcc not found (looked in CUDA_HOME/bin and PATH)"),
    ({"torch_cuda": None}, "the installed torch 2.11.0 is a CPU-only build: install a CUDA build of torch"),
    ({"nvcc": Version("12.4")}, "this host has nvcc 12.4, but torch cu130 needs nvcc 13.x"),
    ({"python": "3.8"}, "cannot build tiny-kernel 0.1.0 torch 2.11.0 cu130 py3.8 arch 8.0 [native] here: "),
])
def test_preflight_refuses_what_this_host_cannot_build_in_one_line(changes, says):
    recipe = tiny_recipe()
    with pytest.raises(CompatError) as info:
        preflight(recipe, recipe.version(None), parse_arch_list("8.0"), _host(**changes))
    message = str(info.value)
    assert says in message and "\n" not in message and info.value.exit_code == 3


def test_preflight_names_an_arch_the_hosts_nvcc_dropped():
    recipe = tiny_recipe()
    with pytest.raises(CompatError, match=r"here: sm_50 was dropped in CUDA 13\.0"):
        preflight(recipe, recipe.version(None), parse_arch_list("5.0;9.0"), _host())
