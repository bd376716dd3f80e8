"""The gencode audit's header probe: do torch's headers compile with each extension's own flags? The real
compilers on one small unit per distinct flag set of the audit's records (imagegen_audit_records.py);
what they say goes into the audit's report (add_probe). The long story is in the comment below.

Shipped beside imagegen_audit.py (standard library only, Python 3.8+)."""

import json
import os
import re
import time

from imagegen_audit import LOG_ENV, REAL_ENV, STUB_TOOLS, _touch
from imagegen_audit_records import _SOURCE, _link_groups, stable_abi

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
