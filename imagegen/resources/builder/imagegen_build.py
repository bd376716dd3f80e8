#!/usr/bin/env python3
"""imagegen's in-builder script: one recipe's steps, run inside a builder image or on a host.

This file is copied verbatim into every rendered Dockerfile (and run directly by native builds),
so it uses the standard library only and runs on Python 3.8+. It reads what to build from a JSON
cell file written by imagegen; recipe values therefore never pass through a shell.

Steps (each a sub-command, so the Dockerfile can cache them as separate layers):
  deps    install the recipe's build requirements into the toolchain's venv (torch stays pinned);
          the venv with the exact torch asked for is imagegen_toolchain.py's step, run before it
          from the toolchain document alone (no recipe), so builders of different recipes share it
  fetch   check out the pinned source (git, or an sdist checked against its sha256) and apply the
          recipe's patches (a local tree is left alone: build patches its copy)
  env     print, as JSON, the variables `build` would set (arch knob, jobs, force-build, ...)
  build   derive the package's arch knob from TORCH_CUDA_ARCH_LIST / MAX_JOBS / NVCC_THREADS, put
          ninja on PATH, build a copy of the source (a local tree's copy patched)
          with --no-build-isolation, retag it with the local version, move it atomically
          into --out, keep the log
  smoke   import the recipe's modules (the wheel must be installed)
(The nvcc guard each nvcc of `build` runs through is imagegen_supervise.py's, beside this file.)
"""

import os
import sys

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import tempfile
import time

# imagegen_rules.py lies beside this script (in the image, in a native build's work folder, and in
# the imagegen package): the arch and job-sizing rules imagegen plans with.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import imagegen_rules as rules  # noqa: E402
import imagegen_wheeltools as wheeltools  # noqa: E402

# The toolchain step and what every step shares (log, fail, run, the secrets, the venv's torch)
# live in imagegen_toolchain.py: the layer that installs torch depends on that small file alone.
from imagegen_toolchain import SECRETS, check_torch, cmd_toolchain, fail, load_cell, log, run, secret_env, venv_python  # noqa: E402
# The nvcc guard and the build's supervisor (imagegen_supervise.py, beside this script).
from imagegen_supervise import guard_nvcc, supervise, torch_cuda_home  # noqa: E402

# The fetch step and the copy a build compiles (imagegen_fetch.py, beside this script).
from imagegen_fetch import cmd_fetch, copy_source  # noqa: E402
import imagegen_resume as resume  # noqa: E402



def cmd_deps(cell, args):
    """The recipe's build requirements, into the toolchain's venv (made first if it is missing).
    torch is named with its pin, so that no requirement can move it off the release asked for."""
    env = secret_env(os.environ)
    py = venv_python(cell)
    if not os.path.exists(py):
        cmd_toolchain(cell, args)
    if cell.get("build_requires"):
        pin = "torch==" + cell["torch"]["version"]
        run([py, "-m", "pip", "install", "--disable-pip-version-check"] + list(cell["build_requires"]) + [pin],
            env=env)
    check_torch(cell, py)


# ------------------------------------------------------------------------------------------------
# arch knob

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
    """`docker run --gpus all IMAGE` without TORCH_CUDA_ARCH_LIST (seed 004): build for the GPUs the
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
    targets = sum(int(a[3]) + int(a[4]) for a in archs)
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
    if cell.get("cuda_home"):
        env["CUDA_HOME"] = cell["cuda_home"]
        env["PATH"] = path_with_nvcc(env.get("PATH", ""), cell["cuda_home"])
    return env


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


# ------------------------------------------------------------------------------------------------
# build


def chosen_env(plain):
    """The variables the build sets (before any secret is added): enough to repeat the build by hand
    with a plain `pip wheel`, as scripts/gpu/proof.sh does."""
    return dict((k, v) for k, v in sorted(plain.items())
                if k != "PATH" and (os.environ.get(k) != v or k in ("TORCH_CUDA_ARCH_LIST", "MAX_JOBS", "NVCC_THREADS")))


def cmd_env(cell, args):
    print(json.dumps(chosen_env(build_env(cell))))


def cmd_build(cell, args):
    py = venv_python(cell) if os.path.exists(venv_python(cell)) else sys.executable
    plain = build_env(cell)
    env = secret_env(plain)
    chosen = chosen_env(plain)
    check_torch(cell, py)
    ninja_on_path(env, py)
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    os.makedirs(cell["log_dir"], exist_ok=True)
    log_path = os.path.join(cell["log_dir"], "build.log")
    if os.path.exists(os.path.join(cell["log_dir"], "failure.json")):
        os.unlink(os.path.join(cell["log_dir"], "failure.json"))  # a previous build's
    if cell.get("work_dir"):
        # In an image: always the same path, so that a rebuild of the same inputs (bake, or
        # `docker run` of a pulled builder image) compiles byte-identical .so files and ccache
        # finds its objects again.
        work = cell["work_dir"]
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(work)
    else:
        work = tempfile.mkdtemp(prefix="imagegen-work-")
    # nvcc's temporary files (tmpxft_*) in the work folder, not /tmp: a build that is stopped (a
    # compiler error, a signal) leaves none behind on the host.
    env["TMPDIR"] = os.path.join(work, "tmp")
    os.makedirs(env["TMPDIR"])
    stats_log = use_ccache(env, work, py, relative_paths=not cell.get("work_dir"))
    if stats_log is None and cell.get("work_dir"):
        # torch 2.13+ puts ccache in front of the compilers on its own when it finds one (the image
        # has it); without a mounted cache folder that cache goes with the layer, and a cold ccache
        # costs a preprocessing pass per file. A native build keeps the user's own wrapper choice.
        env.setdefault("TORCH_NO_COMPILER_WRAPPER", "1")
    guard = guard_nvcc(env, cell["log_dir"], work)
    # A state saved by a build of the same inputs that was stopped at its budget (imagegen_resume.py):
    # only in an image, whose work folder is the same path every time (ninja's commands name it).
    state = resume.state_path(env) if cell.get("work_dir") else None
    restored = resume.restore(state, work)
    if restored:
        tree = os.path.join(work, "src")
        resumed = ("resuming from %s: %d object(s) compiled by the stopped build (%d finished step(s) in ninja's log)"
                   % (state, restored["objects"], restored["entries"]))
        log(resumed)
    else:
        tree = copy_source(cell, work)
    dist = os.path.join(work, "dist")
    started = time.time()
    budget = resume.budget_seconds(env)
    # Unbuffered: the log grows while the build runs (a long compile can be followed with tail -f).
    with open(log_path, "wb", buffering=0) as lf:
        lf.write(("[imagegen] build env: %s\n" % json.dumps(chosen)).encode())
        if restored:
            lf.write(("[imagegen] %s\n" % resumed).encode())
        result = supervise(pip_wheel_command(py, dist, tree), env, lf, guard,
                           deadline=started + budget if budget else None)
    if result["budget_spent"]:
        stop_and_keep(cell, work, tree, state, budget, restored, started)
    if result["error"]:
        with open(os.path.join(cell["log_dir"], "failure.json"), "w", encoding="utf-8") as fh:
            json.dump(dict(result, log=log_path), fh)
        shutil.rmtree(work, ignore_errors=True)  # the log says why; the copied tree is not needed
        fail("%s (%s; log: %s)" % (result["error"], result["how"], log_path), result["rc"] or 1)
    log("pip wheel took %.1f s" % (time.time() - started))
    wheels = [f for f in os.listdir(dist) if f.endswith(".whl")]
    if len(wheels) != 1:
        fail("expected one wheel, the build produced %r" % wheels)
    check_torch(cell, py)  # the build must not have swapped torch
    final = retag(os.path.join(dist, wheels[0]), cell["local_version"], work)
    dest = os.path.join(out, os.path.basename(final))
    # Copy beside the destination under a hidden name, then rename: readers never see half a wheel.
    tmp = os.path.join(out, ".%s.partial" % os.path.basename(final))
    shutil.copyfile(final, tmp)
    give_to_folder_owner(tmp, out)
    os.replace(tmp, dest)
    write_build_record(cell, plain, dest, started)
    if restored:
        now, again = resume.steps_since(tree, restored["steps"])
        said = "resumed build: %d step(s) run now, %d done by the stopped build%s" % (
            len(now), restored["entries"], " (run again: %s)" % ", ".join(os.path.basename(s) for s in again[:5])
            if again else "")
        log(said)
        with open(log_path, "ab") as lf:
            lf.write(("[imagegen] %s\n" % said).encode())
    if state:
        resume.forget(state)
    if stats_log:
        report_ccache(stats_log, cell["log_dir"])
    shutil.rmtree(work, ignore_errors=True)
    log("built %s in %.0f s (log: %s)" % (dest, time.time() - started, log_path))
    if getattr(args, "smoke", False):
        smoke_test(cell, [dest])


def stop_and_keep(cell, work, tree, state, budget, restored, started):
    """The build's budget is spent: keep its tree for the next build of the same inputs and stop
    with resume.STOPPED_EXIT (no wheel, no failure record)."""
    done = resume.ninja_entries(tree)
    if not state:
        shutil.rmtree(work, ignore_errors=True)
        fail("the build's budget of %d s is spent after %d ninja step(s); nothing is kept (no %s, or no inputs "
             "hash): the next build starts afresh" % (budget, done, resume.RESUME_DIR_ENV), resume.STOPPED_EXIT)
    size = resume.save(work, state, {"inputs": os.environ.get(resume.INPUTS_ENV), "cell": cell.get("cell"),
                                     "steps_done": done, "seconds": round(time.time() - started, 1),
                                     "resumed": bool(restored)})
    shutil.rmtree(work, ignore_errors=True)
    fail("the build's budget of %d s is spent: stopped after %d ninja step(s), its state (%.0f MB) is kept in %s; "
         "the same build again resumes from it" % (budget, done, size / 1e6, state), resume.STOPPED_EXIT)


RECORD_SUFFIX = ".imagegen.json"  # beside the wheel: what built it (imagegen.wheelhouse.RECORD_SUFFIX)


def file_sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_json_beside(path, doc, owner_folder):
    """``doc`` into ``path`` under a hidden name first, then renamed: never half a file."""
    tmp = os.path.join(os.path.dirname(path), ".%s.partial" % os.path.basename(path))
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=2, sort_keys=True)
        fh.write("\n")
    give_to_folder_owner(tmp, owner_folder)
    os.replace(tmp, path)


def write_build_record(cell, env, wheel, started):
    """The build record beside ``wheel``: which cell, source, torch, CUDA and archs built it, and
    its sha256. A bake export or a `docker run -v OUT:/out` carries it with the wheel, so that
    `imagegen collect` can verify that wheel against what was asked and record it in the wheelhouse's
    manifest (index and publish take only recorded, verified wheels). `smoke` adds its result."""
    source = cell["source"]
    record = {
        "schema": 1,
        "kind": "imagegen-build-record",
        "cell": cell.get("cell"),
        "recipe": cell["recipe"],
        "distribution": cell.get("distribution"),
        "version": cell["version"],
        "source": dict({k: source.get(k) for k in ("kind", "url", "ref", "commit")},
                       **({"sha256": source["sha256"]} if source.get("sha256") else {})),
        "patches": [p["name"] for p in cell.get("patches", [])],
        "torch": cell["torch"]["version"],
        "cuda": cell["torch"]["cuda"],
        "python": cell.get("python") or "%d.%d" % sys.version_info[:2],
        "flavor": cell.get("flavor"),
        "base_image": os.environ.get("IMAGEGEN_BASE_IMAGE") or None,
        # What this build was asked for (a bake --set or the GPUs `docker run --gpus all` shows may
        # differ from the plan); the plan's inputs hash holds only when it was the planned list.
        "requested_archs": env.get("TORCH_CUDA_ARCH_LIST") or "",
        "planned_archs": os.environ.get("IMAGEGEN_PLANNED_ARCHS") or None,
        "inputs": (os.environ.get("IMAGEGEN_INPUTS") or None)
        if env.get("TORCH_CUDA_ARCH_LIST") == os.environ.get("IMAGEGEN_PLANNED_ARCHS") else None,
        "wheel": os.path.basename(wheel),
        "sha256": file_sha256(wheel),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "duration_s": round(time.time() - started, 1),
    }
    write_json_beside(wheel + RECORD_SUFFIX, record, os.path.dirname(wheel))


def add_report_to_records(wheels, key, report):
    """A test's ``report`` under ``key`` ("smoke", "gpu_check") in each tested wheel's build record (a
    wheel without one, e.g. from an older builder, is left alone: `imagegen collect` then refuses it
    as untested)."""
    for wheel in wheels:
        path = wheel + RECORD_SUFFIX
        if not os.path.isfile(path) or os.path.islink(path):
            continue
        with open(path, encoding="utf-8") as fh:
            record = json.load(fh)
        record[key] = report
        write_json_beside(path, record, os.path.dirname(wheel))


def pip_wheel_command(py, dist, tree):
    """`pip wheel` as a user would type it. Not `-v` unless IMAGEGEN_BUILD_VERBOSE=1: pip renders every
    line of a verbose build through its console logger in one thread, and a package whose nvcc jobs
    print a lot (SageAttention's ptxas statistics: ~3 MB) then blocks its compilers on a full pipe:
    +10-17% build time on a 16-core H100 host (docs/verification.md). Without -v pip keeps the
    output and prints all of it when the build fails, which is when it is needed."""
    cmd = [py, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-w", dist, tree]
    if os.environ.get("IMAGEGEN_BUILD_VERBOSE", "").lower() in ("1", "true", "yes"):
        cmd.insert(3, "-v")
    return cmd


def give_to_folder_owner(path, folder):
    """`docker run -v "$PWD/out:/out"` runs as root: hand the wheel to whoever owns the folder, so
    the user can move or delete it without sudo."""
    try:
        st = os.stat(folder)
        if os.geteuid() == 0 and (st.st_uid, st.st_gid) != (0, 0):
            os.chown(path, st.st_uid, st.st_gid)
    except (OSError, AttributeError):
        pass


CCACHE_RESULTS = ("direct_cache_hit", "preprocessed_cache_hit", "cache_miss", "remote_storage_hit", "remote_storage_miss",
                  "remote_storage_error")


def use_ccache(env, work, py, relative_paths=False):
    """Route nvcc (torch's PYTORCH_NVCC) and the host compiler through ccache when the image has it
    and a cache folder is mounted (CCACHE_DIR): a rebuild after a small source change recompiles
    only what changed. Returns the per-build stats log, or None when ccache is not in use.
    ``relative_paths``: the work dir differs from build to build (native builds), so ccache must
    see paths below it as relative ones to find its objects again."""
    cache_dir = env.get("CCACHE_DIR")
    ccache = shutil.which("ccache", path=env.get("PATH"))
    remote = compile_cache_remote()
    env.pop(CCACHE_REMOTE_VARIABLE, None)  # ccache reads CCACHE_REMOTE_STORAGE below; the compilers need neither
    if remote and ccache and not (cache_dir and os.path.isdir(cache_dir)):
        # a shared remote cache without a local one (`docker run` of a builder image): a local one per build
        cache_dir = env["CCACHE_DIR"] = os.path.join(work, "ccache")
        os.makedirs(cache_dir, exist_ok=True)
    if not cache_dir or not ccache or not os.path.isdir(cache_dir):
        return None
    nvcc = shutil.which("nvcc", path=env.get("PATH"))
    if nvcc:
        env["PYTORCH_NVCC"] = "%s %s" % (ccache, nvcc)
    if os.path.isdir("/usr/lib/ccache"):  # Debian's masquerade folder: gcc, g++, c++ -> ccache
        env["PATH"] = "/usr/lib/ccache" + os.pathsep + env.get("PATH", "")
    stats_log = os.path.join(work, "ccache-stats.log")
    # No CCACHE_BASEDIR: it would make ccache pass relative paths to the compiler, which then end up
    # in the objects (__FILE__ in torch's checks): in an image the work dir is fixed anyway, so
    # absolute paths hit the cache and keep the .so bytes independent of ccache.
    env.update({"CCACHE_NOHASHDIR": "1", "CCACHE_COMPILERCHECK": "content", "CCACHE_STATSLOG": stats_log})
    if relative_paths:  # a native build's temporary work dir: the objects then name relative paths
        env["CCACHE_BASEDIR"] = work
    env.setdefault("CCACHE_MAXSIZE", "20G")
    if remote:
        env["CCACHE_REMOTE_STORAGE"] = remote
    log("ccache %s in %s (nvcc and the host compiler)%s" % (
        ccache, cache_dir, "; remote storage %s" % remote_shown(remote) if remote else ""))
    return stats_log


CCACHE_REMOTE_SECRET = "imagegen_ccache_remote"  # `build --compile-cache URL` (imagegen.render.bake.COMPILE_CACHE_SECRET)
# imagegen.safety.COMPILE_CACHE_URL (imagegen checked it; the secret is read again here)
_REMOTE = re.compile(r"(redis|http)://[A-Za-z0-9._~:/?#\[\]@!&()*+,;=%-]{1,400}\Z")


# A native build's (`build --native --compile-cache URL`): the variable bake reads the secret from
CCACHE_REMOTE_VARIABLE = "IMAGEGEN_CCACHE_REMOTE"  # imagegen.render.bake.COMPILE_CACHE_VARIABLE


def compile_cache_remote():
    """The compile cache's remote storage URL: from its secret in an image, else (a native build) from
    the variable imagegen set for this script. Empty, absent or malformed: None."""
    try:
        with open(os.path.join(SECRETS, CCACHE_REMOTE_SECRET), encoding="utf-8") as fh:
            value = fh.read(1024).strip()
    except (OSError, ValueError):
        value = os.environ.get(CCACHE_REMOTE_VARIABLE, "").strip()
    return value if _REMOTE.match(value) else None


def remote_shown(url):
    """The remote storage for the log: its scheme and host, never a credential."""
    scheme, _, rest = url.partition("://")
    host = rest.split("/", 1)[0].rsplit("@", 1)[-1]
    return "%s://%s" % (scheme, host)


def report_ccache(stats_log, log_dir):
    counts = dict((k, 0) for k in CCACHE_RESULTS)
    try:
        with open(stats_log, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                line = line.strip()
                if line in counts:
                    counts[line] += 1
    except OSError:
        pass
    hits = counts["direct_cache_hit"] + counts["preprocessed_cache_hit"]
    total = hits + counts["cache_miss"]
    report = {"hits": hits, "misses": counts["cache_miss"], "hit_rate": round(hits / total, 3) if total else None}
    if counts["remote_storage_hit"] or counts["remote_storage_miss"] or counts["remote_storage_error"]:
        # of the hits, those the shared remote storage served (the local cache did not have them)
        report.update(remote_hits=counts["remote_storage_hit"], remote_misses=counts["remote_storage_miss"],
                      remote_errors=counts["remote_storage_error"])
    with open(os.path.join(log_dir, "ccache.json"), "w", encoding="utf-8") as fh:
        json.dump(report, fh)
    log("ccache: %d of %d compilations from the cache%s" % (
        hits, total, ", %d of them from the remote storage" % report["remote_hits"] if "remote_hits" in report else ""))


def retag(path, label, work):
    """Give the wheel the PEP 440 local version ``label`` (imagegen_wheeltools.retag)."""
    return wheeltools.retag(path, label, work, log)


# ------------------------------------------------------------------------------------------------
# smoke


def cmd_smoke(cell, args):
    """Install the built wheel(s) and import the recipe's modules, from / (not the source tree)."""
    wheels = []
    if args.wheels:
        wheels = sorted(os.path.join(args.wheels, f) for f in os.listdir(args.wheels) if f.endswith(".whl"))
        if not wheels:
            fail("no wheel in %s to test" % args.wheels)
    smoke_test(cell, wheels)


def smoke_test(cell, wheels):
    """Install ``wheels`` (none: the package is installed already) and import the recipe's modules
    from /, then add the result to each wheel's build record. A failed import fails the step."""
    py = venv_python(cell) if os.path.exists(venv_python(cell)) else sys.executable
    if wheels:
        run([py, "-m", "pip", "install", "--no-deps", "--no-index", "--force-reinstall"] + wheels)
    fd, out = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    modules = list(cell["smoke_imports"]) + list(cell.get("smoke_driver_imports", []))
    subprocess.call([py, "-c", wheeltools.SMOKE_PROGRAM, out, cell.get("distribution") or ""] + modules, cwd="/")
    with open(out) as fh:
        found = json.load(fh)
    os.unlink(out)
    report, failed = wheeltools.judge_imports(found, modules)
    for name, got in report.items():
        log("smoke: import %s: %s" % (name, got))
    os.makedirs(cell["log_dir"], exist_ok=True)
    with open(os.path.join(cell["log_dir"], "smoke.json"), "w") as fh:
        json.dump({"imports": report, "ok": not failed}, fh, indent=2)
    if failed:
        fail("smoke test failed: cannot import %s" % ", ".join(failed))
    add_report_to_records(wheels, "smoke", {"imports": report, "ok": True})


# ------------------------------------------------------------------------------------------------
# gpu-check: the recipe's numerical check on the GPU a build step was handed (RUN --device, CDI)

def _tail_line(text):
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def cmd_gpu_check_deps(cell, args):
    """What the recipe's GPU check imports beyond torch and the wheel (the check file's "requires",
    the recipe's smoke.check_requires), into the venv the check runs in; torch pinned to the cell's."""
    with open(args.check, encoding="utf-8") as fh:
        requires = json.load(fh).get("requires") or []
    bad = [r for r in requires if not isinstance(r, str) or not PIP_REQUIREMENT.match(r)]
    if bad:
        fail("gpu check: %r is not a requirement imagegen installs (name[extras] and version specifiers only)" % bad[0])
    if requires:
        py = venv_python(cell) if os.path.exists(venv_python(cell)) else sys.executable
        run([py, "-m", "pip", "install", "--disable-pip-version-check"] + list(requires)
            + ["torch==" + cell["torch"]["version"]], env=secret_env(os.environ))


# imagegen.safety.PIP_REQUIREMENT (the recipe reader checked them; the check file is read again here)
PIP_REQUIREMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9_,-]+\])?([<>=!~]=?[A-Za-z0-9.*+-]+)?"
                             r"(,[<>=!~]=?[A-Za-z0-9.*+-]+)*\Z")


def cmd_gpu_check(cell, args):
    """Run the recipe's smoke.gpu_check (the JSON file --check: recipe, device, code) against the
    wheels the smoke step installed, on the GPU this step was given; fail the build when no GPU is
    visible or the check fails, so that the wheel is never exported."""
    with open(args.check, encoding="utf-8") as fh:
        spec = json.load(fh)
    wheels = sorted(os.path.join(args.wheels, f) for f in os.listdir(args.wheels) if f.endswith(".whl"))
    if not wheels:
        fail("no wheel in %s to check" % args.wheels)
    py = venv_python(cell) if os.path.exists(venv_python(cell)) else sys.executable
    try:  # the probe `imagegen check` runs too (imagegen_wheeltools.GPU_PROBE)
        probe = subprocess.run([py, "-c", wheeltools.GPU_PROBE], cwd="/", stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               universal_newlines=True, timeout=300)
        info = wheeltools.gpu_probe_answer(probe.stdout) or {"error": "the GPU probe printed no answer"}
    except subprocess.TimeoutExpired as exc:
        info = {"error": "the GPU probe did not answer (%s)" % exc.__class__.__name__}
        probe = None
    if not info.get("device"):
        hint = _tail_line(probe.stderr) if probe is not None else ""
        fail("gpu check: no CUDA GPU in this build step (%s%s): the CDI device %s gave none; on the engine's host,"
             " is the driver loaded and a CDI spec for it in /etc/cdi or /var/run/cdi (imagegen cdi-spec)?"
             % (info.get("error", "no answer"), "; " + hint if hint else "", spec["device"]))
    log("gpu check: %s, torch %s, device %s" % (info["device"], info.get("torch"), spec["device"]))
    work = tempfile.mkdtemp(prefix="imagegen-gpu-check-")
    check_file = os.path.join(work, "%s_gpu_check.py" % spec["recipe"])
    with open(check_file, "w", encoding="utf-8") as fh:
        fh.write(spec["code"])
    started = time.time()
    try:
        proc = subprocess.run([py, check_file], cwd="/", stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              universal_newlines=True, timeout=args.timeout)
        rc, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc, out, err = None, exc.stdout or "", exc.stderr or ""
        out = out.decode("utf-8", "replace") if isinstance(out, bytes) else out
        err = err.decode("utf-8", "replace") if isinstance(err, bytes) else err
    finally:
        shutil.rmtree(work, ignore_errors=True)
    seconds = round(time.time() - started, 2)
    for line in out.splitlines():
        log("gpu check: %s" % line)
    report = {"recipe": spec["recipe"], "device": info["device"], "cdi_device": spec["device"],
              "torch": info.get("torch"), "ok": rc == 0, "seconds": seconds,
              "output": [ln for ln in out.splitlines() if ln.strip()][-20:]}
    if rc != 0:
        report["error"] = ("did not finish within %d s" % args.timeout if rc is None
                           else _tail_line(err) or "exit %d" % rc)
    os.makedirs(cell["log_dir"], exist_ok=True)
    with open(os.path.join(cell["log_dir"], "gpu_check.json"), "w") as fh:
        json.dump(report, fh, indent=2)
    if rc != 0:
        sys.stderr.write(err[-4000:])
        fail("gpu check of %s failed on %s: %s" % (", ".join(os.path.basename(w) for w in wheels), info["device"],
                                                  report["error"]))
    log("gpu check: passed on %s in %.1f s" % (info["device"], seconds))
    add_report_to_records(wheels, "gpu_check", report)


# ------------------------------------------------------------------------------------------------
# audit


def cmd_audit(cell, args):
    """Run the package's own build with stand-in compilers (imagegen_audit.py, beside this file) and
    write what it would have compiled: per extension, the SASS/PTX targets and nvcc flags."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    import imagegen_audit  # noqa: E402 (shipped beside this script)

    started = time.time()
    py = venv_python(cell) if os.path.exists(venv_python(cell)) else sys.executable
    env = build_env(cell)
    chosen = chosen_env(env)
    work = tempfile.mkdtemp(prefix="imagegen-audit-")
    try:
        records = imagegen_audit.install_stubs(work, env, sys.executable, os.path.join(here, "imagegen_audit.py"),
                                               torch_cuda_home(env))
        tree = copy_source(cell, work)
        dist = os.path.join(work, "dist")
        # The build_wheel hook `pip wheel --no-build-isolation` runs (its second setup.py run), with
        # pip's choice of backend, without pip's start-up and metadata step: that step runs setup.py
        # (and imports torch) once more and compiles nothing, ~half of an audit's time.
        cmd = imagegen_audit.build_wheel_command(py, work, tree, dist)
        log("audit: $ %s  (the build_wheel hook of: %s)" % (" ".join(cmd), " ".join(pip_wheel_command(py, dist, tree))))
        hook_started = time.time()
        rc, output = _run_audit_build(cmd, env, work, args.timeout)
        if rc == imagegen_audit.NO_BACKEND_READER and imagegen_audit.NO_BACKEND_MARK in output:
            # no TOML reader for pyproject.toml in this Python (< 3.11 without pip's tomli): let pip read it
            cmd = pip_wheel_command(py, dist, tree)  # exactly the build's command
            log("audit: $ " + " ".join(cmd))
            hook_started = time.time()
            rc, output = _run_audit_build(cmd, env, work, args.timeout)
        text = output.decode("utf-8", "replace")
        recorded = imagegen_audit.read_records(records)
        report = imagegen_audit.fold(recorded, os.path.realpath(os.path.join(work, "src")))
        report["build"] = imagegen_audit.phases(recorded, hook_started, time.time())
        log("audit: the package's build: {before:.1f} s to its first compile, {records} record(s) over {compiles:.1f} s, "
            "{after:.1f} s after the last".format(**report["build"]))
        if rc == 0:
            # the header probe: torch's headers compiled with each extension's own flags (seconds)
            imagegen_audit.add_probe(report, recorded, env, work, "off" if args.no_probe else None, tree)
            _log_probe(report["probe"])
            # the link: each -l library the extension asks for, found where the linker will look
            imagegen_audit.add_link_check(report, recorded, env)
            for ext in report["extensions"]:
                if ext["link_missing"]:
                    log("audit: %s links %s, which the linker will not find" % (
                        ext["module"], " ".join("-l" + n for n in ext["link_missing"])))
        report.update({
            "schema": 1,
            "ok": rc == 0,
            "exit": rc,
            "seconds": round(time.time() - started, 2),
            "env": chosen,
            "error_lines": _error_lines(text) if rc != 0 else [],
            "output_tail": text[-4000:] if rc != 0 else "",
        })
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = os.path.abspath(args.out)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    write_json_beside(out, report, os.path.dirname(out))
    n = len(report["extensions"])
    log("audit: %s in %.1f s: %d extension(s)%s" % ("ok" if report["ok"] else "the build failed", report["seconds"], n,
                                                  "".join("; %s: %s" % (e["module"], " ".join(e["sass"] + e["ptx"]) or "no CUDA")
                                                          for e in report["extensions"])))


def _log_probe(probe):
    if probe["mode"] == "off":
        log("audit: header probe skipped (%s=0 / --no-probe)" % "IMAGEGEN_AUDIT_PROBE")
        return
    for probed in probe["runs"]:
        state = {True: "ok", False: "FAILED", None: "not run"}[probed["ok"]]
        log("audit: header probe (%s, %s) %s in %.1f s for %s%s" % (
            probed["compiler"], probed["what"], state, probed["seconds"], ", ".join(probed["modules"]),
            ": " + probed["error"] if probed["error"] else ""))


def _run_audit_build(cmd, env, cwd, timeout):
    try:
        proc = subprocess.run(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
        return proc.returncode, proc.stdout
    except subprocess.TimeoutExpired as exc:
        return -1, (exc.stdout or b"") + b"\n[imagegen] audit: timed out"


_ERROR_LINE = re.compile(r"(?i)(\berror\b|\w+Error:|Exception:|Traceback)")


def _error_lines(text):
    """The lines of a failed build's output that say why (the package's own RuntimeError, ...)."""
    lines = [ln.strip() for ln in text.splitlines() if _ERROR_LINE.search(ln)]
    return [ln[:300] for ln in lines if ln][-12:]


def main(argv=None):
    parser = argparse.ArgumentParser(prog="imagegen_build.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cell", default=os.environ.get("IMAGEGEN_CELL", "/imagegen/cell.json"))
    sub = parser.add_subparsers(dest="step", required=True)
    sub.add_parser("deps")
    sub.add_parser("fetch")
    sub.add_parser("env")
    b = sub.add_parser("build")
    b.add_argument("--out", default="/out")
    b.add_argument("--smoke", action="store_true", help="then install the new wheel here and import its modules"
                   " (`docker run` of a builder image: the container is thrown away after)")
    sm = sub.add_parser("smoke")
    sm.add_argument("--wheels", help="install the wheels in this folder first")
    au = sub.add_parser("audit")
    au.add_argument("--out", required=True, help="write the audit report (JSON) here")
    au.add_argument("--timeout", type=float, default=900)
    au.add_argument("--no-probe", action="store_true", help="skip the header probe (torch's headers compiled with"
                    " each extension's recorded flags); IMAGEGEN_AUDIT_PROBE=0 does the same, =full parses with nvcc too")
    gc = sub.add_parser("gpu-check")
    gc.add_argument("--wheels", required=True, help="the folder of the wheels the smoke step installed")
    gc.add_argument("--check", required=True, help="JSON: the recipe, the CDI device and the check's code")
    gc.add_argument("--timeout", type=float, default=600)
    gd = sub.add_parser("gpu-check-deps")
    gd.add_argument("--check", required=True, help="JSON: the check's requires")
    args = parser.parse_args(argv)
    cell = load_cell(args.cell)
    {"deps": cmd_deps, "fetch": cmd_fetch, "env": cmd_env, "build": cmd_build, "smoke": cmd_smoke,
     "audit": cmd_audit, "gpu-check": cmd_gpu_check, "gpu-check-deps": cmd_gpu_check_deps}[args.step](cell, args)


if __name__ == "__main__":
    main()
