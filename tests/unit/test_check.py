"""imagegen check: the recipe's numerical GPU check against a wheel, in a fresh interpreter.

No GPU here: the interpreter's real answer (this venv's torch, or its absence) must give the
dedicated exit code 8 and one line. The rest of the flow (recipe from the wheel's distribution,
the wheel unpacked into a temporary folder, the check run from an empty folder, its pass, failure,
crash or time limit) runs for real with a stand-in `torch` package on PYTHONPATH whose
cuda.is_available() answers as told, and recipes (in a temporary --recipe-dir) whose gpu_check is
plain Python."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from imagegen.finish.check import GpuCheckError, NoGpuError, probe_gpu, recipe_for, require_gpu, wheel_distribution
from imagegen.errors import RecipeError, UsageError
from imagegen.model.catalogue import load_catalogue
from tests.unit.test_verify import SO_NAME, fatbin_container, imagegen, make_wheel, no_cuobjdump

RECIPE = """\
schema: 1
name: {name}
distribution: {dist}
description: "a demo kernel"
source:
  git: https://github.com/example/demo.git
versions:
  "1.0":
    ref: v1.0
    commit: 0123456789abcdef0123456789abcdef01234567
    archs: ["8.0", "9.0"]
arch:
  env: TORCH_CUDA_ARCH_LIST
  style: torch
smoke:
  imports: [{imports}]
"""


def recipe_dir(tmp_path: Path, gpu_check: str | None, *, name: str = "demo-kernel", dist: str = "demo_kernel",
               imports: str = "demo_kernel") -> Path:
    d = tmp_path / "recipes"
    d.mkdir(parents=True, exist_ok=True)
    text = RECIPE.format(name=name, dist=dist, imports=imports)
    if gpu_check is not None:
        text += "  gpu_check: |\n" + textwrap.indent(textwrap.dedent(gpu_check).strip() + "\n", "    ")
    (d / f"{name}.yaml").write_text(text)
    return d


def demo_wheel(tmp_path: Path) -> Path:
    """demo_kernel: pure Python `demo_kernel.scale` (what the check calls) and a CUDA extension."""
    folder = tmp_path / "dist"
    folder.mkdir(exist_ok=True)
    return make_wheel(folder, {SO_NAME: fatbin_container("sm_90", "compute_90")}, extra={
        "demo_kernel/__init__.py": "import torch\nFROM = __file__\n\ndef scale(xs, k):\n    return [k * x for x in xs]\n"})


def fake_torch(tmp_path: Path, *, cuda: bool) -> Path:
    """A `torch` package whose cuda.is_available() says ``cuda``: stands in for torch on a GPU machine."""
    root = tmp_path / ("torch-gpu" if cuda else "torch-nogpu")
    (root / "torch").mkdir(parents=True, exist_ok=True)
    (root / "torch" / "__init__.py").write_text(textwrap.dedent(f"""\
        __version__ = "9.9.9+fake"
        class cuda:
            @staticmethod
            def is_available():
                return {cuda}
            @staticmethod
            def get_device_name(i=0):
                return "Fake GPU"
            @staticmethod
            def get_device_capability(i=0):
                return (9, 0)
        """))
    return root


PASSING = """\
import os, torch, demo_kernel
assert torch.cuda.is_available()
assert os.listdir(".") == [], "the check runs from an empty folder"
got = demo_kernel.scale([1.0, 2.0], 3.0)
assert got == [3.0, 6.0], got
print(f"demo_kernel vs reference max abs err {max(abs(a - b) for a, b in zip(got, [3.0, 6.0])):.5f}")
print("from", demo_kernel.FROM.split(os.sep)[-3])
"""


# --------------------------------------------------------------------------------- recipe lookup


def test_recipe_is_found_by_the_wheels_distribution():
    cat = load_catalogue()
    assert recipe_for(cat, "sageattention").name == "sageattention"
    assert recipe_for(cat, "flash-attn").name == "flash-attn"  # wheel names normalise _ to -
    assert recipe_for(cat, "flash_attn_3").name == "flash-attn-3"
    assert recipe_for(cat, "Block_Sparse_Attn").name == "block-sparse-attn"
    assert recipe_for(cat, "tiny-kernel", "sage").name == "sageattention"  # --recipe wins
    with pytest.raises(RecipeError, match=r"no recipe builds distribution tiny-kernel .*--recipe") as err:
        recipe_for(cat, "tiny-kernel")
    assert err.value.exit_code == 2
    with pytest.raises(RecipeError, match="unknown recipe 'nope'"):
        recipe_for(cat, "sageattention", "nope")


def test_two_recipes_for_one_distribution_ask_for_recipe(tmp_path):
    d = recipe_dir(tmp_path, None)
    recipe_dir(tmp_path, None, name="demo-kernel-alt")
    cat = load_catalogue((d,))
    with pytest.raises(RecipeError, match="several recipes build distribution demo-kernel: demo-kernel, demo-kernel-alt"):
        recipe_for(cat, "demo-kernel")


def test_wheel_input_errors(tmp_path):
    with pytest.raises(UsageError, match="no such wheel file"):
        wheel_distribution(tmp_path / "missing.whl")
    bad_name = tmp_path / "notawheel.whl"
    bad_name.write_bytes(b"PK")
    with pytest.raises(UsageError, match="not a valid wheel file name"):
        wheel_distribution(bad_name)
    not_zip = tmp_path / "demo-1.0-py3-none-any.whl"
    not_zip.write_bytes(b"not a zip")
    with pytest.raises(UsageError, match="not a readable wheel"):
        wheel_distribution(not_zip)
    assert wheel_distribution(demo_wheel(tmp_path)) == "demo-kernel"


# ------------------------------------------------------------------------- the real interpreter


def test_this_interpreter_says_why_it_cannot_check(tmp_path):
    """The test venv's own Python: no torch (the usual case here), or torch without a GPU."""
    if importlib.util.find_spec("torch") is None:
        expected = f"imagegen: error: torch is not importable by {sys.executable} (ModuleNotFoundError: No module named 'torch')"
    else:
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has a GPU: the no-GPU path cannot be shown with the real torch")
        expected = f"imagegen: error: no CUDA GPU visible to {sys.executable} (torch {torch.__version__}"
    wheel = demo_wheel(tmp_path)
    proc = imagegen("check", wheel, "--recipe-dir", recipe_dir(tmp_path, PASSING), "--python", sys.executable)
    assert proc.returncode == 8, proc.stderr
    assert proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1
    assert proc.stderr.startswith(expected)
    # The library says the same.
    info = probe_gpu(sys.executable, cwd=tmp_path)
    assert not info.usable
    with pytest.raises(NoGpuError) as err:
        require_gpu(info)
    assert err.value.exit_code == 8


def test_torch_without_a_gpu_gives_exit_8(tmp_path):
    wheel = demo_wheel(tmp_path)
    proc = imagegen("check", wheel, "--recipe-dir", recipe_dir(tmp_path, PASSING),
                    env={"PYTHONPATH": str(fake_torch(tmp_path, cuda=False))})
    assert proc.returncode == 8
    assert proc.stderr.strip() == (f"imagegen: error: no CUDA GPU visible to {sys.executable} (torch 9.9.9+fake:"
                                   " torch.cuda.is_available() is False): the numerical check needs one; run it on"
                                   " the GPU machine")


# ------------------------------------------------------------------- the check, with a stand-in GPU


def test_a_passing_check_prints_its_line_and_exits_0(tmp_path, monkeypatch):
    # A same-named package in the caller's folder must not shadow the wheel.
    caller = tmp_path / "caller"
    (caller / "demo_kernel").mkdir(parents=True)
    (caller / "demo_kernel" / "__init__.py").write_text("raise ImportError('the source tree, not the wheel')\n")
    wheel = demo_wheel(tmp_path)
    proc = imagegen("check", wheel, "--recipe-dir", recipe_dir(tmp_path, PASSING), cwd=caller,
                    env={"PYTHONPATH": str(fake_torch(tmp_path, cuda=True))})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["demo_kernel vs reference max abs err 0.00000", "from site"]
    assert proc.stderr.startswith(f"passed: demo-kernel gpu_check of {wheel.name} on Fake GPU (9.0), torch 9.9.9+fake, in ")
    proc = imagegen("check", wheel, "--recipe-dir", recipe_dir(tmp_path, PASSING), "--json", cwd=caller,
                    env={"PYTHONPATH": str(fake_torch(tmp_path, cuda=True))})
    got = json.loads(proc.stdout)
    assert proc.returncode == 0 and got["status"] == "passed" and got["imports"] == {"demo_kernel": "ok"}
    assert got["output"][0] == "demo_kernel vs reference max abs err 0.00000" and got["device"] == "Fake GPU (9.0)"


@pytest.mark.parametrize("check, message", [
    ("import demo_kernel\ncos = 0.5\nassert cos > 0.99, f'cosine similarity {cos:.4f} <= 0.99'\n",
     "failed (gpu_check line 3): AssertionError: cosine similarity 0.5000 <= 0.99"),
    ("import demo_kernel\nprint('starting')\ndemo_kernel.scale(None, 2)\n",
     "failed (gpu_check line 3): TypeError: 'NoneType' object is not iterable"),
    ("import sys\nsys.exit('kernel image missing for sm_90')\n",
     "failed (gpu_check line 2): SystemExit: kernel image missing for sm_90"),
    ("import os\nos._exit(3)\n", "died (exit 3) before it finished"),
], ids=["assertion", "exception", "sys-exit", "crash"])
def test_a_failing_check_is_one_line_and_exit_6(tmp_path, check, message):
    wheel = demo_wheel(tmp_path)
    proc = imagegen("check", wheel, "--recipe-dir", recipe_dir(tmp_path, check),
                    env={"PYTHONPATH": str(fake_torch(tmp_path, cuda=True))})
    assert proc.returncode == 6, proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in proc.stderr
    assert err[0].startswith(f"imagegen: error: demo-kernel gpu_check of {wheel.name} {message}"), err[0]


def test_a_check_over_its_time_is_killed(tmp_path):
    wheel = demo_wheel(tmp_path)
    proc = imagegen("check", wheel, "--recipe-dir", recipe_dir(tmp_path, "import time\ntime.sleep(60)\n"),
                    "--timeout", "2", env={"PYTHONPATH": str(fake_torch(tmp_path, cuda=True))})
    assert proc.returncode == 6
    assert proc.stderr.strip() == (f"imagegen: error: demo-kernel gpu_check of {wheel.name} did not finish within"
                                   " 2 s (--timeout)")


def test_a_module_that_does_not_import_fails_before_the_check(tmp_path):
    wheel = demo_wheel(tmp_path)
    proc = imagegen("check", wheel, "--recipe-dir", recipe_dir(tmp_path, PASSING, imports="demo_kernel, demo_kernel.gone"),
                    env={"PYTHONPATH": str(fake_torch(tmp_path, cuda=True))})
    assert proc.returncode == 6
    assert "did not run: " in proc.stderr and "`import demo_kernel.gone` failed: ModuleNotFoundError" in proc.stderr


def test_a_routed_extension_the_wheels_list_left_out_is_not_imported(tmp_path):
    # SageAttention's _qattn_sm90 is built only for a list with 9.0: a 12.0+PTX wheel has none, and its
    # check must not fail on it. A module the recipe does not route must still import (test above).
    wheel = demo_wheel(tmp_path)
    d = recipe_dir(tmp_path, PASSING, imports="demo_kernel, demo_kernel._hopper")
    text = (d / "demo-kernel.yaml").read_text()
    (d / "demo-kernel.yaml").write_text(text.replace('    archs: ["8.0", "9.0"]\n', '    archs: ["8.0", "9.0"]\n'
                                                     '    extensions:\n      demo_kernel._hopper: {archs: ["9.0"]}\n'))
    proc = imagegen("check", wheel, "--recipe-dir", d, "--json", env={"PYTHONPATH": str(fake_torch(tmp_path, cuda=True))})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["imports"] == {"demo_kernel": "ok"}


# ---------------------------------------------------------------------------- bad input, CLI


def test_bad_input_is_one_line_and_never_a_traceback(tmp_path):
    wheel = demo_wheel(tmp_path)
    cases = [
        (["check", tmp_path / "missing.whl"], 2, "no such wheel file"),
        (["check", Path(__file__)], 2, "not a valid wheel file name"),
        (["check", wheel], 2, "no recipe builds distribution demo-kernel"),
        (["check", wheel, "--recipe", "nope"], 2, "unknown recipe 'nope'"),
        (["check", wheel, "--recipe-dir", recipe_dir(tmp_path, None)], 2, "recipe demo-kernel has no smoke.gpu_check"),
        (["check", wheel, "--recipe", "sage", "--python", tmp_path / "no-python"], 2, "no such executable interpreter"),
        (["check", wheel, "--recipe", "sage", "--python", "/bin/true"], 2, "cannot run /bin/true as Python"),
        (["check", wheel, "--recipe", "sage", "--timeout", "0"], 2, "--timeout must be a positive number"),
    ]
    for argv, code, text in cases:
        proc = imagegen(*argv)
        err = proc.stderr.strip().splitlines()
        assert proc.returncode == code and len(err) == 1 and text in err[0], (argv, proc.returncode, proc.stderr)
        assert "Traceback" not in proc.stderr


def test_check_on_a_gpu_failure_is_a_verify_error():
    assert issubclass(GpuCheckError, Exception) and GpuCheckError("x").exit_code == 6


# --------------------------------------------------------------------------------- verify --gpu


@no_cuobjdump
def test_verify_gpu_runs_the_check_after_verify(tmp_path):
    wheel = demo_wheel(tmp_path)
    rd = recipe_dir(tmp_path, PASSING)
    proc = imagegen("verify", wheel, "--arch", "9.0+PTX", "--gpu", "--recipe-dir", rd,
                    env={"PYTHONPATH": str(fake_torch(tmp_path, cuda=True))})
    assert proc.returncode == 0, proc.stderr
    assert "     gpu_check: demo_kernel vs reference max abs err 0.00000" in proc.stdout.splitlines()
    assert "     gpu_check passed on Fake GPU (9.0) in " in proc.stdout
    proc = imagegen("verify", wheel, "--arch", "9.0+PTX", "--gpu", "--recipe-dir", rd, "--json",
                    env={"PYTHONPATH": str(fake_torch(tmp_path, cuda=True))})
    (got,) = json.loads(proc.stdout)
    assert proc.returncode == 0 and got["gpu_check"]["status"] == "passed"
    # No GPU: the verify result is printed, then exit 8.
    proc = imagegen("verify", wheel, "--arch", "9.0+PTX", "--gpu", "--recipe-dir", rd,
                    env={"PYTHONPATH": str(fake_torch(tmp_path, cuda=False))})
    assert proc.returncode == 8 and proc.stdout.startswith(f"ok   {wheel.name}")
    assert "no CUDA GPU visible" in proc.stderr
    # A failing check fails the wheel (exit 6) and says why.
    failing = recipe_dir(tmp_path / "f", "assert False, 'cosine similarity 0.1000 <= 0.99'\n")
    proc = imagegen("verify", wheel, "--arch", "9.0+PTX", "--gpu", "--recipe-dir", failing,
                    env={"PYTHONPATH": str(fake_torch(tmp_path, cuda=True))})
    assert proc.returncode == 6 and "AssertionError: cosine similarity 0.1000 <= 0.99" in proc.stderr


def test_help_names_the_exit_codes():
    proc = subprocess.run([sys.executable, "-m", "imagegen", "check", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "8: no torch or no CUDA GPU" in " ".join(proc.stdout.split())


def test_unpacked_wheel_goes_away(tmp_path):
    """Nothing of the wheel is left behind (Importer's temporary folder is removed)."""
    # A temporary folder of its own: other tests, running beside this one, unpack wheels in /tmp too.
    temp = tmp_path / "temp"
    temp.mkdir()
    wheel = demo_wheel(tmp_path)
    proc = imagegen("check", wheel, "--recipe-dir", recipe_dir(tmp_path, PASSING),
                    env={"PYTHONPATH": str(fake_torch(tmp_path, cuda=True)), "TMPDIR": str(temp)})
    assert proc.returncode == 0
    assert list(temp.iterdir()) == []
    with zipfile.ZipFile(wheel) as zf:  # and the wheel itself is untouched
        assert "demo_kernel/__init__.py" in zf.namelist()


def test_one_gpu_probe_for_imagegen_check_and_the_builds_gpu_check_step():
    # Issue 33: the probe lived twice (check.py and the build script); both now run imagegen_wheeltools'
    # and read its answer the same way: the marked line, whatever else the interpreter printed.
    from imagegen.render.dockerfile import builder_files
    from imagegen.shipped.builder import imagegen_wheeltools as wheeltools
    script = builder_files()["imagegen_check.py"]  # the build's gpu-check step
    assert "wheeltools.GPU_PROBE" in script and "torch.cuda.get_device_capability(0)" not in script
    out = "a warning from torch\n" + wheeltools.GPU_PROBE_MARK + '{"torch": "2.11.0", "device": "H100 (9.0)"}\n'
    assert wheeltools.gpu_probe_answer(out) == {"torch": "2.11.0", "device": "H100 (9.0)"}
    for broken in ("", "no mark\n", wheeltools.GPU_PROBE_MARK + "{not json", wheeltools.GPU_PROBE_MARK + "[1]"):
        assert wheeltools.gpu_probe_answer(broken) is None
    # the program itself, run by this interpreter (no torch here: the answer says so, it does not crash)
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-c", wheeltools.GPU_PROBE], capture_output=True, text=True, timeout=120)
    answer = wheeltools.gpu_probe_answer(proc.stdout)
    assert answer is not None and ("error" in answer or "device" in answer), proc.stdout + proc.stderr
