"""Tests for imagegen.executors.import_test: which modules a wheel installs, the Importer (a child
Python that loads torch first, imports from the unpacked wheel in an empty folder, leaves nothing
behind), the driver-missing forms reported as skipped, one-line failures, and the recipe's smoke
imports run through smoke_test. All with real small wheels and real child interpreters."""

from __future__ import annotations

import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

from imagegen.errors import BuildError
from imagegen.executors.host import HostToolchain
from imagegen.executors.import_test import Importer, import_test, smoke_test, wheel_modules
from imagegen.model.arch_parse import parse_arch_list
from imagegen.model.catalogue import load_catalogue
from imagegen.plan.matrix import make_cell
from tests.unit.executor_fixtures import WHEEL, pure_wheel, temp_files_under, tiny_cell


@pytest.fixture(autouse=True)
def _temp_files(tmp_path, monkeypatch):
    """Temporary files (the import test's folder, verify's extracted .so files) under tmp_path."""
    temp_files_under(tmp_path, monkeypatch)


def _host() -> HostToolchain:
    return HostToolchain(python_exe=sys.executable, python="3.11", torch="2.11.0", torch_cuda="13.0", cuda_home=None,
                         nvcc=None, gpus=())


def test_wheel_modules_lists_packages_modules_and_nested_extensions(tmp_path):
    wheel = tmp_path / "pkg-1.0-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name in ("pkg/__init__.py", "pkg/sub/__init__.py", "pkg/ops.py", "pkg/_C.cpython-311-x86_64-linux-gnu.so",
                     "pkg/kernels/_hopper.cpython-311-x86_64-linux-gnu.so",
                     "helper.py", "_top_ext.abi3.so", "pkg-1.0.dist-info/METADATA", "pkg-1.0.dist-info/RECORD",
                     "pkg-1.0.data/scripts/tool.py", "pkg-1.0.data/purelib/hidden/__init__.py", "README.txt"):
            zf.writestr(name, "")
    assert wheel_modules(wheel) == ["_top_ext", "helper", "pkg", "pkg._C", "pkg.kernels._hopper"]


def test_wheel_modules_leaves_out_bundled_shared_libraries(tmp_path):
    # auditwheel repair copies the libraries an extension links into <dist>.libs/ with a versioned
    # name; they are not importable modules, so an import test must not try them.
    wheel = tmp_path / "pkg-1.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name in ("pkg/__init__.py", "pkg/_C.cpython-311-x86_64-linux-gnu.so",
                     "pkg.libs/libcudart-1a2b3c4d.so.12.8.90", "pkg-1.0.dist-info/RECORD"):
            zf.writestr(name, "")
    assert wheel_modules(wheel) == ["pkg", "pkg._C"]


def test_wheel_modules_of_the_fixture_wheel():
    assert wheel_modules(WHEEL) == ["tiny_kernel", "tiny_kernel._C"]


def test_import_test_reports_ok_per_module_even_when_a_module_prints(tmp_path):
    wheel = pure_wheel(tmp_path / "demo-1.0-py3-none-any.whl", {
        "demo/__init__.py": "print('loading demo...')\n",
        "demo/ops.py": "import sys\nprint('{not json', file=sys.stdout)\n",
    })
    assert import_test(wheel, ["demo", "demo.ops"], sys.executable) == {"demo": "ok", "demo.ops": "ok"}


@pytest.mark.parametrize("why", [
    "libcuda.so.1: cannot open shared object file: No such file or directory",
    "CUDA driver version is insufficient for CUDA runtime version",
    "Found no NVIDIA driver on your system",
])
def test_a_module_that_needs_the_gpu_driver_is_skipped_not_passed(tmp_path, why):
    wheel = pure_wheel(tmp_path / "demo-1.0-py3-none-any.whl", {
        "demo/__init__.py": "",
        "demo/_cuda.py": f"raise OSError({why!r} + ' ' + 'x' * 300)\n",
    })
    got = import_test(wheel, ["demo", "demo._cuda"], sys.executable)
    assert got["demo"] == "ok"
    skipped = got["demo._cuda"]
    assert skipped.startswith(f"skipped: needs a GPU driver (OSError: {why}")
    assert len(skipped) == len("skipped: needs a GPU driver ()") + 160  # the reason is cut short


def test_a_failing_import_is_one_bounded_line_naming_the_wheel_and_module(tmp_path):
    wheel = pure_wheel(tmp_path / "demo-1.0-py3-none-any.whl", {
        "demo/__init__.py": "",
        "demo/_ext.py": "raise ImportError('undefined symbol: _ZN3c10\\nsecond line ' + 'y' * 600)\n",
    })
    with pytest.raises(BuildError) as info:
        import_test(wheel, ["demo", "demo._ext"], sys.executable)
    message = str(info.value)
    assert message.startswith("demo-1.0-py3-none-any.whl: `import demo._ext` failed: ImportError: undefined symbol")
    assert "\n" not in message and len(message) < 400 and info.value.exit_code == 5


def test_a_missing_module_is_a_failure(tmp_path):
    wheel = pure_wheel(tmp_path / "demo-1.0-py3-none-any.whl", {"demo/__init__.py": ""})
    with pytest.raises(BuildError, match=r"`import demo\._C` failed: ModuleNotFoundError: No module named 'demo\._C'"):
        import_test(wheel, ["demo._C"], sys.executable)


def test_the_importer_loads_torch_before_the_wheels_modules(tmp_path, monkeypatch):
    # An extension links against libtorch, which only `import torch` loads: the importer does it first.
    fake = tmp_path / "site" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("import builtins\nbuiltins.IMAGEGEN_TEST_TORCH_LOADED = True\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    wheel = pure_wheel(tmp_path / "demo-1.0-py3-none-any.whl", {
        "demo/__init__.py": "import builtins, sys\nassert builtins.IMAGEGEN_TEST_TORCH_LOADED\n"
                            "assert 'torch' in sys.modules\n",
    })
    assert import_test(wheel, ["demo"], sys.executable) == {"demo": "ok"}


def test_the_importer_runs_in_an_empty_folder_of_its_own_and_leaves_nothing(tmp_path, monkeypatch):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    wheel = pure_wheel(tmp_path / "demo-1.0-py3-none-any.whl", {
        # Imported from the unpacked copy in the importer's folder, which is its working directory.
        "demo/__init__.py": "import os\nhere = os.path.dirname(os.path.abspath(__file__))\n"
                            "assert os.path.basename(os.getcwd()).startswith('imagegen-smoke-')\n"
                            "assert here == os.path.join(os.getcwd(), 'site', 'demo'), (here, os.getcwd())\n"
                            "assert os.listdir(os.getcwd()) == ['site']\n",
    })
    with Importer(sys.executable) as importer:
        (folder,) = scratch.iterdir()
        assert folder.name.startswith("imagegen-smoke-") and importer.tmp == folder
        assert importer.run(wheel, ["demo"]) == {"demo": "ok"}
    assert list(scratch.iterdir()) == []
    # An importer closed without being asked anything leaves nothing either.
    Importer(sys.executable).close()
    assert list(scratch.iterdir()) == []


def test_an_interpreter_that_cannot_start_raises_and_leaves_no_folder(tmp_path, monkeypatch):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    with pytest.raises(FileNotFoundError):
        Importer(str(tmp_path / "no-such-python"))
    assert list(scratch.iterdir()) == []


def test_smoke_test_imports_the_recipes_modules_and_skips_driver_imports(tmp_path):
    # SageAttention's recipe: three CPU imports, and _qattn_sm90, which needs the driver.
    recipe = load_catalogue().get("sageattention")
    cell = make_cell(recipe, recipe.version(None), "2.11", "13.0", "3.11", parse_arch_list("9.0"), "pypi")
    assert cell.recipe.smoke.driver_imports == ("sageattention._qattn_sm90",)
    wheel = pure_wheel(tmp_path / "sageattention-2.2.0-py3-none-any.whl", {
        "sageattention/__init__.py": "", "sageattention/_qattn_sm80.py": "", "sageattention/_fused.py": "",
        "sageattention/_qattn_sm90.py": "raise ImportError('libcuda.so.1: cannot open shared object file')\n",
    }, name="sageattention", version="2.2.0")
    got = smoke_test(wheel, cell, _host())
    assert list(got) == ["sageattention", "sageattention._qattn_sm80", "sageattention._fused",
                         "sageattention._qattn_sm90"]
    assert got["sageattention._fused"] == "ok"
    assert got["sageattention._qattn_sm90"].startswith("skipped: needs a GPU driver")


def test_smoke_test_of_the_fixture_wheel_with_an_importer_started_early():
    with Importer(sys.executable) as importer:
        assert smoke_test(WHEEL, tiny_cell(), _host(), importer) == {"tiny_kernel": "ok"}


# ------------------------------------------------------- moved from test_execute_units.py


def _pure_wheel(path: Path, body: str) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("demo/__init__.py", body)
        zf.writestr("demo-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n")
    return path


def test_import_test_loads_the_wheel_not_the_source_tree(tmp_path, monkeypatch):
    """A started-early importer imports the unpacked wheel from an empty folder: a same-named package
    in the caller's directory (the source tree) does not shadow it, and a failing import is an error."""
    from imagegen.errors import BuildError
    from imagegen.executors.import_test import Importer, import_test

    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "__init__.py").write_text("raise ImportError('the source tree, not the wheel')\n")
    monkeypatch.chdir(tmp_path)
    good = _pure_wheel(tmp_path / "demo-1.0-py3-none-any.whl", "import sys\nassert sys.modules\n")
    with Importer(sys.executable) as started_early:
        assert import_test(good, ["demo"], sys.executable, importer=started_early) == {"demo": "ok"}
    assert import_test(good, ["demo", "json"], sys.executable) == {"demo": "ok", "json": "ok"}
    (tmp_path / "bad").mkdir()
    bad = _pure_wheel(tmp_path / "bad" / "demo-1.0-py3-none-any.whl", "raise RuntimeError('kernel image missing')\n")
    with pytest.raises(BuildError, match=r"`import demo` failed: RuntimeError: kernel image missing"):
        import_test(bad, ["demo"], sys.executable)
    driverless = _pure_wheel(tmp_path / "bad" / "demo-1.0-py3-none-any.whl",
                             "raise ImportError('libcuda.so.1: cannot open shared object file')\n")
    assert import_test(driverless, ["demo"], sys.executable)["demo"].startswith("skipped: needs a GPU driver")


def test_importer_that_dies_on_start_reports_why(tmp_path):
    from imagegen.errors import BuildError
    from imagegen.executors.import_test import Importer

    wheel = _pure_wheel(tmp_path / "demo-1.0-py3-none-any.whl", "")
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\necho 'torch: undefined symbol cudaGetDriverEntryPoint' >&2\nexit 1\n")
    broken.chmod(0o755)
    with Importer(str(broken)) as importer, pytest.raises(BuildError, match="the import test did not run: .*undefined symbol"):
        importer.run(wheel, ["demo"])

