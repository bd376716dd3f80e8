"""Tests for imagegen.shipped.builder.imagegen_build (the in-build script, loaded by path as a module): its
job budget (the EXT_PARALLEL split, the imagegen_jobs secret), the PATH it gives the build, ninja on PATH,
its arch formats against imagegen's own, and retagging a wheel with the local version. Its fetch step
(imagegen_fetch.py) has tests/unit/test_imagegen_fetch.py."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from imagegen.model.arch_format import to_cmake, to_dotted_list, to_gencode, to_numeric_list, to_torch_arch_list
from imagegen.model.arch_parse import parse_arch_list
from imagegen.model.catalogue import load_catalogue
from imagegen.plan.matrix import make_cell
from imagegen.render.dockerfile import builder_script
from tests.unit.builder_script import BUILDENV, RECORDS, builder_module

B = builder_module("imagegen_build")
E = builder_module("imagegen_buildenv_unit", BUILDENV)  # the build's variables
R = builder_module("imagegen_records_unit", RECORDS)


# ------------------------------------------------------------------------------- job budget and PATH


def _sage_cell_doc(**extra):
    from imagegen.render.dockerfile import cell_document
    recipe = load_catalogue().get("sageattention")
    doc = cell_document(make_cell(recipe, recipe.version(None), "2.11", "13.0", "3.11", parse_arch_list("9.0"),
                                  "pypi"))
    doc.update(extra)
    return doc


def test_builder_splits_the_job_budget_between_sage_extensions(monkeypatch):
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    monkeypatch.setenv("MAX_JOBS", "16")
    monkeypatch.delenv("EXT_PARALLEL", raising=False)
    env = E.build_env(_sage_cell_doc())
    assert (env["EXT_PARALLEL"], env["MAX_JOBS"]) == ("4", "4")
    monkeypatch.setenv("MAX_JOBS", "1")  # seed 002's settings: one extension, one job
    env = E.build_env(_sage_cell_doc())
    assert (env["EXT_PARALLEL"], env["MAX_JOBS"]) == ("1", "1")


def test_job_settings_from_imagegens_bake_come_as_a_secret_and_win(monkeypatch, tmp_path):
    # imagegen's bake hands each batch's MAX_JOBS/NVCC_THREADS in the imagegen_jobs secret (no cache
    # key, unlike a build arg): it wins over the ARGs' environment; junk in it is ignored.
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    monkeypatch.setattr(E, "SECRETS", str(secrets))
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    monkeypatch.setenv("MAX_JOBS", "16")
    monkeypatch.setenv("NVCC_THREADS", "8")
    monkeypatch.delenv("EXT_PARALLEL", raising=False)
    assert E.jobs_from_secret() == {}  # no secret: the ARGs/environment as before
    (secrets / "imagegen_jobs").write_text("MAX_JOBS=2\nNVCC_THREADS=3\nPATH=/evil\nMAX_JOBS_X=9\n")
    assert E.jobs_from_secret() == {"MAX_JOBS": "2", "NVCC_THREADS": "3"}
    env = E.build_env(_sage_cell_doc())
    assert (env["EXT_PARALLEL"], env["MAX_JOBS"]) == ("2", "1") and env["PATH"] != "/evil"
    (secrets / "imagegen_jobs").write_text("MAX_JOBS=0\nNVCC_THREADS=lots\n")
    assert E.jobs_from_secret() == {}


def test_builder_leaves_path_alone_when_cuda_homes_nvcc_is_already_first(tmp_path):
    def toolkit(name):
        (tmp_path / name / "bin").mkdir(parents=True)
        nvcc = tmp_path / name / "bin" / "nvcc"
        nvcc.write_text("#!/bin/sh\n")
        nvcc.chmod(0o755)
        return tmp_path / name
    home, other = toolkit("cuda-13.0"), toolkit("cuda-12.8")
    (tmp_path / "cuda").symlink_to(home)  # /usr/local/cuda -> cuda-13.0, as on most hosts
    user_path = os.pathsep.join([str(tmp_path / "cuda" / "bin"), "/usr/bin"])
    # The user's nvcc is CUDA_HOME's (through the symlink): their PATH, untouched, so that a plain
    # `pip wheel` with the --print-env variables repeats the build exactly.
    assert E.path_with_nvcc(user_path, str(home)) == user_path
    # Another toolkit's nvcc first, or none at all: CUDA_HOME's bin goes in front.
    other_first = os.pathsep.join([str(other / "bin"), str(home / "bin")])
    assert E.path_with_nvcc(other_first, str(home)).split(os.pathsep) == [str(home / "bin"), str(other / "bin"), str(home / "bin")]
    assert E.path_with_nvcc("/usr/bin", str(home)).split(os.pathsep)[0] == str(home / "bin")
    assert E.path_with_nvcc("", str(home)) == str(home / "bin")




def test_a_native_build_with_a_venvs_python_finds_that_venvs_tools_first(tmp_path, monkeypatch, capsys):
    # NATTEN at torch >= 2.12 needs CMake >= 3.26; `pip install cmake` into the venv named by --python-exe
    # must be what the build runs, not Debian's 3.25 on PATH, as it would be with the venv activated.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    system = tmp_path / "usr-bin"
    for folder in (venv / "bin", system):
        folder.mkdir(exist_ok=True)
        (folder / "cmake").write_text("#!/bin/sh\n")
        (folder / "cmake").chmod(0o755)
    monkeypatch.setenv("PATH", str(system))
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    doc = _sage_cell_doc(venv=None, base_python=str(venv / "bin" / "python"), cuda_home=None)
    env = E.build_env(doc)
    assert shutil.which("cmake", path=env["PATH"]) == str(venv / "bin" / "cmake")
    assert env["PATH"] == os.pathsep.join([str(venv / "bin"), str(system)])
    assert f"PATH: {venv / 'bin'} first (the build's venv, as if activated" in capsys.readouterr().out
    monkeypatch.setenv("PATH", os.pathsep.join([str(system), str(venv / "bin")]))  # the user's own order: kept
    assert E.build_env(doc)["PATH"] == os.pathsep.join([str(system), str(venv / "bin")])
    plain = tmp_path / "opt" / "python"  # a Python that is no venv's (no pyvenv.cfg): PATH as it is
    (plain / "bin").mkdir(parents=True)
    monkeypatch.setenv("PATH", str(system))
    assert E.build_env(dict(doc, base_python=str(plain / "bin" / "python3")))["PATH"] == str(system)

def _other_venvs_ninja(tmp_path):
    """The H100 base image's case: the ninja package installed in another environment (its binary in
    that environment's bin/, named by its RECORD), and a build venv that sees that environment's
    site-packages through a .pth but has no ninja of its own, with neither bin/ on PATH."""
    other = tmp_path / "other"
    site = other / "lib" / "site"
    (site / "ninja").mkdir(parents=True)
    (site / "ninja" / "__init__.py").write_text("")
    info = site / "ninja-1.13.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ninja\nVersion: 1.13.0\n")
    (info / "RECORD").write_text("ninja/__init__.py,,\n../../bin/ninja,,\nninja-1.13.0.dist-info/RECORD,,\n")
    (other / "bin").mkdir()
    binary = other / "bin" / "ninja"
    binary.write_text("#!/bin/sh\necho 1.13.0\n")
    binary.chmod(0o755)
    build = tmp_path / "build-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(build)], check=True)
    purelib = subprocess.run([str(build / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    Path(purelib, "other-env.pth").write_text(str(site) + "\n")
    return build / "bin" / "python", binary


def test_ninja_from_a_package_whose_binary_is_not_on_path_is_put_in_front(tmp_path, capsys):
    py, binary = _other_venvs_ninja(tmp_path)
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    env = {"PATH": str(empty)}
    assert E.ninja_on_path(env, str(py)) == str(binary.parent)
    assert env["PATH"] == os.pathsep.join([str(binary.parent), str(empty)])
    # What torch's is_ninja_available() runs now finds it.
    assert subprocess.run(["ninja", "--version"], env=env, capture_output=True, text=True).stdout == "1.13.0\n"
    assert "ninja package's binary" in capsys.readouterr().out


def test_ninja_already_on_path_is_left_alone_and_none_at_all_is_said(tmp_path, capsys):
    py, binary = _other_venvs_ninja(tmp_path)
    on_path = {"PATH": str(binary.parent)}
    assert E.ninja_on_path(dict(on_path), str(py)) == ""
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    env = {"PATH": "/nonexistent"}
    assert E.ninja_on_path(env, str(bare / "bin" / "python")) is None
    assert env == {"PATH": "/nonexistent"}
    assert "one file after another" in capsys.readouterr().out


# ------------------------------------------------------------------------------ formats and retag


def test_builder_script_is_what_render_embeds():
    assert builder_script() == (Path(B.__file__)).read_text()


CANONICAL = st.lists(st.sampled_from(["7.5", "8.0", "8.6", "8.9", "9.0", "9.0a", "10.0", "10.0a", "10.0f", "12.0",
                                      "12.0a", "12.1"]), min_size=1, max_size=5)


@settings(max_examples=200, deadline=None)
@given(CANONICAL, st.lists(st.booleans(), min_size=5, max_size=5))
def test_builder_formats_agree_with_the_arch_model(entries, ptx_flags):
    text = ";".join(e + ("+PTX" if p else "") for e, p in zip(entries, ptx_flags))
    archs = parse_arch_list(text)
    canonical = str(archs)  # what the Dockerfile's ARG carries
    parsed = E.parse_archs(canonical)
    assert E.format_archs(parsed, "numeric") == to_numeric_list(archs)
    assert E.format_archs(parsed, "numeric", keep_variant=True) == to_numeric_list(archs, keep_variant=True)
    assert E.format_archs(parsed, "dotted") == to_dotted_list(archs)
    assert E.format_archs(parsed, "cmake") == to_cmake(archs)
    assert E.format_archs(parsed, "gencode") == " ".join(to_gencode(archs))
    if not any(a.variant == "f" for a in archs):
        assert E.format_archs(parsed, "torch") == to_torch_arch_list(archs)


def test_retag_rewrites_name_metadata_and_record(tmp_path):
    src = tmp_path / "demo-1.0-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(src, "w") as zf:
        zf.writestr("demo/__init__.py", "")
        zf.writestr("demo-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n")
        zf.writestr("demo-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\n")
        zf.writestr("demo-1.0.dist-info/RECORD", "")
    out = Path(B.retag(str(src), "cu128torch2.8", str(tmp_path)))
    assert out.name == "demo-1.0+cu128torch2.8-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(out) as zf:
        names = zf.namelist()
        assert "demo-1.0+cu128torch2.8.dist-info/METADATA" in names
        assert "Version: 1.0+cu128torch2.8" in zf.read("demo-1.0+cu128torch2.8.dist-info/METADATA").decode()
        record = zf.read("demo-1.0+cu128torch2.8.dist-info/RECORD").decode()
        assert "demo/__init__.py,sha256=" in record and not any(n.startswith("demo-1.0.dist-info") for n in names)
    # A wheel that already has a local version (the package's own knob) is left alone.
    assert B.retag(str(out), "x", str(tmp_path)) == str(out)


def test_retag_copies_compressed_entries_as_they_are_and_pip_installs_the_result(tmp_path):
    """The .so files are copied without a second deflate (seconds on a CUDA wheel), and the result is
    still a wheel that zip readers and pip accept."""
    payload = os.urandom(1 << 16) * 8 + bytes(1 << 18)  # compressible, like a cubin
    src = tmp_path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(src, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("demo/__init__.py", "VALUE = 42\n")
        zf.writestr("demo/_C.so", payload)
        zf.writestr("demo-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n")
        zf.writestr("demo-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr("demo-1.0.dist-info/RECORD", "")
    out = Path(B.retag(str(src), "cu130torch2.11", str(tmp_path)))
    with zipfile.ZipFile(src) as before, zipfile.ZipFile(out) as after:
        assert after.testzip() is None
        assert after.read("demo/_C.so") == payload
        assert after.getinfo("demo/_C.so").compress_size == before.getinfo("demo/_C.so").compress_size < len(payload)
        record = after.read("demo-1.0+cu130torch2.11.dist-info/RECORD").decode()
        digest = base64.urlsafe_b64encode(hashlib.sha256(payload).digest()).rstrip(b"=").decode()
        assert f"demo/_C.so,sha256={digest},{len(payload)}" in record
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(target), str(out)],
                   check=True)
    assert (target / "demo" / "_C.so").read_bytes() == payload
    assert (target / "demo-1.0+cu130torch2.11.dist-info").is_dir()



# ------------------------------------------------------------------------ gpu-check (RUN --device)
# The step runs the recipe's check on the GPU the build step was given. Here a stand-in `torch`
# package on PYTHONPATH stands in for the GPU alone (torch.cuda says what a real one would): the
# step, its subprocesses, the report, the build record and the exit status are the real ones.

FAKE_TORCH = '''__version__ = "2.11.0+cu130"


class _Cuda:
    @staticmethod
    def is_available():
        return {available}

    @staticmethod
    def get_device_capability(index=0):
        return (9, 0)

    @staticmethod
    def get_device_name(index=0):
        return "Fake H100"


cuda = _Cuda()
'''
WHEEL = "sageattention-2.2.0+cu130torch2.11-cp311-cp311-linux_x86_64.whl"


def _gpu_check_step(tmp_path, monkeypatch, code, *, available=True, timeout=None, torch_init=None, wheel=True):
    """A wheelhouse as the smoke step leaves it (a wheel and its build record), the check document as
    the Dockerfile's heredoc writes it, the cell document, and a fake torch on PYTHONPATH; then
    `imagegen_build.py gpu-check`. Returns (SystemExit or None, log folder, record path)."""
    fake = tmp_path / "fake-site"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text(torch_init or FAKE_TORCH.format(available=available))
    monkeypatch.setenv("PYTHONPATH", str(fake))
    wheels = tmp_path / "wheelhouse"
    wheels.mkdir()
    if wheel:
        (wheels / WHEEL).write_bytes(b"not really a wheel")
    record = wheels / (WHEEL + R.RECORD_SUFFIX)
    record.write_text(json.dumps({"wheel": WHEEL}))
    check = tmp_path / "gpu_check.json"
    check.write_text(json.dumps({"recipe": "sageattention", "device": "nvidia.com/gpu=all", "code": code}))
    logs = tmp_path / "logs"
    cell = tmp_path / "cell.json"
    # No venv at that path: the step runs the check with this interpreter (sys.executable).
    cell.write_text(json.dumps(_sage_cell_doc(venv=str(tmp_path / "no-venv"), log_dir=str(logs))))
    argv = ["--cell", str(cell), "gpu-check", "--wheels", str(wheels), "--check", str(check)]
    if timeout is not None:
        argv += ["--timeout", str(timeout)]
    try:
        B.main(argv)
    except SystemExit as exc:
        return exc, logs, record
    return None, logs, record


def test_gpu_check_passes_writes_its_report_and_the_wheels_record(tmp_path, monkeypatch, capsys):
    # A temporary folder of its own: other tests, running beside this one, run gpu checks in /tmp too.
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    code = "import torch\nassert torch.cuda.is_available()\nprint('cosine 0.9993')\n"
    exited, logs, record = _gpu_check_step(tmp_path, monkeypatch, code)
    assert exited is None
    report = json.loads((logs / "gpu_check.json").read_text())
    assert report["ok"] is True and "cosine 0.9993" in report["output"] and "error" not in report
    assert report["device"] == "Fake H100 (9.0)" and report["torch"] == "2.11.0+cu130"
    assert report["recipe"] == "sageattention" and report["cdi_device"] == "nvidia.com/gpu=all"
    doc = json.loads(record.read_text())
    assert doc["wheel"] == WHEEL and doc["gpu_check"]["ok"] is True and doc["gpu_check"] == report
    out = capsys.readouterr().out
    assert "gpu check: cosine 0.9993" in out and "gpu check: passed on Fake H100 (9.0)" in out
    assert list(temp.iterdir()) == []


def test_a_failing_gpu_check_fails_the_step_and_leaves_the_record_alone(tmp_path, monkeypatch, capsys):
    code = "import torch\nprint('cosine 0.0002')\nassert False, 'cosine 0.0002'\n"
    exited, logs, record = _gpu_check_step(tmp_path, monkeypatch, code)
    assert exited is not None and exited.code not in (0, None)
    report = json.loads((logs / "gpu_check.json").read_text())
    assert report["ok"] is False and "cosine 0.0002" in report["error"]
    assert report["error"].startswith("AssertionError")
    assert json.loads(record.read_text()) == {"wheel": WHEEL}  # no gpu_check: the wheel is not passed
    err = capsys.readouterr().err
    assert f"gpu check of {WHEEL} failed on Fake H100 (9.0)" in err and "cosine 0.0002" in err


def test_gpu_check_without_a_gpu_fails_before_running_the_check(tmp_path, monkeypatch, capsys):
    marker = tmp_path / "ran"
    exited, logs, record = _gpu_check_step(tmp_path, monkeypatch, f"open({str(marker)!r}, 'w').close()\n",
                                           available=False)
    assert exited is not None and exited.code not in (0, None)
    err = capsys.readouterr().err
    assert "no CUDA GPU in this build step" in err and "torch.cuda.is_available() is False" in err
    assert "nvidia.com/gpu=all" in err and "imagegen cdi-spec" in err
    assert not marker.exists() and not (logs / "gpu_check.json").exists()
    assert json.loads(record.read_text()) == {"wheel": WHEEL}


def test_gpu_check_without_torch_says_why_there_is_no_gpu(tmp_path, monkeypatch, capsys):
    exited, _, _ = _gpu_check_step(tmp_path, monkeypatch, "print('x')\n",
                                   torch_init="raise ImportError('libcuda.so.1: cannot open')\n")
    assert exited is not None and exited.code not in (0, None)
    err = capsys.readouterr().err
    assert "no CUDA GPU in this build step" in err and "ImportError: libcuda.so.1: cannot open" in err


def test_a_gpu_check_that_hangs_is_stopped_and_fails(tmp_path, monkeypatch, capsys):
    code = "import time\nprint('started', flush=True)\ntime.sleep(60)\n"
    started = time.monotonic()
    exited, logs, record = _gpu_check_step(tmp_path, monkeypatch, code, timeout=1)
    assert time.monotonic() - started < 30
    assert exited is not None and exited.code not in (0, None)
    report = json.loads((logs / "gpu_check.json").read_text())
    assert report["ok"] is False and report["error"] == "did not finish within 1 s"
    assert "did not finish within" in capsys.readouterr().err
    assert json.loads(record.read_text()) == {"wheel": WHEEL}


def test_gpu_check_with_no_wheel_fails(tmp_path, monkeypatch, capsys):
    exited, logs, _ = _gpu_check_step(tmp_path, monkeypatch, "print('x')\n", wheel=False)
    assert exited is not None and exited.code not in (0, None)
    assert "no wheel in" in capsys.readouterr().err and not logs.exists()
