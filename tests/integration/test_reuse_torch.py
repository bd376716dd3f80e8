"""imagegen reuse against a real torch (the session's torch 2.11.0 venv from PyPI): the fixture wheel
(built for torch 2.11) is reusable with it, symbols and import; an extension compiled here against
that torch's libc10.so that calls the name torch 2.13 gave the copy-on-write hook
(``c10::impl::cow::materialize_cow``) is not: the symbol check names it, and the import fails with the
loader's own `undefined symbol`. One that calls the name 2.11 exports (``materialize_cow_storage``,
the symbol torch 2.13 dropped) passes both. No GPU here: the gpu_check is said skipped, never passed.
The torch wheels of other releases are not downloaded in CI (half a GB each): the record of that
matrix is benchmarks/RESULTS.md, "Reuse before rebuilding"."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

from tests.unit import elf_fixtures as fx

ROOT = Path(__file__).resolve().parents[2]
WHEEL = next((ROOT / "tests" / "fixtures" / "wheels").glob("tiny_kernel-*.whl"))

pytestmark = pytest.mark.integration


def reuse(*argv, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run([sys.executable, "-m", "imagegen", "reuse", *map(str, argv)], capture_output=True,
                          text=True, cwd=cwd, env=env, timeout=900)


def torch_lib(venv: Path) -> Path:
    [lib] = venv.glob("lib/python*/site-packages/torch/lib")
    return lib


def cow_extension(folder: Path, venv: Path, *, call: str) -> Path:
    """A wheel of one extension module linked against the venv's real libc10.so that calls ``call``: the
    declaration torch's headers give it (never run: the module is only imported)."""
    folder.mkdir(parents=True)
    declare = {"materialize_cow_storage": "void materialize_cow_storage(StorageImpl&);",
               "materialize_cow": "void materialize_cow(StorageImpl*);"}[call]
    use = {"materialize_cow_storage": "c10::impl::cow::materialize_cow_storage(*s);",
           "materialize_cow": "c10::impl::cow::materialize_cow(s);"}[call]
    src = folder / "cow.cpp"
    src.write_text("#include <Python.h>\n" + textwrap.dedent(f"""
        namespace c10 {{ struct StorageImpl; namespace impl {{ namespace cow {{ {declare} }} }} }}
        static PyObject* touch(PyObject*, PyObject* arg) {{
            auto* s = static_cast<c10::StorageImpl*>(PyLong_AsVoidPtr(arg)); if (s) {{ {use} }} Py_RETURN_NONE; }}
        static PyMethodDef methods[] = {{{{"touch", touch, METH_O, ""}}, {{nullptr, nullptr, 0, nullptr}}}};
        static struct PyModuleDef mod = {{PyModuleDef_HEAD_INIT, "_cow", nullptr, -1, methods}};
        PyMODINIT_FUNC PyInit__cow(void) {{ return PyModule_Create(&mod); }}
    """))
    so = folder / f"_cow{fx.EXT_SUFFIX}"
    fx.gcc("-shared", "-fPIC", "-I", sysconfig.get_paths()["include"], "-o", so, src, "-L", torch_lib(venv),
           "-Wl,--no-as-needed", "-lc10", "-Wl,--unresolved-symbols=ignore-all", cwd=folder)
    version = "0.1.0+cu130torch2.13" if call == "materialize_cow" else "0.1.0+cu130torch2.11"
    return fx.write_wheel(folder / f"cow-{version}-{fx.PY}-{fx.PY}-linux_x86_64.whl",
                          {"cow/__init__.py": b"from . import _cow\n", f"cow/_cow{fx.EXT_SUFFIX}": so.read_bytes()},
                          f"cow-{version}.dist-info", f"Metadata-Version: 2.1\nName: cow\nVersion: {version}\n")


def test_the_fixture_wheel_is_reusable_with_the_torch_it_was_built_for(torch_venv, tmp_path):
    python = torch_venv / "bin" / "python"
    proc = reuse(WHEEL, "--torch", "2.11.0", "--python-exe", python, "--json", "--into", tmp_path / "wh", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    assert doc["reusable"] and doc["built_for"] == "2.11" and doc["target"].startswith("2.11.0")
    [ext] = doc["extensions"]
    assert ext["name"] == "tiny_kernel/_C.cpython-311-x86_64-linux-gnu.so" and ext["judged"] > 10 and not ext["missing"]
    assert {"libc10.so", "libtorch_cpu.so", "libtorch_python.so"} <= set(ext["torch_libraries"])
    assert doc["import"]["modules"] == {"tiny_kernel": "ok", "tiny_kernel._C": "ok"}
    assert doc["gpu_check"]["status"] == "skipped" and doc["gpu_check"]["note"].startswith("no GPU here")
    [manifest] = (tmp_path / "wh").rglob("manifest.json")
    [entry] = json.loads(manifest.read_text())["cells"].values()
    assert entry["reused_from"] == {"torch": "2.11", "checked_against": "2.11.0", "symbols": "ok", "import": "ok",
                                    "gpu_check": "skipped"}


def test_a_symbol_this_torch_does_not_export_fails_both_checks(torch_venv, tmp_path):
    python = torch_venv / "bin" / "python"
    newer = cow_extension(tmp_path / "new", torch_venv, call="materialize_cow")
    proc = reuse(newer, "--python-exe", python, cwd=tmp_path)
    assert proc.returncode == 11, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "    missing c10::impl::cow::materialize_cow(c10::StorageImpl*) (expected from libc10.so, by its namespace)" \
        in proc.stdout
    assert "undefined symbol: _ZN3c104impl3cow15materialize_cowEPNS_11StorageImplE" in proc.stdout
    assert proc.stderr.startswith("imagegen: error: cow-0.1.0+cu130torch2.13") and len(proc.stderr.splitlines()) == 1
    older = cow_extension(tmp_path / "old", torch_venv, call="materialize_cow_storage")
    proc = reuse(older, "--python-exe", python, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "  import: ok (2 modules imported with torch 2.11.0" in proc.stdout


def test_the_torch_folder_alone_reads_as_the_environment_does(torch_venv, tmp_path):
    # --torch-wheel takes a folder of an unpacked torch: the venv's site-packages, read without importing.
    site = torch_lib(torch_venv).parents[1]
    proc = reuse(WHEEL, "--torch-wheel", site, "--built-with", site, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "import: skipped (no --python-exe: nothing imported)" in proc.stdout
