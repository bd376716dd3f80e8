"""The environment of a build (imagegen_build.py's `build` and `env` steps): the package's arch knob from
TORCH_CUDA_ARCH_LIST, MAX_JOBS and NVCC_THREADS (given, from the imagegen_jobs secret, or sized from this
machine and the audit's load), the recipe's variables, nvcc and ninja on PATH.

Shipped beside imagegen_build.py (standard library only, Python 3.8+). Arch lists and job sizing are
imagegen_rules.py's, the module imagegen itself plans with, so that the two can never differ."""

import os
import shutil
import subprocess
import sys

import imagegen_resume as resume
import imagegen_rules as rules
from imagegen_toolchain import SECRETS, fail, log, venv_python

# Arch lists and job sizing: imagegen_rules.py, the module imagegen itself uses (shipped beside this
# script), so that these can never differ from what imagegen plans with.


def parse_archs(text):
    """imagegen's canonical arch list as (major, minor, variant, sass, ptx) tuples; exit 2 on anything else."""
    try:
        return rules.parse_canonical(text)
    except ValueError as exc:
        fail(str(exc), 2)


def format_archs(archs, style, keep_variant=False):
    try:
        return rules.format_archs(archs, style, keep_variant)
    except ValueError as exc:
        fail(str(exc), 2)


def apply_runs_on(archs, runs_on, package="the package"):
    """The archs the knob really compiles (imagegen.cell_rules.compiled_archs: the same rule) and a log line."""
    archs, moved = rules.map_families(archs, runs_on)
    return archs, rules.family_note(moved, package) if moved else ""


def load_extensions(cell):
    return (cell.get("load_profile") or {}).get("extensions") or []


def ext_parallel_max(cell):
    ext = cell.get("ext_parallel") or {}
    return int(ext.get("max") or 1) if ext.get("env") else 0


def auto_jobs(cell, threads, targets=0):
    """MAX_JOBS from this machine's cores and RAM (imagegen_rules.job_settings, what imagegen plans
    with): `threads` nvcc threads per job, at most one per -gencode target (`targets`); with the
    audit's load (cell["load_profile"]), the most jobs whose peak estimate fits."""
    cpus, mem_gb = rules.host_facts()
    extensions = load_extensions(cell)
    per_thread = float(cell["memory_per_thread_gb"] if extensions
                       else cell.get("memory_per_thread_gb_max") or cell["memory_per_thread_gb"])
    return rules.job_settings(per_thread, threads, cpus, mem_gb, nvcc_threads=threads, targets=targets,
                              extensions=extensions, ext_max=ext_parallel_max(cell),
                              host_gb=load_host_gb(cell.get("load_profile")))[0]


def auto_threads(cell):
    """NVCC_THREADS when none is given: the recipe's, fewer on a machine with little RAM (the same rule)."""
    cpus, mem_gb = rules.host_facts()
    per_thread = float(cell.get("memory_per_thread_gb_max") or cell["memory_per_thread_gb"])
    return rules.job_settings(per_thread, int(cell["default_nvcc_threads"]), cpus, mem_gb)[1]


split_extensions = rules.split_extensions


def peak_estimate(load, total_jobs, nvcc_threads, per_thread_gb, ext_max=0):
    """rules.peak_estimate over a cell's load_profile (GB, nvcc at once, busy threads)."""
    return rules.peak_estimate(load.get("extensions") or [], total_jobs, nvcc_threads, per_thread_gb, ext_max,
                               load_host_gb(load))


def load_host_gb(load):
    """The host part per nvcc (GB) a load profile was estimated with (the recipe's nvcc_host_gb), else
    the rules' default: what the job choice and the printed estimate both use."""
    return float((load or {}).get("host_gb") or rules.NVCC_HOST_GB)


def visible_gpu_archs(cell):
    """`docker run --gpus all IMAGE` without TORCH_CUDA_ARCH_LIST (an RTX 5090 user's SageAttention builder): build for the GPUs the
    container sees. Empty when there are none (parse_archs then says what to set)."""
    py = venv_python(cell) if os.path.exists(venv_python(cell)) else sys.executable
    code = ("import torch\nif torch.cuda.is_available():\n"
            "    print(';'.join(sorted({'%d.%d' % torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})))")
    try:
        found = subprocess.run([py, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               timeout=120).stdout.decode().strip().splitlines()
    except (OSError, subprocess.SubprocessError):
        found = []
    if found and found[-1]:
        log("TORCH_CUDA_ARCH_LIST=%s (the GPUs this build can see)" % found[-1])
        return found[-1]
    return ""


def jobs_from_secret():
    """MAX_JOBS and NVCC_THREADS as imagegen's bake sized them for this batch (the imagegen_jobs
    secret: NAME=N lines); nothing when the secret is absent or empty (a plain `docker build`, a
    native build, `docker run` of a builder image): the ARGs, the environment or the auto rule."""
    path = os.path.join(SECRETS, rules.JOBS_SECRET)
    found = {}
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read(4096)
    except OSError:
        return found
    for line in text.splitlines():
        name, _, value = line.strip().partition("=")
        if name in ("MAX_JOBS", "NVCC_THREADS") and value.isdigit() and 0 < int(value) <= 4096:
            found[name] = value
        elif name == resume.BUDGET_ENV and value.isdigit():  # `imagegen build --budget`: no cache key either
            found[name] = value
    return found


def build_env(cell):
    env = dict(os.environ)
    env.update(jobs_from_secret())
    env.update(cell.get("env", {}))
    env.update(cell.get("force_env", {}))
    knob = cell["knob"]
    if not (env.get("TORCH_CUDA_ARCH_LIST") or "").strip():
        env["TORCH_CUDA_ARCH_LIST"] = visible_gpu_archs(cell)
    archs = parse_archs(env.get("TORCH_CUDA_ARCH_LIST") or "")
    if knob["style"] != "fixed":
        archs, note = apply_runs_on(archs, knob.get("runs_on"), cell.get("recipe") or "the package")
        if note:
            log(note)
        value = format_archs(archs, knob["style"], knob.get("keep_variant", False))
        env[knob["env"]] = value
        log("%s=%s (from TORCH_CUDA_ARCH_LIST=%s)" % (knob["env"], value, env["TORCH_CUDA_ARCH_LIST"]))
    given = (env.get("NVCC_THREADS") or "").strip()
    threads = int(given) if given.isdigit() and int(given) > 0 else auto_threads(cell)
    if cell.get("threads_env"):
        env[cell["threads_env"]] = str(threads)
    jobs = env.get("MAX_JOBS") or ""
    # -gencode targets per nvcc call: a fixed-arch package's own list (the plan counted it), else the list
    targets = knob.get("targets") or sum(int(a[3]) + int(a[4]) for a in archs)
    jobs = int(jobs) if jobs.strip().isdigit() and int(jobs) > 0 else auto_jobs(cell, threads, targets)
    total = jobs
    ext = cell.get("ext_parallel") or {}
    if ext.get("env"):
        # MAX_JOBS is the cell's whole budget: a package that builds several extensions at once
        # (EXT_PARALLEL x MAX_JOBS jobs) gets it split between them (same rule as imagegen.model.jobs).
        parallel, jobs = split_extensions(total, int(ext.get("max") or 1))
        env[ext["env"]] = str(parallel)
        log("%s=%d extensions at once, MAX_JOBS=%d each" % (ext["env"], parallel, jobs))
    env[cell.get("jobs_env") or "MAX_JOBS"] = str(jobs)
    env["MAX_JOBS"] = str(jobs)
    per_thread = float(cell["memory_per_thread_gb"])
    if cell.get("load_profile"):
        gb, nvcc, busy = peak_estimate(cell["load_profile"], total, threads, per_thread, ext_parallel_max(cell))
        log("MAX_JOBS=%d NVCC_THREADS=%d (about %.0f GB of RAM at the peak: %d nvcc at once, %d busy threads,"
            " from the audit)" % (total, threads, gb, nvcc, busy))
    else:
        busy = min(threads, targets) if targets else threads
        per_thread = float(cell.get("memory_per_thread_gb_max") or per_thread)
        log("MAX_JOBS=%d NVCC_THREADS=%d (about %.0f GB of RAM at the peak)" % (total, threads, total * busy * per_thread))
    if cell.get("local_version_env"):
        env[cell["local_version_env"]] = cell["local_version"]
    venv_scripts_on_path(env, venv_python(cell))
    if cell.get("cuda_home"):
        env["CUDA_HOME"] = cell["cuda_home"]
        env["PATH"] = path_with_nvcc(env.get("PATH", ""), cell["cuda_home"])
    return env


def venv_scripts_on_path(env, py):
    """The build's venv's bin/ first on PATH, as if activated (imagegen_rules.path_with_venv)."""
    path = rules.path_with_venv(env.get("PATH", ""), py)
    if path != env.get("PATH", ""):
        env["PATH"] = path
        log("PATH: %s first (the build's venv, as if activated: its cmake, ninja and other tools)"
            % path.split(os.pathsep)[0])


def path_with_nvcc(path, cuda_home):
    """PATH with CUDA_HOME's nvcc first: unchanged when it already is the first nvcc on it (the
    usual host), so that a native build runs in the user's own environment plus the variables
    `--print-env` names, and a plain `pip wheel` with those variables repeats it exactly."""
    nvcc = os.path.join(cuda_home, "bin", "nvcc")
    found = shutil.which("nvcc", path=path)
    if found and os.path.realpath(found) == os.path.realpath(nvcc):
        return path
    return os.path.join(cuda_home, "bin") + os.pathsep + path if path else os.path.join(cuda_home, "bin")


# What finds the ninja binary a `ninja` package installed (its RECORD names it, e.g. ../../../bin/ninja,
# wherever that environment's scripts went), else the package's own BIN_DIR (ninja < 1.11.1.2).
_FIND_NINJA = """
import importlib.metadata as md, os, sys
try:
    dist = md.distribution("ninja")
except md.PackageNotFoundError:
    sys.exit(0)
found = [os.path.realpath(str(dist.locate_file(f))) for f in (dist.files or ()) if f.name in ("ninja", "ninja.exe")]
try:
    import ninja
    found.append(os.path.join(getattr(ninja, "BIN_DIR", "") or "-", "ninja"))
except Exception:
    pass
print("\\n".join(p for p in found if os.path.isfile(p) and os.access(p, os.X_OK))[:4096])
"""


def ninja_on_path(env, py):
    """Make torch's `ninja --version` check pass where the build's Python has the ninja package but
    PATH lacks its binary. torch then silently falls back to its distutils backend, which compiles
    one file after another: MAX_JOBS and EXT_PARALLEL do nothing, the nvcc guard and its progress
    lines are bypassed, and a build takes as long as all its files together (seen on the H100: a
    base image whose Python saw another venv's ninja package, so pip skipped ours; 893 s against the
    native 270-408 s). Returns the folder put in front of PATH, "" when none was needed, or None
    (logged) when no ninja exists at all."""
    if shutil.which("ninja", path=env.get("PATH")):
        return ""
    try:
        run = subprocess.run([py, "-c", _FIND_NINJA], env=env, capture_output=True, text=True, timeout=120)
        found = [line for line in run.stdout.splitlines() if line.strip()] if run.returncode == 0 else []
    except (OSError, subprocess.SubprocessError):
        found = []
    if not found:
        log("warning: no ninja on PATH and no ninja package in %s: torch compiles one file after another"
            " (its distutils fallback; MAX_JOBS has no effect). Install ninja in the build's Python" % py)
        return None
    folder = os.path.dirname(found[0])
    env["PATH"] = folder + os.pathsep + env["PATH"] if env.get("PATH") else folder
    log("ninja: %s (the ninja package's binary; it was not on PATH, and without it torch compiles one"
        " file after another)" % found[0])
    return folder
