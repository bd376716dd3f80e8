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
then folded into a report: per extension (the .so the linker was asked for), its sources and, per
nvcc call, the SASS and PTX targets and flags. imagegen (audit.py) judges that report against the
request, the recipe and nvcc; this script only records.

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
import re  # noqa: E402
import shlex  # noqa: E402
import time  # noqa: E402

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


# ------------------------------------------------------------------------------------------------
# Reading the records

_GENCODE = re.compile(r"arch=(compute_\w+|sm_\w+),code=\[?([\w,]+)\]?")


def nvcc_targets(argv):
    """The (kind, arch) targets of one nvcc call: ("sass", "sm_90a"), ("ptx", "compute_90a").

    -gencode arch=A,code=C[,C...]; --generate-code; -arch/-code pairs; -arch=sm_X alone
    (shorthand for SASS sm_X + PTX compute_X); -arch=compute_X alone (PTX only); -arch=native/all.
    With no arch option at all, nvcc compiles its own default: ("default", "").
    """
    targets = []
    arch = code = None
    i = 0
    while i < len(argv):
        a = argv[i]
        nxt = argv[i + 1] if i + 1 < len(argv) else ""
        val = None
        for opt in ("-gencode", "--generate-code"):
            if a == opt:
                val, i = nxt, i + 1
            elif a.startswith(opt + "="):
                val = a[len(opt) + 1:]
        if val is not None:
            m = _GENCODE.search(val.replace(" ", "").replace('"', ""))
            if m:
                for c in m.group(2).split(","):
                    targets.append(("ptx" if c.startswith("compute_") else "sass", c))
            i += 1
            continue
        for opt in ("-arch", "--gpu-architecture"):
            if a == opt:
                arch, i = nxt, i + 1
            elif a.startswith(opt + "="):
                arch = a[len(opt) + 1:]
        for opt in ("-code", "--gpu-code"):
            if a == opt:
                code, i = nxt, i + 1
            elif a.startswith(opt + "="):
                code = a[len(opt) + 1:]
        i += 1
    if arch:
        if arch in ("native", "all", "all-major"):
            targets.append(("special", arch))
        elif code:
            for c in code.split(","):
                targets.append(("ptx" if c.startswith("compute_") else "sass", c))
        elif arch.startswith("sm_"):
            targets += [("sass", arch), ("ptx", "compute_" + arch[3:])]
        else:
            targets.append(("ptx", arch))
    if not targets:
        targets.append(("default", ""))
    return list(dict.fromkeys(targets))


_SOURCE = re.compile(r"\.(cu|cpp|cc|cxx|c)$")
_SKIP_FLAG_PREFIX = ("-I", "-D", "-U", "-isystem", "-o", "-MF", "-MD", "-MMD", "--dependency-output",
                     "--generate-dependencies", "-c", "-gencode", "--generate-code", "-arch", "-code",
                     "--gpu-architecture", "--gpu-code")


def _flags(argv):
    """The flags of an nvcc call that shape code generation (no paths, defines or targets)."""
    out = []
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in ("-I", "-isystem", "-o", "-MF", "--dependency-output", "-gencode", "--generate-code", "-arch",
                 "-code", "-x", "-ccbin", "--compiler-bindir"):
            skip = True
            continue
        if a.startswith(_SKIP_FLAG_PREFIX) or _SOURCE.search(a) or a.endswith((".o", ".so")):
            continue
        out.append(a)
    return out


_STD_OPTIONS = ("-std", "--std")
_HOST_OPTIONS = ("-Xcompiler", "--compiler-options")


def std_args(argv):
    """The arguments of a compile that choose its C++ standard, in order and as written: -std=c++17,
    --std c++17 (both words), /std:c++20, and what nvcc hands the host compiler (-Xcompiler -std=...,
    -Xcompiler=...). imagegen (model/cxx_std.py) reads them; this script only records."""
    out = []
    i = 0
    while i < len(argv):
        a = argv[i]
        nxt = argv[i + 1] if i + 1 < len(argv) else None
        if (a in _STD_OPTIONS or a in _HOST_OPTIONS) and nxt is not None:
            if a in _STD_OPTIONS or "std" in nxt:
                out += [a, nxt]
            i += 2
            continue
        if a.startswith(("-std=", "--std=", "/std:", "-std:")) or (a.startswith(tuple(o + "=" for o in _HOST_OPTIONS)) and "std" in a):
            out.append(a)
        i += 1
    return out


def _module_of(so_path):
    """sageattention/_qattn_sm90.cpython-312-x86_64-linux-gnu.so -> sageattention._qattn_sm90."""
    parts = so_path.replace("\\", "/").split("/")
    for i in range(len(parts) - 1, -1, -1):
        if parts[i] == "lib" or parts[i].startswith("lib.") or parts[i] == "build_lib":
            parts = parts[i + 1:]
            break
    else:
        parts = parts[-1:]
    parts[-1] = parts[-1].split(".", 1)[0]
    return ".".join(p for p in parts if p)


def _arch_order(name):
    """sm_80 < sm_90a < sm_120 (numbers, not text)."""
    m = re.search(r"(\d+)([a-z]*)$", name)
    return (int(m.group(1)), m.group(2)) if m else (0, name)


def _is_link(r):
    return r["tool"] == "ld" or ("-shared" in r["argv"] and r["tool"] in ("cc", "cxx"))


def _absolute_outputs(r):
    """The files a compile or link record writes, as absolute paths."""
    outs, _ = _outputs(r["argv"])
    return [os.path.normpath(os.path.join(r["cwd"], o)) for o in outs]


def _link_parts(r):
    """(the file a link record writes, the objects it links), as absolute paths."""
    outs = _absolute_outputs(r)
    objs = [os.path.normpath(os.path.join(r["cwd"], a)) for a in r["argv"] if a.endswith(".o")]
    return (outs[0] if outs else ""), objs


def _link_groups(records):
    """(module, its compile records) per extension the build links, grouped as fold() groups them."""
    compiles, links = {}, []
    for r in records:
        if _is_link(r):
            output, objs = _link_parts(r)
            links.append((_module_of(output), objs))
            continue
        for o in _absolute_outputs(r):
            compiles[o] = r
    return [(module, [compiles[o] for o in objs if o in compiles]) for module, objs in links]


def fold(records, src_root):
    """Group compile records into extensions through the link records that consume their objects."""
    compiles = {}  # object path -> entry
    links = []
    for r in records:
        argv, cwd = r["argv"], r["cwd"]
        if _is_link(r):
            output, objs = _link_parts(r)
            links.append({"output": output, "objects": objs})
            continue
        absolute = _absolute_outputs(r)
        sources = [a for a in argv if _SOURCE.search(a) and not a.startswith("-")]
        src = sources[-1] if sources else ""
        src_abs = os.path.normpath(os.path.join(cwd, src)) if src else ""
        shown = os.path.relpath(src_abs, src_root) if src_abs.startswith(src_root + os.sep) else src
        # A stable-ABI compile (TORCH_TARGET_VERSION / TORCH_STABLE_ONLY) includes only torch's stable
        # headers, which compile as C++17 where torch/extension.h #errors (torch 2.14: g++ -std=c++17
        # -fsyntax-only of torch/csrc/stable/library.h and tensor.h passes): its standard is not held to
        # torch's extension minimum; the header probe (the stable unit, with its flags) judges it.
        stable = stable_abi(argv)
        entry = {"tool": r["tool"], "source": shown, "std": std_args(argv), "stable": stable}
        if r["tool"] == "nvcc":
            entry["targets"] = ["%s:%s" % t for t in nvcc_targets(argv)]
            entry["flags"] = _flags(argv)
        for o in absolute:
            compiles[o] = entry
    extensions, used = [], set()
    for link in links:
        parts = [compiles[o] for o in link["objects"] if o in compiles]
        used.update(o for o in link["objects"] if o in compiles)
        nvcc_parts = [p for p in parts if p["tool"] == "nvcc"]
        sass = sorted({t.split(":", 1)[1] for p in nvcc_parts for t in p["targets"] if t.startswith("sass:")}, key=_arch_order)
        ptx = sorted({t.split(":", 1)[1] for p in nvcc_parts for t in p["targets"] if t.startswith("ptx:")}, key=_arch_order)
        other = sorted({t for p in nvcc_parts for t in p["targets"] if not t.startswith(("sass:", "ptx:"))})
        # The standard of each kind of compile (nvcc, the host compiler): distinct argument lists,
        # an empty one where the command line names none.
        stds = []
        for p in parts:
            if p["stable"]:
                continue
            item = {"tool": p["tool"], "args": p["std"]}
            if item not in stds:
                stds.append(item)
        common = None
        for p in nvcc_parts:
            common = list(p["flags"]) if common is None else [f for f in common if f in p["flags"]]
        extensions.append({
            "module": _module_of(link["output"]),
            "output": os.path.basename(link["output"]),
            "sources": [p["source"] for p in parts],
            "cuda_sources": [{"source": p["source"], "targets": p["targets"]} for p in nvcc_parts],
            "sass": sass,
            "ptx": ptx,
            "other_targets": other,
            "nvcc_flags": common or [],
            "std_args": stds[:20],
            "stable_abi_sources": sum(1 for p in parts if p["stable"]),
        })
    loose = [dict(e, object=o) for o, e in compiles.items() if o not in used and e["tool"] == "nvcc"]
    return {"extensions": extensions, "unlinked_cuda_compiles": loose}


def read_records(log):
    out = []
    try:
        with open(log, encoding="utf-8", errors="replace") as fh:
            for n, line in enumerate(fh):
                if n >= 200000:  # bound what a hostile build can make us hold
                    break
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
    except OSError:
        pass
    return out


def phases(records, started, ended):
    """Where the package's build spent the audit's time, from the records' timestamps: until its first
    compile (setup.py, importing torch, ...), its compiles (stand-ins: recorded, nothing compiled)
    and after the last one (linking, packing the wheel); seconds, and the number of records."""
    times = sorted(r["t"] for r in records if isinstance(r.get("t"), (int, float)))
    if not times:
        return {"records": 0, "before": round(ended - started, 2), "compiles": 0.0, "after": 0.0}
    first, last = max(started, times[0]), min(ended, times[-1])
    return {"records": len(times), "before": round(first - started, 2), "compiles": round(max(0.0, last - first), 2),
            "after": round(max(0.0, ended - last), 2)}



# ------------------------------------------------------------------------------------------------
# The header probe: do torch's headers compile with each extension's own flags?
#
# The records say what each compile would be asked; they cannot say whether torch's headers compile
# that way (torch 2.14's #error below C++20, a toolkit without cusparse.h). The probe runs the real
# compilers on one small unit per distinct flag set: the recorded command line with its source,
# output, dependency files and GPU targets replaced. nvcc gets no target (its own default): the
# probe stops before any device code is compiled (cicc, ptxas), the host-side pass it runs does not
# depend on the arch, a target nvcc cannot compile is the gencode audit's finding, not the headers',
# and extensions that differ only in their targets (one per arch family) share one probe. The host
# compiler gets torch/extension.h, nvcc that and ATen/cuda/CUDAContext.h. A compile that defines
# TORCH_TARGET_VERSION or TORCH_STABLE_ONLY builds against torch's stable ABI (torch >= 2.9:
# flash-attn-3's and xformers' flash_api_stable.cpp): torch/extension.h stops such a unit at an
# #error by design, so both compilers get torch/csrc/stable/library.h instead.
#
# By default both only preprocess (-E, -Wfatal-errors): #error guards (the C++ standard, compiler
# versions) and missing headers, ~2 s of CPU each. Parsing costs far more (torch 2.14's headers:
# g++ -fsyntax-only ~30 s of CPU, ~20 s stopped at a static_assert right after the headers; nvcc's
# front end cudafe++ ~25 s), so it is IMAGEGEN_AUDIT_PROBE=full: g++ -fsyntax-only -Wfatal-errors
# and nvcc -c with an error limit of 1 (-Xcudafe --error_limit=1), both stopped at that static_assert
# (nvcc before cicc, ptxas and the host compile).

PROBE_ENV = "IMAGEGEN_AUDIT_PROBE"  # 0/off: no probe; full: both compilers parse; else (default) preprocess
PROBE_END = "imagegen-probe: end of the headers"
HOST_UNIT = '#include <torch/extension.h>\nstatic_assert(false, "%s");\n' % PROBE_END
CUDA_UNIT = '#include <torch/extension.h>\n#include <ATen/cuda/CUDAContext.h>\nstatic_assert(false, "%s");\n' % PROBE_END
STABLE_UNIT = '#include <torch/csrc/stable/library.h>\nstatic_assert(false, "%s");\n' % PROBE_END
_STABLE_DEFINES = frozenset(("TORCH_TARGET_VERSION", "TORCH_STABLE_ONLY"))
PROBE_MAX = 12  # distinct flag sets probed at most (each costs seconds)
PROBE_TIMEOUT = 240
_CXX_SOURCE = re.compile(r"\.(cpp|cc|cxx|c\+\+|C)$")
# Options whose value is the next argument and that the probe replaces (outputs, dependency files,
# the language, GPU targets, nvcc's time log).
_DROP_WITH_VALUE = frozenset((
    "-o", "--output-file", "-MF", "--dependency-output", "-MT", "-MQ", "--dependency-target-name", "-x", "--x",
    "-gencode", "--generate-code", "-arch", "--gpu-architecture", "-code", "--gpu-code", "-odir",
    "--output-directory", "--time", "-time", "--keep-dir", "-keep-dir"))
# Flags the probe replaces: what to produce (an object, dependencies, relocatable device code).
_DROP = frozenset((
    "-c", "--compile", "-MD", "-MMD", "-MP", "-M", "-MM", "-E", "--preprocess", "-fsyntax-only",
    "--generate-dependencies", "--generate-nonsystem-dependencies", "--generate-dependencies-with-compile",
    "--generate-nonsystem-dependencies-with-compile", "-dc", "--device-c", "-dw", "--device-w", "-cuda",
    "--cuda", "-ptx", "--ptx", "-cubin", "--cubin", "-fatbin", "--fatbin", "-keep", "--keep", "-dryrun",
    "--dryrun", "-shared", "--shared", "-lib", "--lib", "-link", "--link", "-Wfatal-errors"))
_DROP_PREFIX = ("-MF", "--dependency-output=", "-MT", "-MQ", "--dependency-target-name=", "--output-file=", "-gencode=",
                "--generate-code=", "-arch=", "--gpu-architecture=", "-code=", "--gpu-code=", "-odir=",
                "--output-directory=", "--time=", "-x=", "--x=", "-Wp,-MD", "-Wp,-MMD")
_CCBIN = ("-ccbin", "--compiler-bindir")
# torch's BuildExtension defines the extension's name for PYBIND11_MODULE in its own sources; no
# header reads it, and without it the extensions of one package share their flag sets (one probe).
_OWN_NAME = "-DTORCH_EXTENSION_NAME="


def probe_mode(env):
    """"off", "full" or "on" (the default) from IMAGEGEN_AUDIT_PROBE."""
    value = (env.get(PROBE_ENV) or "").strip().lower()
    if value in ("0", "off", "no", "false"):
        return "off"
    return "full" if value == "full" else "on"


def probe_kind(tool, argv):
    """"nvcc", "host" (a C++ compile by a GCC/Clang-like compiler) or None (not probed: C, MSVC, a
    link, anything on Windows)."""
    if os.name == "nt":
        return None  # MSVC hosts: not probed (yet)
    if tool == "nvcc":
        return "nvcc"
    if tool not in ("cc", "cxx") or "-shared" in argv:
        return None
    if any(a.startswith(("/Fo", "/std:")) or a in ("/c", "/EHsc") for a in argv):
        return None  # MSVC's spelling: not probed here
    sources = [a for a in argv if _SOURCE.search(a) and not a.startswith("-")]
    cxx_lang = any(argv[i] == "-x" and argv[i + 1] in ("c++", "cu") for i in range(len(argv) - 1))
    return "host" if cxx_lang or any(_CXX_SOURCE.search(s) for s in sources) else None


def stable_abi(argv):
    """Does this compile define TORCH_TARGET_VERSION or TORCH_STABLE_ONLY (a torch stable-ABI
    extension, whose sources must not include torch/extension.h)? -DNAME, -D NAME and nvcc's
    --define-macro NAME / --define-macro=NAME, each with or without =VALUE."""
    for i, a in enumerate(argv):
        if a in ("-D", "--define-macro"):
            name = argv[i + 1] if i + 1 < len(argv) else ""
        elif a.startswith("--define-macro="):
            name = a[len("--define-macro="):]
        elif a.startswith("-D"):
            name = a[2:]
        else:
            continue
        if name.split("=", 1)[0] in _STABLE_DEFINES:
            return True
    return False


def has_torch_headers(argv, cwd):
    """Is torch's include folder on this compile's include path? (cpp_extension puts it there; a
    plain C++ or CUDA extension that does not use torch is not probed.)"""
    return any(os.path.isfile(os.path.join(cwd, d, "torch", "extension.h")) for d in _include_dirs(argv))


def probe_flags(argv, stubs=None):
    """A recorded command line without what the probe replaces: its sources and objects, -c, -o,
    dependency files, the language, GPU targets and -DTORCH_EXTENSION_NAME (shell words, in order;
    ``stubs`` maps a stand-in's path, e.g. nvcc's -ccbin, to the real tool's)."""
    stubs = stubs or {}
    out = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in _DROP_WITH_VALUE or (a == "-D" and argv[i + 1:i + 2] and argv[i + 1].startswith(_OWN_NAME[2:])):
            i += 2
            continue
        if a.startswith(_OWN_NAME):
            i += 1
            continue
        if a in _DROP or a.startswith(_DROP_PREFIX) or (a.startswith("-o") and len(a) > 2 and not a.startswith(("-opt", "-odir"))):
            i += 1
            continue
        if not a.startswith("-") and (_SOURCE.search(a) or a.endswith((".cu", ".o", ".obj"))):
            i += 1
            continue
        if a in _CCBIN and i + 1 < len(argv):
            out += [a, stubs.get(argv[i + 1], argv[i + 1])]
            i += 2
            continue
        for opt in _CCBIN:
            if a.startswith(opt + "=") and a[len(opt) + 1:] in stubs:
                a = opt + "=" + stubs[a[len(opt) + 1:]]
        out.append(a)
        i += 1
    return out


_PATH_OPTIONS = ("-I", "-isystem", "-iquote", "-idirafter", "-include", "-imacros", "--include-path",
                 "--system-include", "--pre-include")


def where_flags_point(flags, cwd):
    """What a flag set means wherever it runs: its include folders and forced includes made absolute
    against the compile's folder (a package that builds each extension in its own folder, as
    SageAttention 2.2's EXT_PARALLEL does, gives the same flags from four folders: one probe). A flag set
    that reads options from a file (@FILE, --options-file) keeps its folder: what it means lies there."""
    out = []
    i = 0
    while i < len(flags):
        a = flags[i]
        if a.startswith("@") or a.split("=", 1)[0] in ("--options-file", "-optf"):
            return (cwd,) + tuple(flags)
        if a in _PATH_OPTIONS and i + 1 < len(flags):
            out += [a, os.path.normpath(os.path.join(cwd, flags[i + 1]))]
            i += 2
            continue
        for opt in _PATH_OPTIONS:
            joined = opt + "=" if opt.startswith("--") else opt  # -Idir, --include-path=dir
            if a.startswith(joined) and len(a) > len(joined):
                a = joined + os.path.normpath(os.path.join(cwd, a[len(joined):]))
                break
        out.append(a)
        i += 1
    return tuple(out)


def probe_command(kind, argv, unit, out, mode="on", stubs=None):
    """The probe's arguments (without the compiler) for a recorded compile of ``kind``."""
    flags = probe_flags(argv, stubs)
    if kind == "host":
        if mode == "full":
            return flags + ["-fsyntax-only", "-Wfatal-errors", "-x", "c++", unit]
        return flags + ["-E", "-Wfatal-errors", "-x", "c++", unit, "-o", out]
    if mode == "full":
        return flags + ["-Xcudafe", "--error_limit=1", "-c", "-x", "cu", unit, "-o", out]
    return flags + ["-Xcompiler=-Wfatal-errors", "-E", "-x", "cu", unit, "-o", out]


def _include_dirs(argv):
    dirs = []
    for i, a in enumerate(argv):
        if a in ("-I", "-isystem", "-iquote", "-idirafter", "--include-path", "--system-include") and i + 1 < len(argv):
            dirs.append(argv[i + 1])
        elif a.startswith("-I") and len(a) > 2:
            dirs.append(a[2:])
        elif a.startswith(("--include-path=", "--system-include=")):
            dirs.append(a.split("=", 1)[1])
    return dirs


_FIRST_ERROR = re.compile(r"(?:^|:\d+(?::\d+)?: |\(\d+\): )(?:fatal |catastrophic )?error\b"
                          r"|^\S*(?:nvcc|cc1plus|cicc|cudafe\+\+) (?:fatal|error)\s*:|^[\w.+/-]+: (?:fatal )?error:")


def first_error(text, include_dirs=()):
    """The compiler's first error line, with the include folder it was found in cut off its path
    (torch/csrc/api/include/torch/all.h:5:2: error: #error C++20 or later ...); "" when none."""
    for line in text.splitlines():
        line = line.strip()
        if not _FIRST_ERROR.search(line):
            continue
        # the shortest include folder the path lies in: the header's path as torch ships it
        for d in sorted((os.path.normpath(d) for d in include_dirs if d), key=len):
            if line.startswith(d + os.sep):
                line = line[len(d) + 1:]
                break
        return line[:300]
    return ""


def _probe_outcome(rc, text, include_dirs):
    """(ok, error line) of a probe run: it passes when it exits 0 (preprocessing) or its only error is
    the static_assert after the headers (parsing)."""
    error = first_error(text, include_dirs)
    if PROBE_END in error or (rc == 0 and not error):
        return True, ""
    if rc == 0 and error:
        return True, ""  # an error word in a warning's text (a macro named so): the compiler accepted it
    return False, error or (text.strip().splitlines() or ["exit %d" % rc])[-1][:300]


def _compiler_name(tool, real):
    """g++, nvcc: the compiler's name, past a ccache/sccache wrapper."""
    words = [os.path.basename(w) for w in real.get(tool) or [] if not w.startswith("-")]
    words = [w for w in words if w not in ("ccache", "sccache")] or words
    return words[0] if words else tool


def run_probes(records, env, work, mode="on", stubs=None, runner=None, limit=PROBE_MAX):
    """Probe each distinct flag set of the recorded compiles; return the report's ``probe`` section
    and, per extension module, its probes."""
    started = time.time()
    real = json.loads(env.get(REAL_ENV) or "{}")
    env = dict((k, v) for k, v in env.items() if k != LOG_ENV)  # a stand-in reached by mistake records nothing
    if stubs is None:
        stubs = stub_paths(work, real)
    groups = _link_groups(records)
    distinct = {}  # (tool, cwd, flags) -> probe
    order = []
    for module, recs in groups:
        for r in recs:
            kind = probe_kind(r["tool"], r["argv"])
            if kind is None or not has_torch_headers(r["argv"], r["cwd"]):
                continue
            flags = probe_flags(r["argv"], stubs)
            key = (r["tool"], where_flags_point(flags, r["cwd"]))
            if key not in distinct:
                distinct[key] = {"kind": kind, "tool": r["tool"], "cwd": r["cwd"], "argv": r["argv"], "modules": []}
                order.append(key)
            if module not in distinct[key]["modules"]:
                distinct[key]["modules"].append(module)
    folder = os.path.join(work, "probe")
    os.makedirs(folder, exist_ok=True)
    host_unit = os.path.join(folder, "imagegen_probe.cpp")
    cuda_unit = os.path.join(folder, "imagegen_probe.cu")
    stable_units = {"host": os.path.join(folder, "imagegen_probe_stable.cpp"),
                    "nvcc": os.path.join(folder, "imagegen_probe_stable.cu")}
    _touch(host_unit, HOST_UNIT.encode())
    _touch(cuda_unit, CUDA_UNIT.encode())
    for path in stable_units.values():
        _touch(path, STABLE_UNIT.encode())
    jobs = []
    for n, key in enumerate(order[:limit]):
        p = distinct[key]
        if stable_abi(p["argv"]):
            unit = stable_units[p["kind"]]
        else:
            unit = host_unit if p["kind"] == "host" else cuda_unit
        args = probe_command(p["kind"], p["argv"], unit, os.path.join(folder, "probe%d.out" % n), mode, stubs)
        jobs.append((p, real.get(p["tool"]), args))
    run = runner or _run_probe
    results = _in_parallel(run, jobs, env)
    runs, per_module = [], {}
    for (p, cmd, args), (rc, text, seconds) in zip(jobs, results):
        entry = {"compiler": _compiler_name(p["tool"], real), "tool": p["tool"],
                 "what": "parse" if mode == "full" else "preprocess",
                 "seconds": round(seconds, 2), "modules": p["modules"]}
        if rc is None:
            entry.update({"ok": None, "error": text[:300]})
        else:
            ok, error = _probe_outcome(rc, text, _include_dirs(args))
            entry.update({"ok": ok, "error": error})
        runs.append(entry)
        for m in p["modules"]:
            per_module.setdefault(m, []).append(dict((k, v) for k, v in entry.items() if k != "modules"))
    return {"mode": mode, "seconds": round(time.time() - started, 2), "runs": runs,
            "not_probed": max(0, len(order) - limit)}, per_module


def _in_parallel(run, jobs, env):
    """Run the probes, as many at once as there are CPUs (two probes, host and nvcc, on two cores)."""
    if not jobs:
        return []
    import threading
    results = [None] * len(jobs)
    lock = threading.Lock()
    pending = list(range(len(jobs)))

    def worker():
        while True:
            with lock:
                if not pending:
                    return
                n = pending.pop(0)
            p, cmd, args = jobs[n]
            results[n] = run(cmd, args, p["cwd"], env)

    threads = [threading.Thread(target=worker) for _ in range(max(1, min(len(jobs), os.cpu_count() or 1)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def _run_probe(cmd, args, cwd, env):
    """(exit status, output, seconds); status None when the compiler could not run."""
    import subprocess
    if not cmd:
        return None, "no real compiler to run", 0.0
    started = time.time()
    try:
        proc = subprocess.run(list(cmd) + list(args), cwd=cwd if os.path.isdir(cwd) else None, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=PROBE_TIMEOUT)
    except subprocess.TimeoutExpired:
        return None, "timed out after %d s" % PROBE_TIMEOUT, time.time() - started
    except OSError as exc:
        return None, "cannot run %s: %s" % (cmd[0], exc.strerror or exc), time.time() - started
    return proc.returncode, proc.stdout.decode("utf-8", "replace"), time.time() - started


def stub_paths(work, real):
    """Each stand-in's path -> the real tool it stands for (nvcc's -ccbin names the C stand-in)."""
    out = {}
    for tool in STUB_TOOLS:
        path = os.path.join(work, "stubs", tool) if tool != "nvcc" else os.path.join(work, "cuda", "bin", "nvcc")
        if real.get(tool):
            out[path] = real[tool][0]
    return out


_CODE_FILE = re.compile(r"\.(cu|cuh|cpp|cc|cxx|c\+\+|h|hh|hpp|hxx|inl|inc)$")


def includes_aten_cuda(src_root, max_files=20000, max_bytes=256 << 20):
    """Does the package's source include an ATen/cuda/ header (CUDAContext.h and what it needs:
    cusparse.h, cublas_v2.h, ...)? None when there is no tree to read; True when the tree is too big
    to read whole (the strict answer)."""
    if not src_root or not os.path.isdir(src_root):
        return None
    files = read = 0
    for folder, dirs, names in os.walk(src_root):
        dirs[:] = [d for d in dirs if d not in (".git", "build", "dist", "__pycache__")]
        for name in names:
            if not _CODE_FILE.search(name):
                continue
            files += 1
            path = os.path.join(folder, name)
            try:
                with open(path, "rb") as fh:
                    data = fh.read(max_bytes - read)
            except OSError:
                continue
            read += len(data)
            if b"ATen/cuda/" in data:
                return True
            if files >= max_files or read >= max_bytes:
                return True
    return False


def _link_args(argv):
    """(-L folders, -l names) of a link command line (-Lx and -L x alike)."""
    folders, names = [], []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("-L", "-l") and i + 1 < len(argv):
            (folders if a == "-L" else names).append(argv[i + 1])
            i += 2
            continue
        if a.startswith("-L") and len(a) > 2:
            folders.append(a[2:])
        elif a.startswith("-l") and len(a) > 2:
            names.append(a[2:])
        elif a.startswith("-Wl,"):  # -Wl,-L,DIR / -Wl,-LDIR: folders handed to the linker itself
            parts = a[4:].split(",")
            for n, part in enumerate(parts):
                if part == "-L" and n + 1 < len(parts):
                    folders.append(parts[n + 1])
                elif part.startswith("-L") and len(part) > 2:
                    folders.append(part[2:])
        i += 1
    return folders, names


def _library_files(name):
    """The files `-lNAME` asks the linker for (`-l:FILE` names the file itself)."""
    return [name[1:]] if name.startswith(":") else ["lib%s.so" % name, "lib%s.a" % name]


def _compiler_finds(compiler, files, env, timeout=30):
    """Does the compiler driver's own library search find one of ``files`` (`-print-file-name`, which
    answers the bare name when it finds nothing)? None when it cannot be asked."""
    import subprocess

    if not compiler:
        return None
    for name in files:
        try:
            proc = subprocess.run(list(compiler) + ["-print-file-name=%s" % name], env=env, capture_output=True,
                                  timeout=timeout, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError):
            return None
        if proc.returncode != 0:
            return None
        answer = proc.stdout.decode("utf-8", "replace").strip()
        if os.path.isabs(answer) and os.path.exists(answer):
            return True
    return False


def missing_libraries(records, env):
    """Per extension module, the libraries its link asks for (-lNAME) that the linker would not find:
    not in the link's -L folders, not on LIBRARY_PATH, not in the real compiler driver's own search
    (its -print-file-name). The classic case: -lcuda where no driver is installed (a CPU builder, a
    pypi toolkit): the compile passes and the link stops at `cannot find -lcuda`."""
    real = json.loads(env.get(REAL_ENV) or "{}")
    compiler = real.get("cxx") or real.get("cc")
    library_path = [d for d in (env.get("LIBRARY_PATH") or "").split(os.pathsep) if d]
    asked, missing = {}, {}
    for r in records:
        if not _is_link(r):
            continue
        module = _module_of(_link_parts(r)[0])
        folders, names = _link_args(r["argv"])
        folders = [os.path.join(r["cwd"], f) for f in folders] + library_path
        for name in names:
            files = _library_files(name)
            if any(os.path.exists(os.path.join(f, n)) for f in folders for n in files):
                continue
            if name not in asked:
                asked[name] = _compiler_finds(compiler, files, env)
            if asked[name] is False and name not in missing.setdefault(module, []):
                missing[module].append(name)
    return dict((m, names) for m, names in missing.items() if names)


def add_link_check(report, records, env):
    """Each extension's ``link_missing``: the -l libraries its link would not find (missing_libraries)."""
    missing = missing_libraries(records, env)
    for ext in report.get("extensions", []):
        ext["link_missing"] = missing.get(ext["module"], [])
    return report


def add_probe(report, records, env, work, mode=None, src_root=None):
    """Run the header probe on an audit's records and put its results into ``report``: the section
    ``probe`` (mode, seconds, one entry per distinct flag set, whether the package's own sources
    include ATen/cuda/ headers: the nvcc probe includes CUDAContext.h whether or not they do) and each
    extension's ``probe`` list."""
    mode = mode or probe_mode(env)
    if mode == "off":
        report["probe"] = {"mode": "off", "seconds": 0.0, "runs": [], "not_probed": 0}
        return report
    section, per_module = run_probes(records, env, work, mode)
    section["aten_cuda_included"] = includes_aten_cuda(src_root)
    report["probe"] = section
    for ext in report.get("extensions", []):
        ext["probe"] = per_module.get(ext["module"], [])
    return report
