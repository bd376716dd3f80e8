"""Real ELF shared objects for the reuse tests (test_symbols, test_reuse, test_reusing, and the
integration test against a real torch), compiled here with gcc: stand-ins for torch's libraries (a
libc10.so exporting c10::alpha() and beta(), an "older" and a "newer" one that lost either), a Python
extension module that needs them, a wheel of it, a torch wheel of the stand-ins, and a venv whose
"torch" package loads them, so that an import is a real dlopen with the real loader's verdict."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from dataclasses import dataclass
from pathlib import Path

EXT_SUFFIX = sysconfig.get_config_var("EXT_SUFFIX")  # .cpython-311-x86_64-linux-gnu.so
PY = f"cp{sys.version_info.major}{sys.version_info.minor}"
# libstdc++'s std::string::_M_dispose(), exported (unversioned) by the old stand-in too, as torch 2.11's
# libraries do: an extension linked against that torch binds to it there, and libstdc++ still provides it.
STD_DISPOSE = "_ZNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEE10_M_disposeEv"


def gcc(*args: str | Path, cwd: Path) -> None:
    cc = shutil.which("g++") or shutil.which("gcc")
    assert cc, "g++ is needed to build the ELF fixtures (apt-get install g++)"
    proc = subprocess.run([cc, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def torch_lib(folder: Path, *, alpha: bool = True, beta: bool = True, dispose: bool = True,
              cuda: bool = True, version: str = "2.11.0") -> Path:
    """A torch install's stand-in: ``folder/torch/lib/libc10.so`` (c10::alpha(), beta(), and libstdc++'s
    std::string::_M_dispose as torch 2.11 exports it, each where asked), libtorch_cuda.so unless
    ``cuda`` is False, torch/version.py and a dist-info. Returns ``folder``."""
    lib = folder / "torch" / "lib"
    lib.mkdir(parents=True, exist_ok=True)
    src = folder / "c10.cpp"
    src.write_text(textwrap.dedent(f"""
        namespace c10 {{ {"int alpha() { return 1; }" if alpha else ""} int gamma() {{ return 3; }} }}
        extern "C" {{ {"int beta() { return 2; }" if beta else ""} }}
        {f'extern "C" void std_dispose() __asm__("{STD_DISPOSE}"); extern "C" void std_dispose() {{}}' if dispose else ""}
    """))
    gcc("-shared", "-fPIC", "-Wl,-soname,libc10.so", "-o", lib / "libc10.so", src, cwd=folder)
    if cuda:
        cu = folder / "cuda.cpp"
        cu.write_text("namespace c10 { namespace cuda { int device_count() { return 0; } } }\n")
        gcc("-shared", "-fPIC", "-Wl,-soname,libtorch_cuda.so", "-o", lib / "libtorch_cuda.so", cu, "-L", lib, "-lc10",
            cwd=folder)
    (folder / "torch" / "version.py").write_text(f"__version__ = '{version}+cu130'\n")
    # What `import torch` does for an extension: its libraries loaded, their symbols global.
    (folder / "torch" / "__init__.py").write_text(textwrap.dedent(f"""
        import ctypes, os
        __version__ = "{version}+cu130"
        _lib = os.path.join(os.path.dirname(__file__), "lib")
        for _name in ("libc10.so", "libtorch_cuda.so"):
            if os.path.exists(os.path.join(_lib, _name)):
                ctypes.CDLL(os.path.join(_lib, _name), mode=ctypes.RTLD_GLOBAL)
    """))
    info = folder / f"torch-{version}+cu130.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {version}+cu130\n")
    return folder


@dataclass(frozen=True)
class Extension:
    wheel: Path
    so: Path  # the extension module as built (before it went into the wheel)


def extension(folder: Path, torch: Path, *, calls: tuple[str, ...] = ("alpha", "beta"), needs_cuda: bool = False,
              weak: bool = True, own: bool = False, requires: str | None = None,
              local: str = "cu130torch2.11", python: str = PY, name: str = "pkg", ops: bool = False) -> Extension:
    """A Python extension module ``pkg._ext`` linked against ``torch``'s libc10.so (and libtorch_cuda.so
    with ``needs_cuda``), calling what ``calls`` names: alpha (c10::alpha()), beta (a C function),
    dispose (std::string::_M_dispose, bound to the stand-in's copy), own (c10::own(), which the wheel's own
    libown.so defines; ``own`` bundles it); ``weak``: also a weak reference to a symbol nobody defines.
    ``ops``: also ``pkg/_ops.so``, a library as torch.ops.load_library loads (torchvision's _C.so): no
    Python module, calling c10::alpha(). Packed as ``pkg-0.1.0+<local>-<python>-<python>-linux_x86_64.whl``
    with ``requires`` as its Requires-Dist."""
    folder.mkdir(parents=True, exist_ok=True)
    lib = torch / "torch" / "lib"
    include = sysconfig.get_paths()["include"]
    decls = ["namespace c10 { int alpha(); int own(); }", 'extern "C" int beta();',
             f'extern "C" void std_dispose() __asm__("{STD_DISPOSE}");',
             "namespace c10 { namespace cuda { int device_count(); } }",
             'extern "C" int nobody_defines_this() __attribute__((weak));']
    body = {"alpha": "n += c10::alpha();", "beta": "n += beta();", "dispose": "std_dispose();",
            "own": "n += c10::own();", "cuda": "n += c10::cuda::device_count();"}
    uses = [body[c] for c in calls] + (["n += c10::cuda::device_count();"] if needs_cuda else []) \
        + (["if (nobody_defines_this) n += nobody_defines_this();"] if weak else [])
    src = folder / "ext.cpp"
    src.write_text("#include <Python.h>\n" + "\n".join(decls) + textwrap.dedent(f"""
        static PyObject* total(PyObject*, PyObject*) {{
            long n = 0; int* one = new int(1); n += *one; delete one;  // libstdc++'s operator new, as every extension
            {" ".join(uses)} return PyLong_FromLong(n); }}
        static PyMethodDef methods[] = {{{{"total", total, METH_NOARGS, ""}}, {{nullptr, nullptr, 0, nullptr}}}};
        static struct PyModuleDef mod = {{PyModuleDef_HEAD_INIT, "_ext", nullptr, -1, methods}};
        PyMODINIT_FUNC PyInit__ext(void) {{ return PyModule_Create(&mod); }}
    """))
    libs = ["-L", lib, "-lc10"] + (["-ltorch_cuda"] if needs_cuda else [])
    if own:
        (folder / "own.cpp").write_text("namespace c10 { int own() { return 5; } }\n")
        gcc("-shared", "-fPIC", "-Wl,-soname,libown.so", "-o", folder / "libown.so", folder / "own.cpp", cwd=folder)
        libs += ["-L", folder, "-lown", "-Wl,-rpath,$ORIGIN"]
    if ops:
        (folder / "ops.cpp").write_text("namespace c10 { int alpha(); }\nint registered() { return c10::alpha(); }\n")
        gcc("-shared", "-fPIC", "-o", folder / "_ops.so", folder / "ops.cpp", "-L", lib, "-lc10", cwd=folder)
    so = folder / f"_ext{EXT_SUFFIX}"
    # Linked as torch's extensions are (undefined symbols allowed: a newer torch's stand-in may lack them).
    gcc("-shared", "-fPIC", "-I", include, "-o", so, src, *libs, "-Wl,--allow-shlib-undefined", cwd=folder)
    files = {f"{name}/__init__.py": b"from . import _ext\n", f"{name}/_ext{EXT_SUFFIX}": so.read_bytes()}
    if own:
        files[f"{name}/libown.so"] = (folder / "libown.so").read_bytes()
    if ops:
        files[f"{name}/_ops.so"] = (folder / "_ops.so").read_bytes()
    version = f"0.1.0+{local}" if local else "0.1.0"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + (f"Requires-Dist: {requires}\n" if requires else "")
    wheel = folder / f"{name}-{version}-{python}-{python}-linux_x86_64.whl"
    write_wheel(wheel, files, f"{name}-{version}.dist-info", meta)
    return Extension(wheel=wheel, so=so)


def write_wheel(wheel: Path, files: dict[str, bytes], info: str, metadata: str) -> Path:
    files = {**files, f"{info}/METADATA": metadata.encode(),
             f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: false\n"}
    record = "".join(f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}\n"
                     for n, d in files.items()) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for n, d in files.items():
            zf.writestr(n, d)
        zf.writestr(f"{info}/RECORD", record)
    return wheel


def torch_wheel(folder: Path, torch: Path, version: str, python: str = PY) -> Path:
    """``torch``'s stand-in packed as a torch wheel (its lib/ and version.py)."""
    files = {f"torch/lib/{p.name}": p.read_bytes() for p in sorted((torch / "torch" / "lib").iterdir())}
    files["torch/version.py"] = (torch / "torch" / "version.py").read_bytes()
    files["torch/__init__.py"] = (torch / "torch" / "__init__.py").read_bytes()
    wheel = folder / f"torch-{version}-{python}-{python}-linux_x86_64.whl"
    return write_wheel(wheel, files, f"torch-{version}.dist-info",
                       f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")


def venv_with(folder: Path, torch: Path) -> Path:
    """A venv (no pip) whose site-packages holds ``torch``'s stand-in; returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=120)
    site = next(folder.glob("lib/python*/site-packages"))
    shutil.copytree(torch / "torch", site / "torch")
    for info in torch.glob("torch-*.dist-info"):
        shutil.copytree(info, site / info.name)
    return folder / "bin" / "python"


def env_without_gpu() -> dict[str, str]:
    return {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
