#!/usr/bin/env python3
"""imagegen's toolchain step, run inside a builder image before anything of the recipe is there:
a venv with exactly the torch asked for (and the CUDA toolkit from PyPI for the `pypi` flavor),
asserted. It reads only the toolchain document (torch, CUDA, Python), and its layer depends only on
this file, so builders of every recipe, and of later imagegen releases that leave this file alone,
share the layer of several GB.

Also what every step of imagegen_build.py shares: log, fail, run, the secrets, the venv's torch.
Standard library only, Python 3.8+, like imagegen_build.py.

  python3 imagegen_toolchain.py --cell /imagegen/toolchain.json
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys

SECRETS = "/run/secrets"
# Secret id -> environment variables that point at it. The CA bundle (corporate proxies) and index
# credentials come in as BuildKit secrets: mounted for one RUN, never in a layer or the history.
CA_VARS = ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE", "GIT_SSL_CAINFO", "CURL_CA_BUNDLE")


def log(msg):
    print("[imagegen] " + msg, flush=True)


def fail(msg, code=1):
    print("[imagegen] error: " + msg, file=sys.stderr, flush=True)
    sys.exit(code)


def load_cell(path):
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def secret_env(env):
    """Point pip/git/requests at the secrets mounted for this step, if any."""
    env = dict(env)
    ca = os.path.join(SECRETS, "pip_cert")
    if os.path.isfile(ca) and os.path.getsize(ca) > 0:
        for var in CA_VARS:
            env[var] = ca
    for sid, var in (("pip_index_url", "PIP_INDEX_URL"), ("pip_extra_index_url", "PIP_EXTRA_INDEX_URL")):
        p = os.path.join(SECRETS, sid)
        if os.path.isfile(p):
            with open(p, encoding="utf-8") as fh:
                env[var] = fh.read().strip()
    netrc = os.path.join(SECRETS, "netrc")
    if os.path.isfile(netrc):
        env["NETRC"] = netrc
    return env


def run(cmd, env=None, cwd=None, log_file=None, check=True):
    """Run ``cmd``, logged; a non-zero exit ends the step unless ``check`` is false (then it is returned)."""
    log("$ " + " ".join(cmd))
    if log_file is None:
        rc = subprocess.call(cmd, env=env, cwd=cwd)
    else:
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for line in proc.stdout:
            sys.stdout.buffer.write(line)
            sys.stdout.flush()
            log_file.write(line)
        rc = proc.wait()
    if rc != 0 and check:
        fail("command failed with exit code %d: %s" % (rc, " ".join(cmd)), rc)
    return rc


# ------------------------------------------------------------------------------------------------
# deps


def venv_python(cell):
    """The interpreter that builds: the builder venv in an image, the host's Python natively."""
    if not cell.get("venv"):
        return cell["base_python"]
    return os.path.join(cell["venv"], "bin", "python")


def cmd_toolchain(cell, args):
    """The venv with exactly the torch asked for (and the CUDA toolkit from PyPI, where the flavor
    takes it from there). The heavy layer (several GB): it reads only the toolchain document (torch,
    CUDA, Python), so every recipe's builder for the same torch x CUDA x Python shares it."""
    env = secret_env(os.environ)
    venv = cell["venv"]
    torch = cell["torch"]
    reused = image_torch_matches(cell) if torch.get("reuse") else False
    if not os.path.exists(venv_python(cell)):
        # The image's own torch is seen through the system site packages; anything installed later
        # (build requirements, the wheel) goes into the venv, never into the image's Python.
        run([cell["base_python"], "-m", "venv"] + (["--system-site-packages"] if reused else []) + [venv], env=env)
    py = venv_python(cell)
    pip = [py, "-m", "pip", "install", "--disable-pip-version-check"]
    # A newer pip reads newer wheel metadata; the venv's own still works, so a failed upgrade (no index:
    # an offline host whose image already has torch) is a warning, not the end of the build.
    if cell.get("offline"):
        log("offline: the venv's own pip, the image's torch")
    elif run(pip + ["--upgrade", "pip"], env=env, check=False) != 0:
        log("warning: pip could not be upgraded; going on with the venv's own pip")
    if reused:
        log("torch %s (%s) is the base image's own: reused, not downloaded" % (torch["version"], torch["cuda"]))
    elif cell.get("offline"):
        fail("--offline: the base image's %s has no torch %s (%s), and an offline build cannot download it: use a"
             " base image whose Python has it" % (cell["base_python"], torch["version"], torch["cuda"]))
    else:
        spec = ["torch==" + torch["version"]]
        if torch.get("index_url"):
            spec += ["--index-url", torch["index_url"]]
        run(pip + spec, env=env)
    tk = cell.get("toolkit") or {}
    if tk.get("kind") == "pypi":
        extras = ",".join(tk["extras"])
        run(pip + ["cuda-toolkit[%s]==%s" % (extras, tk["version"])], env=env)
        assemble_cuda_home(py, tk["home"])
    validate_torch(cell, py)


# Printed by an interpreter asked which torch it has: [version, CUDA version or null].
TORCH_PROBE = "import json, torch; print(json.dumps([torch.__version__, torch.version.cuda]))"


def is_wanted_torch(want, got_version, got_cuda):
    """Whether torch ``got_version`` (a local label like +cu128 allowed) built for CUDA ``got_cuda`` is
    the release and CUDA variant of the toolchain document's ``want``."""
    return got_version.split("+")[0] == want["version"] and (got_cuda or "") == want["cuda_dotted"]


def image_torch_matches(cell):
    """Whether the base image's interpreter already has exactly the torch release and CUDA variant
    the cell asks for. Asked only where the plan expects it ("image") or cannot know ("if-present");
    a mismatch means the venv gets its own torch, as for any other image."""
    want = cell["torch"]
    try:
        out = subprocess.run([cell["base_python"], "-c", TORCH_PROBE], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             timeout=300).stdout.decode(errors="replace").strip().splitlines()
        got_version, got_cuda = json.loads(out[-1]) if out else (None, None)
    except (OSError, ValueError, subprocess.TimeoutExpired):
        got_version, got_cuda = None, None
    if got_version is None:
        found = "no torch"
    else:
        found = "torch %s (CUDA %s)" % (got_version, got_cuda)
        if is_wanted_torch(want, got_version, got_cuda):
            return True
    if want.get("reuse") == "image":
        log("warning: the plan expected torch %s (%s) in the base image's %s, which has %s: installing it into the venv"
            % (want["version"], want["cuda"], cell["base_python"], found))
    else:
        log("the base image's %s has %s, not torch %s (%s): installing it into the venv"
            % (cell["base_python"], found, want["version"], want["cuda"]))
    return False


def assemble_cuda_home(py, home):
    """Merge the nvidia/* PyPI wheel trees into one CUDA_HOME (bin, include, lib, lib64, nvvm)."""
    # Every `nvidia` folder the venv sees: with the image's own torch reused (system site packages),
    # pip leaves in the image what it already has there (the CUDA runtime torch brought), so the
    # toolkit is split between the venv and the image. Last first, so the venv's copy wins.
    out = subprocess.check_output([py, "-c", "import nvidia; print('\\n'.join(nvidia.__path__))"])
    roots = [line for line in out.decode().splitlines() if line.strip()]
    os.makedirs(home, exist_ok=True)
    for root in reversed(roots):
        for name in sorted(os.listdir(root)):
            part = os.path.join(root, name)
            if not os.path.isdir(part) or not os.path.isdir(os.path.join(part, "include")) and not os.path.isdir(os.path.join(part, "bin")):
                continue
            for sub in ("bin", "include", "lib", "nvvm"):
                src = os.path.join(part, sub)
                if os.path.isdir(src):
                    shutil.copytree(src, os.path.join(home, sub), symlinks=True, dirs_exist_ok=True,
                                    copy_function=link_or_copy)
    lib = os.path.join(home, "lib")
    os.makedirs(lib, exist_ok=True)
    # The wheels ship only versioned libraries; the linker wants the plain names.
    for f in sorted(os.listdir(lib)):
        m = re.match(r"(lib[\w+-]+\.so)\.\d+$", f)
        if m and not os.path.exists(os.path.join(lib, m.group(1))):
            os.symlink(f, os.path.join(lib, m.group(1)))
    if not os.path.exists(os.path.join(home, "lib64")):
        os.symlink("lib", os.path.join(home, "lib64"))
    make_libcuda_stub(os.path.join(lib, "stubs"), os.path.join(home, "include"))
    nvcc = os.path.join(home, "bin", "nvcc")
    if not os.path.exists(nvcc):
        fail("the PyPI CUDA toolkit has no nvcc at %s" % nvcc)
    run([nvcc, "--version"])


def link_or_copy(src, dst):
    """``dst`` as a hard link to ``src``, replacing what was there (a later root wins); a copy where
    the two cannot share an inode (another file system). CUDA_HOME holds the same libraries as the
    wheels (cuBLAS, cuDNN, NCCL...: about 3 GB for CUDA 13): linked, the layer stores them once, so a
    builder image is that much smaller to push, pull and unpack (nothing writes into either tree)."""
    if os.path.lexists(dst):
        os.unlink(dst)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
    return dst


def make_libcuda_stub(folder, include):
    """lib/stubs/libcuda.so for a package that links -lcuda (SageAttention's _qattn_sm90): the CUDA
    installer ships the driver's link-time stub there, the PyPI wheels do not. Made as NVIDIA's is: a
    shared library named libcuda.so.1 defining every driver function cuda.h declares (names as the
    header's macros make them: cuMemAlloc_v2), with empty bodies: the extension records NEEDED
    libcuda.so.1 (a linker with --as-needed drops a library that defines nothing it uses) and takes the
    real functions from the driver at run time. Built with the host compiler the build uses anyway."""
    stub = os.path.join(folder, "libcuda.so")
    header = os.path.join(include, "cuda.h")
    cc = shutil.which("cc") or shutil.which("gcc")
    if os.path.exists(stub) or not os.path.isfile(header) or cc is None:
        if not os.path.exists(stub):
            log("no libcuda.so stub in %s (%s): a package that links -lcuda cannot link"
                % (folder, "no C compiler" if cc is None else "no cuda.h"))
        return
    expanded = subprocess.run([cc, "-E", "-P", "-I", include, "-x", "c", "-"], input=b"#include <cuda.h>\n",
                              stdout=subprocess.PIPE, check=True).stdout.decode(errors="replace")
    names = sorted(set(re.findall(r"\b(cu[A-Z]\w*)\s*\(", expanded)))
    os.makedirs(folder, exist_ok=True)
    source = os.path.join(folder, "libcuda_stub.c")
    with open(source, "w") as f:
        f.write("".join("void %s(void) {}\n" % n for n in names))
    run([cc, "-shared", "-fPIC", "-nostdlib", "-Wl,-soname,libcuda.so.1", "-o", stub, source])
    os.remove(source)
    log("libcuda.so stub for the link: %d driver functions of cuda.h, in %s" % (len(names), folder))


def validate_torch(cell, py):
    """Fail unless the venv's torch is exactly the release and CUDA variant the cell asked for."""
    if cell.get("torch_checked"):
        return  # a native build: imagegen checked the host's torch before it started
    want = cell["torch"]
    got_version, got_cuda = json.loads(subprocess.check_output([py, "-c", TORCH_PROBE]).decode().strip().splitlines()[-1])
    if not is_wanted_torch(want, got_version, got_cuda):
        fail("torch %s (CUDA %s) is installed, but the cell asks for torch %s with CUDA %s: check the torch index URL"
             % (got_version, got_cuda, want["version"], want["cuda_dotted"]))
    log("torch %s (CUDA %s) as asked" % (got_version, got_cuda))


def main(argv=None):
    parser = argparse.ArgumentParser(prog="imagegen_toolchain.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cell", default="/imagegen/toolchain.json")
    args = parser.parse_args(argv)
    cmd_toolchain(load_cell(args.cell), args)


if __name__ == "__main__":
    main()
