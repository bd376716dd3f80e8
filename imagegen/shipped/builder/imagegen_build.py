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
  patch   apply one of the recipe's patches by its file name (a Dockerfile's step per patch, after
          `fetch --source-only`)
  pip     pip in the toolchain's venv with the step's secrets, torch asserted after (build requirements)
  env     print, as JSON, the variables `build` would set (arch knob, jobs, force-build, ...)
  build   derive the package's arch knob from TORCH_CUDA_ARCH_LIST / MAX_JOBS / NVCC_THREADS, put
          ninja on PATH, build a copy of the source (a local tree's copy patched)
          with --no-build-isolation, retag it with the local version, move it atomically
          into --out, keep the log
  smoke   import the recipe's modules (the wheel must be installed)
  gpu-check, gpu-check-deps   the recipe's numerical check on a GPU handed to the build step
  audit   the package's own build with stand-in compilers: what it would compile (imagegen_audit.py)
Beside this file, one module per concern: imagegen_toolchain.py (the venv with torch), imagegen_fetch.py
(with imagegen_sdist.py, the pinned sdist, which the Windows helper shares),
imagegen_buildenv.py (the build's variables), imagegen_supervise.py (the nvcc guard, the supervisor),
imagegen_ccache.py, imagegen_resume.py (a build stopped at its budget), imagegen_records.py (the build
record), imagegen_check.py (smoke and GPU checks), imagegen_audit*.py (the gencode audit's stand-ins, its
records, header probe, link and include lookups), and what imagegen shares with them:
imagegen_rules.py (archs, job sizing) and imagegen_wheeltools.py.
"""

import os
import sys

import argparse
import json
import re
import shutil
import subprocess
import tempfile
import time

# The modules below lie beside this script (in the image, in a native build's work folder, and in the
# imagegen package), one per concern.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import imagegen_wheeltools as wheeltools  # noqa: E402

# The toolchain step and what every step shares (log, fail, run, the secrets, the venv's torch)
# live in imagegen_toolchain.py: the layer that installs torch depends on that small file alone.
from imagegen_toolchain import (cmd_toolchain, fail, load_cell, log, run, secret_env, validate_torch,  # noqa: E402
                                venv_python)
# The build's environment: the arch knob, MAX_JOBS / NVCC_THREADS, nvcc and ninja on PATH.
from imagegen_buildenv import build_env, ninja_on_path  # noqa: E402
# ccache and the shared compile cache; the build record beside each wheel; the smoke and GPU checks.
from imagegen_ccache import report_ccache, use_ccache  # noqa: E402
from imagegen_records import copy_into_place, write_build_record, write_json_beside  # noqa: E402
from imagegen_check import cmd_gpu_check, cmd_gpu_check_deps, cmd_smoke, smoke_test  # noqa: E402
# The nvcc guard and the build's supervisor (imagegen_supervise.py, beside this script).
from imagegen_supervise import guard_nvcc, supervise, torch_cuda_home  # noqa: E402

# The fetch step and the copy a build compiles (imagegen_fetch.py, beside this script).
from imagegen_fetch import apply_patch, cmd_fetch, copy_source  # noqa: E402
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
    validate_torch(cell, py)


def cmd_pip(cell, args):
    """pip in the toolchain's venv with this step's secrets (the CA bundle, a mirror, a netrc), then the
    torch asserted: the Dockerfile's build-requirements step reads as the pip install it is."""
    py = venv_python(cell)
    run([py, "-m", "pip"] + list(args.pip_args), env=secret_env(os.environ))
    validate_torch(cell, py)


def cmd_patch(cell, args):
    """One of the cell's patches, by its file name, on the fetched source (the Dockerfile's step per patch)."""
    named = [p for p in cell.get("patches", []) if p["name"] == args.name]
    if not named:
        fail("%s is none of this cell's patches (%s)" % (args.name, ", ".join(p["name"] for p in cell.get("patches", []))
                                                        or "it has none"))
    apply_patch(named[0], cell["src_dir"])


MAX_PATCH_BYTES = 4 << 20  # a recipe's patch is a few KB; the loader refuses larger ones too


def read_patch_files(cell, cell_path):
    """A cell file written beside a Dockerfile names each patch by its file (patches/NAME, beside the cell
    file) instead of holding its text: read each one in, bounded, from inside that folder only."""
    root = os.path.dirname(os.path.abspath(cell_path))
    for patch in cell.get("patches", []):
        if "text" in patch or "file" not in patch:
            continue
        path = os.path.normpath(os.path.join(root, patch["file"]))
        if os.path.commonpath([root, path]) != root or not os.path.isfile(path) or os.path.islink(path):
            fail("patch %s: %s is not a file beside the cell file" % (patch["name"], patch["file"]))
        with open(path, "rb") as fh:
            data = fh.read(MAX_PATCH_BYTES + 1)
        if len(data) > MAX_PATCH_BYTES:
            fail("patch %s: %s is larger than a patch can be" % (patch["name"], patch["file"]))
        patch["text"] = data.decode("utf-8")
    return cell


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
    validate_torch(cell, py)
    ninja_on_path(env, py)
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    os.makedirs(cell["log_dir"], exist_ok=True)
    log_path = os.path.join(cell["log_dir"], "build.log")
    if os.path.exists(os.path.join(cell["log_dir"], "failure.json")):
        os.unlink(os.path.join(cell["log_dir"], "failure.json"))  # a previous build's
    native = not cell.get("venv")  # the host's Python and toolkit (imagegen build --native)
    if cell.get("work_dir"):
        # In an image: always the same path, so that a rebuild of the same inputs (bake, or
        # `docker run` of a pulled builder image) compiles byte-identical .so files and ccache
        # finds its objects again. A native build that can stop at a budget or resume: a fixed folder
        # for its inputs, so that a kept tree resumes at the path ninja's commands name.
        work = cell["work_dir"]
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(work)
    else:
        work = tempfile.mkdtemp(prefix="imagegen-work-")
    # nvcc's temporary files (tmpxft_*) in the work folder, not /tmp: a build that is stopped (a
    # compiler error, a signal) leaves none behind on the host.
    env["TMPDIR"] = os.path.join(work, "tmp")
    os.makedirs(env["TMPDIR"])
    stats_log = use_ccache(env, work, py, relative_paths=native)
    if stats_log is None and not native:
        # torch 2.13+ puts ccache in front of the compilers on its own when it finds one (the image
        # has it); without a mounted cache folder that cache goes with the layer, and a cold ccache
        # costs a preprocessing pass per file. A native build keeps the user's own wrapper choice.
        env.setdefault("TORCH_NO_COMPILER_WRAPPER", "1")
    guard = guard_nvcc(env, cell["log_dir"], work)
    # A state saved by a build of the same inputs that was stopped at its budget (imagegen_resume.py):
    # only where the work folder is the same path every time (ninja's commands name it).
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
    validate_torch(cell, py)  # the build must not have swapped torch
    final = retag(os.path.join(dist, wheels[0]), cell["local_version"], work)
    dest = os.path.join(out, os.path.basename(final))
    copy_into_place(final, dest, out)
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


def pip_wheel_command(py, dist, tree):
    """`pip wheel` as a user would type it. Not `-v` unless IMAGEGEN_BUILD_VERBOSE=1: pip renders every
    line of a verbose build through its console logger in one thread, and a package whose nvcc jobs
    print a lot (SageAttention's ptxas statistics: ~3 MB) then blocks its compilers on a full pipe:
    +10-17% build time on a 16-core H100 host (docs/records/verification.md). Without -v pip keeps the
    output and prints all of it when the build fails, which is when it is needed."""
    cmd = [py, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-w", dist, tree]
    if os.environ.get("IMAGEGEN_BUILD_VERBOSE", "").lower() in ("1", "true", "yes"):
        cmd.insert(3, "-v")
    return cmd


def retag(path, label, work):
    """Give the wheel the PEP 440 local version ``label`` (imagegen_wheeltools.retag)."""
    return wheeltools.retag(path, label, work, log)


# ------------------------------------------------------------------------------------------------
# audit


def cmd_audit(cell, args):
    """Run the package's own build with stand-in compilers (imagegen_audit.py, beside this file) and
    write what it would have compiled: per extension, the SASS/PTX targets and nvcc flags."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    import imagegen_audit  # noqa: E402 (shipped beside this script: the stand-ins, and what reads their records)
    import imagegen_audit_includes  # noqa: E402
    import imagegen_audit_links  # noqa: E402
    import imagegen_audit_probe  # noqa: E402
    import imagegen_audit_records  # noqa: E402

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
        recorded = imagegen_audit_records.read_records(records)
        src_root = os.path.realpath(os.path.join(work, "src"))
        report = imagegen_audit_records.fold(recorded, src_root)
        report["build"] = imagegen_audit_records.phases(recorded, hook_started, time.time())
        log("audit: the package's build: {before:.1f} s to its first compile, {records} record(s) over {compiles:.1f} s, "
            "{after:.1f} s after the last".format(**report["build"]))
        if rc == 0:
            # the header probe: torch's headers compiled with each extension's own flags (seconds)
            imagegen_audit_probe.add_probe(report, recorded, env, work, "off" if args.no_probe else None, tree)
            _log_probe(report["probe"])
            # the link: each -l library the extension asks for, found where the linker will look
            imagegen_audit_links.add_link_missing(report, recorded, env)
            for ext in report["extensions"]:
                if ext["link_missing"]:
                    log("audit: %s links %s, which the linker will not find" % (
                        ext["module"], " ".join("-l" + n for n in ext["link_missing"])))
            # the includes: each -I folder inside the tree that is missing or empty (a submodule not checked out)
            imagegen_audit_includes.add_include_missing(report, recorded, src_root)
            for ext in report["extensions"]:
                for found in ext["include_missing"]:
                    log("audit: %s includes from %s, which is %s%s" % (
                        ext["module"], found["path"], found["state"],
                        " (git submodule %s)" % found["submodule"] if found["submodule"] else ""))
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
    """The lines of a failed build's output that say why (the package's own RuntimeError, ...). CMake
    writes its reason on the indented lines under "CMake Error ...:": they are folded into that line."""
    lines, raw = [], text.splitlines()
    for i, ln in enumerate(raw):
        if not _ERROR_LINE.search(ln):
            continue
        if ln.startswith("CMake Error"):
            body = []
            for more in raw[i + 1:i + 12]:
                if more.strip() and not more.startswith((" ", "\t")):
                    break
                body.append(more.strip())
            ln = " ".join([ln.strip()] + [b for b in body if b])
        lines.append(" ".join(ln.split()))
    return [ln[:300] for ln in lines if ln][-12:]


def main(argv=None):
    parser = argparse.ArgumentParser(prog="imagegen_build.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cell", default=os.environ.get("IMAGEGEN_CELL", "/imagegen/cell.json"))
    sub = parser.add_subparsers(dest="step", required=True)
    sub.add_parser("deps")
    fe = sub.add_parser("fetch")
    fe.add_argument("--source-only", action="store_true",
                    help="leave the patches to the `patch` steps (one per file: a Dockerfile shows each)")
    pa = sub.add_parser("patch")
    pa.add_argument("name", help="the patch's file name (patches/NAME beside the cell file)")
    pp = sub.add_parser("pip")
    pp.add_argument("pip_args", nargs=argparse.REMAINDER)
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
    cell = read_patch_files(load_cell(args.cell), args.cell)
    {"deps": cmd_deps, "fetch": cmd_fetch, "patch": cmd_patch, "pip": cmd_pip, "env": cmd_env, "build": cmd_build,
     "smoke": cmd_smoke,
     "audit": cmd_audit, "gpu-check": cmd_gpu_check, "gpu-check-deps": cmd_gpu_check_deps}[args.step](cell, args)


if __name__ == "__main__":
    main()
