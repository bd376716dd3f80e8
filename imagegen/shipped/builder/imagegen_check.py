"""The checks of a built wheel in the builder: `smoke` (install it, import the recipe's modules from /) and
`gpu-check` (the recipe's numerical check on the GPU a build step was handed: RUN --device, CDI), with
`gpu-check-deps` (what that check imports, installed first). Each adds its result to the wheel's build
record (imagegen_records.py).

Shipped beside imagegen_build.py (standard library only, Python 3.8+)."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import imagegen_rules as rules  # what the recipe reader checked them with
import imagegen_wheeltools as wheeltools
from imagegen_records import RECORD_SUFFIX, add_report_to_records
from imagegen_toolchain import fail, log, run, secret_env, venv_python


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
    imports, driver_imports = smoke_lists(cell, wheels)
    modules = imports + driver_imports
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


def smoke_lists(cell, wheels):
    """(imports, driver imports) of the smoke test: the plan's, resolved for the planned arch list
    (cell.json's smoke_imports/smoke_driver_imports: only the extensions that list builds). A wheel
    whose build record says it was built for another list (a bake --set, the GPUs `docker run --gpus
    all` saw) gets the recipe's routed modules (smoke_routed) resolved again for that list, by the rule
    the plan used (imagegen_rules.smoke_modules), so that the test imports what that list built."""
    imports, driver_imports = list(cell["smoke_imports"]), list(cell.get("smoke_driver_imports", []))
    routed = cell.get("smoke_routed") or []
    ccs = _built_ccs(cell, wheels) if routed else None
    if ccs is None:
        return imports, driver_imports
    for route in routed:
        names = driver_imports if route["driver"] else imports
        builds = rules.routed_builds(route["ccs"], ccs)
        if builds and route["module"] not in names:
            names.append(route["module"])
        elif not builds and route["module"] in names:
            names.remove(route["module"])
    log("smoke: the wheel was built for %s, not the planned list: importing %s"
        % (";".join(ccs), ", ".join(imports + driver_imports)))
    return imports, driver_imports


def _built_ccs(cell, wheels):
    """The ccs the wheels were built for where their build records name another list than the planned
    one (the ccs the package's knob compiled: the recipe's runs_on applied), else None."""
    for wheel in wheels:
        try:
            with open(wheel + RECORD_SUFFIX, encoding="utf-8") as fh:
                record = json.load(fh)
        except (OSError, ValueError):
            continue
        asked, planned = record.get("requested_archs"), record.get("planned_archs")
        if not (isinstance(asked, str) and asked.strip() and isinstance(planned, str)) or asked == planned:
            continue
        try:
            archs = rules.parse_canonical(asked)
        except ValueError:
            continue
        archs, _ = rules.map_families(archs, (cell.get("knob") or {}).get("runs_on"))
        return rules.archs_ccs(archs)
    return None


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
    bad = [r for r in requires if not isinstance(r, str) or not rules.PIP_REQUIREMENT.fullmatch(r)]
    if bad:
        fail("gpu check: %r is not a requirement imagegen installs (name[extras] and version specifiers only)" % bad[0])
    if requires:
        py = venv_python(cell) if os.path.exists(venv_python(cell)) else sys.executable
        run([py, "-m", "pip", "install", "--disable-pip-version-check"] + list(requires)
            + ["torch==" + cell["torch"]["version"]], env=secret_env(os.environ))




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
