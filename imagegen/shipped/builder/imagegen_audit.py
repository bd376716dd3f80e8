#!/usr/bin/env python3
"""imagegen's gencode audit: run a package's own build with compilers that record instead of compile.

Shipped beside imagegen_build.py (same rules: standard library only, Python 3.8+, copied verbatim
into every rendered Dockerfile and run directly by native builds).

`imagegen_build.py audit` runs the package's real build, the PEP 517 `build_wheel` hook that
`pip wheel --no-build-isolation` runs (build_wheel_command: pip's backend choice, without pip's
start-up and its metadata step, which runs setup.py once more and compiles nothing), with exactly the
environment `build` would give it (build_env: arch knob, force-build, jobs), except that nvcc, the
host C/C++ compilers and the shared-object linker are stand-ins:

- a shadow CUDA_HOME whose bin/nvcc is this script (every other entry links to the real toolkit,
  so headers, libraries and `nvcc -V` are the real ones); PYTORCH_NVCC points at it as well;
- CC, CXX and LDSHARED point at this script too.

A stand-in that is asked to produce something (`-c`, `-o`, `-shared`) appends its command line to a
JSON-lines log and writes empty outputs (and the dependency files ninja expects); anything else
(`nvcc -V`, `c++ --version`, `-dumpversion`, CMake's compiler checks) runs the real tool, and a pure
version query (`-V`, `-v`, `-dumpfullversion`: nothing but such flags) is answered from the first
answer of the same audit (torch asks `c++ -v` and `nvcc -V` for every extension). A stand-in starts
with `python -S` and imports only what it needs: it runs once per source file. The log is
then folded into a report (imagegen_audit_records.py): per extension (the .so the linker was asked for),
its sources and, per nvcc call, the SASS and PTX targets and flags; the header probe
(imagegen_audit_probe.py), the link lookup (imagegen_audit_links.py) and the include lookup
(imagegen_audit_includes.py) add to it. imagegen (audit.py) judges that report against the request,
the recipe and nvcc; this script only records. (The stand-ins
run this file once per compiled source: what they do not need lives in those modules.)

Nothing compiles, so an audit takes seconds, needs no GPU, and cannot fail the way the real build
fails: what it shows is what the real build would have asked nvcc for.
"""

import os
import sys

# Only os and sys at the top: a stand-in runs once per compiled file (python -S, this file as a
# script), and json/re/subprocess cost milliseconds each that it mostly does not need.

LOG_ENV = "IMAGEGEN_AUDIT_LOG"
REAL_ENV = "IMAGEGEN_AUDIT_REAL"  # JSON: tool -> the real executable (argv list)
NVCC_VERSION_ENV = "IMAGEGEN_AUDIT_NVCC_VERSION"  # answer `nvcc -V` with this when no real nvcc exists (else 12.8)
QUERY_CACHE_ENV = "IMAGEGEN_AUDIT_QUERIES"  # a folder: the real tools' answers to version queries, per audit
STUB_TOOLS = ("nvcc", "cc", "cxx", "ld")
# Flags whose answer depends only on the tool: a call with nothing else is answered from the cache.
VERSION_QUERIES = frozenset(("-V", "--version", "-v", "-dumpversion", "-dumpfullversion", "-dumpmachine"))
NO_BACKEND_READER = 97  # the build_wheel runner's exit status when it cannot read pyproject.toml
NO_BACKEND_MARK = b"imagegen audit: no TOML reader"

# ------------------------------------------------------------------------------------------------
# The stand-in compilers


def _producing(tool, argv):
    """Would the real tool write a build product? (Else it is a query the real tool answers.)"""
    if tool == "ld":  # a link writes -o FILE from objects; `ld --help` / `ld -v` (CMake's probes) are queries
        return any(a == "-o" or (a.startswith("-o") and len(a) > 2) or a.endswith((".o", ".a", ".so")) for a in argv)
    if any(a in ("-E", "-M", "-MM") for a in argv) and "-c" not in argv:
        return False
    return "-c" in argv or "-shared" in argv or "-o" in argv or "-dlink" in argv or "--device-link" in argv \
        or any(a.startswith("-o") and len(a) > 2 and not a.startswith("-opt") for a in argv)


def _in_cmake_check(argv):
    """CMake compiles and runs small programs to learn about a compiler: let the real one do that."""
    here = os.getcwd()
    return any(m in here for m in ("CMakeScratch", "CMakeTmp", "CompilerIdC", "CMakeFiles/CheckTypeSize")) \
        or any("CMakeFiles" in a and ("CompilerId" in a or "CMakeScratch" in a) for a in argv)


def _outputs(argv):
    """The files a compiler call would write: -o FILE, dependency files (ninja reads them)."""
    out, deps = [], []
    i = 0
    while i < len(argv):
        a = argv[i]
        nxt = argv[i + 1] if i + 1 < len(argv) else None
        if a in ("-o", "--output-file") and nxt is not None:
            out.append(nxt)
            i += 1
        elif a.startswith("--output-file="):
            out.append(a.split("=", 1)[1])
        elif a.startswith("-o") and len(a) > 2 and not a.startswith("-opt"):
            out.append(a[2:])
        elif a in ("-MF", "--dependency-output", "-MQ-file") and nxt is not None:
            deps.append(nxt)
            i += 1
        elif a.startswith("--dependency-output="):
            deps.append(a.split("=", 1)[1])
        elif a.startswith("-MF") and len(a) > 3:
            deps.append(a[3:])
        i += 1
    if not deps and any(a in ("-MD", "-MMD") for a in argv) and out:
        deps.append(os.path.splitext(out[0])[0] + ".d")
    return out, deps


def _fake_nvcc_version():
    v = os.environ.get(NVCC_VERSION_ENV) or "12.8"
    major, minor = (v.split(".") + ["0"])[:2]
    sys.stdout.write("nvcc: NVIDIA (R) Cuda compiler driver\n"
                     "Cuda compilation tools, release %s.%s, V%s.%s.0\n" % (major, minor, major, minor))
    return 0


def _query_key(tool, argv):
    """Where this audit keeps the real tool's answer to a pure version query (only VERSION_QUERIES
    flags); None for any other call."""
    cache = os.environ.get(QUERY_CACHE_ENV)
    if not cache or not argv or not all(a in VERSION_QUERIES for a in argv):
        return None
    return os.path.join(cache, tool + "".join("_" + a.lstrip("-") for a in argv))


def _answer(rc, out, err):
    os.write(1, out)
    os.write(2, err)
    return rc if rc >= 0 else 128 - rc


def _cached_answer(key):
    """The cached answer (exit status), written to stdout/stderr; None when there is none yet."""
    try:
        with open(key + ".rc", "rb") as fh:  # written last: its presence means the others are complete
            rc = int(fh.read())
        with open(key + ".out", "rb") as fh:
            out = fh.read()
        with open(key + ".err", "rb") as fh:
            err = fh.read()
    except (OSError, ValueError):
        return None
    return _answer(rc, out, err)


def _ask_and_cache(key, real, argv):
    """Ask the real tool once and keep its answer for the audit's other stand-ins."""
    import subprocess
    try:
        proc = subprocess.run(list(real) + list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError:
        return None
    if proc.returncode >= 0:
        for suffix, data in ((".out", proc.stdout), (".err", proc.stderr), (".rc", str(proc.returncode).encode())):
            tmp = "%s%s.%d" % (key, suffix, os.getpid())
            with open(tmp, "wb") as fh:
                fh.write(data)
            os.replace(tmp, key + suffix)
    return _answer(proc.returncode, proc.stdout, proc.stderr)


def stub_main(tool, argv):
    """Entry point of a stand-in (`imagegen_audit.py stub TOOL ARGS...`)."""
    if not _producing(tool, argv) or _in_cmake_check(argv):
        key = _query_key(tool, argv)
        answered = _cached_answer(key) if key else None
        if answered is not None:
            return answered
        import json
        real = json.loads(os.environ.get(REAL_ENV) or "{}").get(tool)
        answered = _ask_and_cache(key, real, argv) if key and real else None
        if answered is not None:
            return answered
        if real:
            import subprocess
            try:
                return subprocess.call(list(real) + list(argv))
            except OSError:
                pass
        if tool == "nvcc" and any(a in ("-V", "--version") for a in argv):
            return _fake_nvcc_version()
        if tool == "nvcc" and "--list-gpu-arch" in argv:
            return 0
        sys.stderr.write("imagegen audit: no real %s to answer %s\n" % (tool, " ".join(argv)[:200]))
        return 1
    import time
    outs, deps = _outputs(argv)
    line = ('{"tool": %s, "cwd": %s, "argv": [%s], "t": %.3f}\n' % (
        _json_str(tool), _json_str(os.getcwd()), ", ".join(_json_str(a) for a in argv), time.time())).encode()
    log = os.environ.get(LOG_ENV)
    if log:
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)  # one write per record: O_APPEND keeps concurrent stand-ins apart
        finally:
            os.close(fd)
    for path in outs:
        _touch(path, b"")
    for path in deps:
        target = outs[0] if outs else "out.o"
        _touch(path, ("%s:\n" % target.replace(" ", "\\ ")).encode())
    return 0


_JSON_ESCAPES = dict([(i, "\\u%04x" % i) for i in range(32)] + [(ord('"'), '\\"'), (ord("\\"), "\\\\"),
                                                                    (8, "\\b"), (9, "\\t"), (10, "\\n"), (12, "\\f"), (13, "\\r")])


def _json_str(text):
    """json.dumps(text, ensure_ascii=False) without importing json (and re) in every stand-in; a
    lone surrogate (an undecodable byte in argv) is written as its \\u escape, as json does."""
    out = '"' + text.translate(_JSON_ESCAPES) + '"'
    try:
        out.encode("utf-8")
    except UnicodeEncodeError:
        out = "".join(c if not 0xD800 <= ord(c) <= 0xDFFF else "\\u%04x" % ord(c) for c in out)
    return out


def _touch(path, data):
    d = os.path.dirname(path)
    if d:
        os.makedirs(d, exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(data)


if __name__ == "__main__" and len(sys.argv) > 2 and sys.argv[1] == "stub":
    sys.exit(stub_main(sys.argv[2], sys.argv[3:]))

import json  # noqa: E402 (after the stand-in's fast path)
import shlex  # noqa: E402

# ------------------------------------------------------------------------------------------------
# Setting the stand-ins up


def install_stubs(work, env, python, script, cuda_home):
    """Point ``env`` at stand-ins under ``work`` that shadow the toolkit at ``cuda_home`` (where torch
    would find it: imagegen_build.torch_cuda_home); return the path of the record log."""
    # absolute: the shadow's links point at it from another folder (a relative CUDA_HOME made dangling links)
    real_home = os.path.abspath(cuda_home) if cuda_home and os.path.isdir(cuda_home) else None
    shadow = os.path.join(work, "cuda")
    bindir = os.path.join(shadow, "bin")
    os.makedirs(bindir, exist_ok=True)
    if real_home:
        for name in sorted(os.listdir(real_home)):
            if name != "bin":
                os.symlink(os.path.join(real_home, name), os.path.join(shadow, name))
        real_bin = os.path.join(real_home, "bin")
        if os.path.isdir(real_bin):
            for name in sorted(os.listdir(real_bin)):
                if name != "nvcc":
                    os.symlink(os.path.join(real_bin, name), os.path.join(bindir, name))
    for sub in ("include", "lib64"):
        if not os.path.exists(os.path.join(shadow, sub)):
            os.makedirs(os.path.join(shadow, sub))
    stubs = {}
    for tool in STUB_TOOLS:
        path = os.path.join(work, "stubs", tool) if tool != "nvcc" else os.path.join(bindir, "nvcc")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as fh:
            fh.write("#!/bin/sh\nexec %s -S %s stub %s \"$@\"\n" % (shlex.quote(python), shlex.quote(script), tool))
        os.chmod(path, 0o755)
        stubs[tool] = path
    real_nvcc = os.path.join(real_home, "bin", "nvcc") if real_home else None
    real = {
        "nvcc": [real_nvcc] if real_nvcc and os.path.isfile(real_nvcc) else None,
        "cc": shlex.split(env.get("CC") or "cc"),
        "cxx": shlex.split(env.get("CXX") or "c++"),
        "ld": None,
    }
    log = os.path.join(work, "records.jsonl")
    open(log, "w").close()
    queries = os.path.join(work, "queries")
    os.makedirs(queries, exist_ok=True)
    env.update({
        QUERY_CACHE_ENV: queries,
        "CUDA_HOME": shadow,
        "CUDA_PATH": shadow,
        "PYTORCH_NVCC": stubs["nvcc"],
        "PATH": bindir + os.pathsep + env.get("PATH", ""),
        "CC": stubs["cc"],
        "CXX": stubs["cxx"],
        "LDSHARED": stubs["ld"] + " -shared",
        LOG_ENV: log,
        REAL_ENV: json.dumps(real),
    })
    # Nothing compiles: keep compile caches out of the picture. torch 2.13+ puts ccache/sccache in
    # front of the compilers when one is on PATH, and ccache then runs the real preprocessor on every
    # file before it calls the stand-in (xformers 0.0.32: ~1 s per host source, 12 s of its audit).
    env.pop("CCACHE_DIR", None)
    env.update({"TORCH_NO_COMPILER_WRAPPER": "1", "CCACHE_DISABLE": "1"})
    return log


# The PEP 517 build_wheel call `pip wheel --no-build-isolation` makes (pip's own hook runner does the
# same in a process of its own): pip's backend choice (setuptools' legacy backend without a
# pyproject.toml or without build-backend), backend-path first on sys.path, run in the tree.
_BUILD_WHEEL = r"""
import importlib, os, sys
tree, dist = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
backend, paths = "setuptools.build_meta:__legacy__", []
if os.path.isfile(os.path.join(tree, "pyproject.toml")):
    try:
        import tomllib
    except ImportError:
        try:
            from pip._vendor import tomli as tomllib
        except ImportError:
            sys.stdout.write("%s\n")
            sys.exit(%d)
    with open(os.path.join(tree, "pyproject.toml"), "rb") as fh:
        system = tomllib.load(fh).get("build-system") or {}
    if system.get("build-backend"):
        backend, paths = system["build-backend"], list(system.get("backend-path") or [])
os.chdir(tree)
sys.path[:0] = [os.path.join(tree, p) for p in paths]
module, _, attrs = backend.partition(":")
hooks = importlib.import_module(module)
for attr in filter(None, attrs.split(".")):
    hooks = getattr(hooks, attr)
os.makedirs(dist, exist_ok=True)
print("built " + hooks.build_wheel(dist, config_settings=None, metadata_directory=None))
sys.stdout.flush()
sys.stderr.flush()
# The wheel is written and every stand-in has recorded: skip the interpreter's shutdown, which with
# torch imported (every setup.py of a CUDA extension imports it) takes 0.7-0.9 s.
os._exit(0)
""" % (NO_BACKEND_MARK.decode(), NO_BACKEND_READER)


def build_wheel_command(python, work, tree, dist):
    """The command that runs the package's PEP 517 build_wheel hook as `pip wheel` would, from a
    folder of its own (the script's folder is sys.path[0], as for pip's hook runner)."""
    folder = os.path.join(work, "pep517")
    os.makedirs(folder, exist_ok=True)
    runner = os.path.join(folder, "imagegen_build_wheel.py")
    with open(runner, "w") as fh:
        fh.write(_BUILD_WHEEL)
    return [python, runner, tree, dist]
