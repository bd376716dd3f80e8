#!/usr/bin/env python3
"""imagegen's helper for the native Windows build scripts (imagegen render --shell cmd|powershell).

The rendered script embeds this file and runs it with each cell's Python for the steps that need
real work; the script itself only selects the CUDA toolkit, makes the venv, installs torch and the
build requirements, loads MSVC, sets the recipe's variables and runs `pip wheel`, checking every
exit code. Standard library only, Python 3.8+, ASCII only (it is written out by cmd and PowerShell).
Every value comes from the JSON build document the script writes beside it (--doc); none passes
through a shell. How a source is patched, a wheel retagged, cuobjdump found and read, and the build
record written is shared with the Linux build and with `imagegen verify`: imagegen_wheeltools.py and
imagegen_records.py, which the script writes beside this file with this helper's own modules:
imagegen_windows_host.py (check, and smoke's venv) and imagegen_windows_archs.py (verify).

  check   the interpreter is the cell's Python, its torch is the cell's torch (release and CUDA
          variant), and the nvcc on PATH agrees with it (its major equals torch's CUDA major, the
          rule of the Linux pre-flight) and is the toolkit the cell was planned with
  fetch   the pinned source in --src (cloned, or the pinned sdist downloaded, checked against its
          sha256 and unpacked, when missing; checked when present), the recipe's
          patches applied once (one already in the tree is skipped with a log line), the tree's
          build folder of an earlier cell removed; with --copy (a local tree, or a checkout the
          user named with --src-dir) --src is never written to past the clone: a fresh copy in
          --copy gets the patches instead, so the checkout stays at its pin for the next render
  retag   the one wheel in --dist gets the cell's local version (2.2.0 -> 2.2.0+cu128torch2.8)
  verify  every requested SASS (and PTX where +PTX was asked) is in the wheel's extensions, read
          with cuobjdump --list-elf / --list-ptx
  smoke   a fresh venv that sees the cell's environment (torch), the wheel installed into it with
          --no-deps, the recipe's modules imported from a folder outside the source tree
  place   the wheel into WHEELHOUSE/<pkg>-<ver>/torch<X.Y>/cu<XYZ>/ under a hidden name, then
          renamed (never half a wheel there), with its build record <wheel>.imagegen.json
          (imagegen_records.build_record, the Linux build's)
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

# The modules the script writes beside this file: shared with the Linux build (imagegen_wheeltools,
# imagegen_records, imagegen_sdist), and this helper's machine checks (imagegen_windows_host) and arch
# check (imagegen_windows_archs).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import imagegen_records as records  # noqa: E402
import imagegen_sdist as sdist  # noqa: E402
import imagegen_wheeltools as wheeltools  # noqa: E402
import imagegen_windows_archs as archs  # noqa: E402
import imagegen_windows_host as host  # noqa: E402
from imagegen_wheeltools import find_cuobjdump, git_env  # noqa: E402

SMOKE_FILE = "smoke.json"  # in --dist: the smoke step's result, read by place into the build record
VERIFY_FILE = "verify.json"  # in --dist: the verify step's result


class Failed(Exception):
    """A step's failure: one line for the user, exit status 1."""


def log(msg):
    print("[imagegen] " + msg, flush=True)


def load_doc(path):
    with open(path, encoding="utf-8") as fh:
        doc = json.load(fh)
    if not isinstance(doc, dict) or doc.get("kind") != "imagegen-windows-build":
        raise Failed("%s is not an imagegen Windows build document" % path)
    return doc


def cell_of(doc, name):
    for cell in doc["cells"]:
        if cell["name"] == name:
            return cell
    raise Failed("no cell %r in the build document (it has %s)" % (name, ", ".join(c["name"] for c in doc["cells"])))


def output_of(cmd, env=None, cwd=None):
    """(exit status, stdout and stderr together) of ``cmd``; (None, why) when it cannot start."""
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    except OSError as exc:
        return None, "%s: %s" % (cmd[0], exc)
    return proc.returncode, proc.stdout.decode("utf-8", "replace")


def run(cmd, env=None, cwd=None):
    log("$ " + " ".join(cmd))
    try:
        rc = subprocess.call(cmd, env=env, cwd=cwd)
    except OSError as exc:
        raise Failed("cannot run %s: %s" % (cmd[0], exc))
    if rc != 0:
        raise Failed("%s exited with code %d" % (" ".join(cmd[:3]), rc))


# ------------------------------------------------------------------------------------------------
# check

def cmd_check(doc, args):
    cell = cell_of(doc, args.cell)
    problems = []
    have = "%d.%d" % sys.version_info[:2]
    if have != cell["python"]:
        problems.append("this is Python %s (%s), the cell is for Python %s" % (have, sys.executable, cell["python"]))
    rc, out = output_of([sys.executable, "-c", host.TORCH_PROBE])
    got = (None, None)
    if rc == 0:
        try:
            got = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            pass
    problems += host.torch_problems(cell, got[0], got[1])
    nvcc = shutil.which("nvcc")
    rc, out = output_of([nvcc, "--version"]) if nvcc else (None, "")
    release = host.nvcc_release(out) if rc == 0 else None
    problems += host.nvcc_problems(cell, release, got[1])
    if problems:
        raise Failed("; ".join(problems))
    log("Python %s, torch %s (CUDA %s), nvcc %d.%d at %s: as the cell asks"
        % (have, got[0], got[1], release[0], release[1], nvcc))


# ------------------------------------------------------------------------------------------------
# fetch


def git(dest, args, reading=True):
    """git on ``dest`` with none of the tree's own commands running (imagegen_wheeltools.git_cmd)."""
    try:
        return wheeltools.git_cmd(dest, args, env=git_env(dest), reading=reading)
    except wheeltools.UnsafeTree as exc:
        raise Failed("%s: %s" % (dest, exc))


def head_of(dest):
    rc, out = output_of(git(dest, ["rev-parse", "HEAD"]), env=git_env(dest))
    return out.strip() if rc == 0 else None


def fail(msg):
    raise Failed(msg)


def apply_patch(patch, dest):
    """Apply a recipe patch once, as the Linux build does (imagegen_wheeltools.apply_patch)."""
    wheeltools.apply_patch(patch, dest, log, fail, "the tree is not the pinned source (or was checked out with CRLF"
                           " line endings: clone with -c core.autocrlf=false)")


def remove_tree(path):
    """shutil.rmtree that also removes read-only files (git's objects on Windows)."""
    def retry(func, name, _exc):
        os.chmod(name, 0o700)
        func(name)
    shutil.rmtree(path, onerror=retry)


def copy_tree(doc, args):
    """The tree as the build compiles it: a fresh copy in --copy (the user's tree is never written to),
    patched as the Linux build patches its copy (imagegen_build.copy_source)."""
    tree = os.path.join(args.src, doc["source"].get("subdir") or "")
    kind = "local" if doc["source"]["kind"] == "local" else "fetched"
    if not any(os.path.isfile(os.path.join(tree, f)) for f in ("setup.py", "pyproject.toml")):
        # a local tree the user moved or emptied; a fetched one: the pinned commit has no project at its subdir
        raise Failed("the %s tree %s is not there, or has no setup.py or pyproject.toml" % (kind, tree))
    if os.path.lexists(args.copy):
        remove_tree(args.copy)
    log("copying the %s tree %s to %s" % (kind, args.src, args.copy))
    shutil.copytree(args.src, args.copy, symlinks=True)
    return args.copy


def cmd_fetch(doc, args):
    src = doc["source"]
    if src["kind"] == "local" and not args.copy:
        raise Failed("a local tree is built from a copy of it: give --copy DIR")
    if src["kind"] == "sdist":  # the pinned sdist, downloaded and unpacked as the Linux build does it
        sdist.fetch_sdist(src, doc.get("distribution") or doc["recipe"], args.src, os.environ, log, fail)
    elif src["kind"] != "local":
        fetch_pinned(src, args.src)
    dest = copy_tree(doc, args) if args.copy else args.src
    if args.copy and src["kind"] != "local" and doc.get("patches"):
        log(wheeltools.patches_left_to_the_copy(doc["patches"], args.src))
    for patch in doc.get("patches", []):
        apply_patch(patch, dest)
    clear_build(dest, src)


def fetch_pinned(src, dest):
    """The recipe's pinned commit in ``dest``: cloned when missing, checked when present."""
    env = git_env(dest)

    def run_git(cmd, check=True):
        if check:
            return run(cmd, env=env)
        log("$ " + " ".join(cmd))
        return subprocess.call(cmd, env=env)

    # LF as in the repository (keep_lf): the recipe's patches are LF, and git apply refuses a CRLF tree.
    wheeltools.fetch_git(src, dest, git=lambda args, reading=True: git(dest, args, reading=reading), run=run_git,
                         head=lambda: head_of(dest), fail=lambda msg, code=1: fail(msg), log=log, keep_lf=True,
                         elsewhere=", or give another --src-dir")


def clear_build(dest, src):
    """An earlier cell's objects (another torch, the same Python) would be taken as up to date."""
    tree = os.path.join(dest, src.get("subdir") or "")
    for stale in ("build",):
        path = os.path.join(tree, stale)
        if os.path.isdir(path):
            log("removing %s (an earlier build's objects)" % path)
            shutil.rmtree(path)


# ------------------------------------------------------------------------------------------------
# retag


def the_wheel(dist):
    wheels = sorted(f for f in os.listdir(dist) if f.endswith(".whl")) if os.path.isdir(dist) else []
    if len(wheels) != 1:
        raise Failed("expected one wheel in %s, found %s" % (dist, ", ".join(wheels) or "none"))
    return os.path.join(dist, wheels[0])


def retag(path, label, out_dir):
    """The wheel at ``path`` with the local version ``label``, written into ``out_dir``
    (imagegen_wheeltools.retag: the same result as the Linux build's)."""
    try:
        return wheeltools.retag(path, label, out_dir, log)
    except ValueError as exc:
        raise Failed(str(exc))


def cmd_retag(doc, args):
    cell = cell_of(doc, args.cell)
    path = the_wheel(args.dist)
    with tempfile.TemporaryDirectory(dir=args.dist) as tmp:
        new = retag(path, cell["local_version"], tmp)
        if new != path:
            os.replace(new, os.path.join(args.dist, os.path.basename(new)))
            os.unlink(path)


# ------------------------------------------------------------------------------------------------
# verify

def cmd_verify(doc, args):
    cell = cell_of(doc, args.cell)
    path = the_wheel(args.dist)
    exe = args.cuobjdump or find_cuobjdump()
    if not exe:
        raise Failed("cuobjdump not found (on PATH or in CUDA_PATH\\bin): the CUDA toolkit's cuobjdump checks the archs")
    try:
        listings = archs.wheel_listings(path, exe)
    except archs.CuobjdumpFailed as exc:
        raise Failed(str(exc))
    problems, lines = archs.judge(cell["expected"], listings, doc.get("extension_archs") or {})
    for line in lines:
        log("verify: " + line)
    with open(os.path.join(args.dist, VERIFY_FILE), "w", encoding="utf-8") as fh:
        json.dump({"ok": not problems, "problems": problems, "extensions": {k: sorted(v) for k, v in listings.items()}},
                  fh, indent=2)
    if problems:
        raise Failed("the wheel does not carry the archs asked for (%s): %s" % (cell["archs"], "; ".join(problems)))
    log("verify: every requested arch is there (%s)" % cell["archs"])


# ------------------------------------------------------------------------------------------------
# smoke

def cmd_smoke(doc, args):
    path = os.path.abspath(the_wheel(args.dist))
    venv = os.path.abspath(args.venv)
    if os.path.exists(venv):
        shutil.rmtree(venv)
    # --system-site-packages: the base interpreter's packages; a .pth: the cell's own environment's
    # (a venv made from a venv sees the base's site-packages only). The wheel installed into this venv
    # comes first on sys.path, before any copy in the cell's environment.
    run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", venv])
    py = host.venv_python(venv)
    rc, out = output_of([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    if rc != 0:
        raise Failed("the smoke venv's Python does not run: %s" % out.strip()[-300:])
    with open(os.path.join(out.strip().splitlines()[-1], "imagegen-cell-env.pth"), "w", encoding="utf-8") as fh:
        fh.write("".join(d + "\n" for d in host.site_dirs()))
    run([py, "-m", "pip", "install", "--disable-pip-version-check", "--no-deps", "--no-index", "--force-reinstall",
         path])
    # the modules this cell's arch list builds, as the plan resolved them (a routed extension the list
    # leaves out, such as SageAttention's _qattn_sm90 without 9.0, is not imported)
    cell = cell_of(doc, args.cell)
    modules = list(cell.get("smoke_imports") or [])
    driver_modules = list(cell.get("smoke_driver_imports") or [])
    with tempfile.TemporaryDirectory(prefix="imagegen-smoke-") as tmp:
        out_file = os.path.join(tmp, "imports.json")
        rc, text = output_of([py, "-c", wheeltools.SMOKE_PROGRAM, out_file, doc.get("distribution") or ""]
                             + modules + driver_modules, cwd=tmp)
        try:
            with open(out_file, encoding="utf-8") as fh:
                found = json.load(fh)
        except (OSError, ValueError):
            raise Failed("the import test did not run (exit %s): %s" % (rc, text.strip()[-300:]))
    # the Linux build's judgement (imagegen_wheeltools.judge_imports): a missing driver, or a runtime
    # requirement the wheel declares, is skipped
    report, failed = wheeltools.judge_imports(found, modules + driver_modules, host.driver_present())
    for name, got in report.items():
        log("smoke: import %s: %s" % (name, got))
    with open(os.path.join(args.dist, SMOKE_FILE), "w", encoding="utf-8") as fh:
        json.dump({"imports": report, "ok": not failed}, fh, indent=2)
    if failed:
        raise Failed("smoke test failed: cannot import %s" % ", ".join(failed))


# ------------------------------------------------------------------------------------------------
# place


def build_record(doc, cell, wheel, smoke, verify, started):
    """The build record beside the wheel (imagegen_records.build_record, the Linux build's), so that
    `imagegen collect` can check the wheel against what was asked."""
    record = records.build_record(
        cell=cell["name"], recipe=doc["recipe"], distribution=doc.get("distribution"), version=doc["version"],
        source=doc["source"], patches=doc.get("patches", []), torch=cell["torch"], cuda=cell["cuda"],
        python=cell["python"], flavor="windows", base_image=None, requested_archs=cell["archs"],
        planned_archs=cell["archs"], inputs=None, wheel=wheel, started=started)
    record.update(smoke=smoke, verify=verify)
    return record


def cmd_place(doc, args):
    cell = cell_of(doc, args.cell)
    path = the_wheel(args.dist)
    results = {}
    for key, name in (("smoke", SMOKE_FILE), ("verify", VERIFY_FILE)):
        try:
            with open(os.path.join(args.dist, name), encoding="utf-8") as fh:
                results[key] = json.load(fh)
        except (OSError, ValueError):
            results[key] = None
        if not (isinstance(results[key], dict) and results[key].get("ok") is True):
            raise Failed("the wheel has not passed its %s step: it is not placed in the wheelhouse" % key)
    folder = os.path.join(args.wheelhouse, *cell["wheel_dir"].split("/"))
    os.makedirs(folder, exist_ok=True)
    dest = os.path.join(folder, os.path.basename(path))
    records.copy_into_place(path, dest, folder)
    record = build_record(doc, cell, dest, results["smoke"], results["verify"], args.started)
    records.write_json_beside(dest + records.RECORD_SUFFIX, record, folder)
    log("wheel: %s" % dest)


# ------------------------------------------------------------------------------------------------


def main(argv=None):
    parser = argparse.ArgumentParser(prog="imagegen_windows.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="step")
    sub.required = True
    for name in ("check", "fetch", "retag", "verify", "smoke", "place"):
        p = sub.add_parser(name)
        p.add_argument("--doc", required=True, help="the build document (JSON) the script wrote")
        if name != "fetch":
            p.add_argument("--cell", required=True)
        if name == "fetch":
            p.add_argument("--src", required=True, help="the source folder (cloned there when missing)")
            p.add_argument("--copy", help="the build's copy of the tree (made afresh; --src is not written to)")
        if name in ("retag", "verify", "smoke", "place"):
            p.add_argument("--dist", required=True, help="the folder pip wheel wrote the cell's wheel into")
        if name == "verify":
            p.add_argument("--cuobjdump", help="cuobjdump to use (default: PATH, then CUDA_PATH\\bin)")
        if name == "smoke":
            p.add_argument("--venv", required=True, help="the fresh venv to make for the import test")
        if name == "place":
            p.add_argument("--wheelhouse", required=True)
            p.add_argument("--started", type=float, default=None, help="when the cell started (epoch seconds)")
    args = parser.parse_args(argv)
    steps = {"check": cmd_check, "fetch": cmd_fetch, "retag": cmd_retag, "verify": cmd_verify, "smoke": cmd_smoke,
             "place": cmd_place}
    try:
        steps[args.step](load_doc(args.doc), args)
    except Failed as exc:
        print("[imagegen] error: %s" % exc, file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
