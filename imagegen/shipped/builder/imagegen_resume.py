"""Stop a long compile at its budget and resume it later, shipped beside imagegen_build.py.

A hosted CI runner ends a job at 6 hours, and a flash-attn-class build for several archs takes longer.
A build given a budget (IMAGEGEN_BUILD_BUDGET: seconds from the start of the package's build) is
stopped when it is spent, and its tree (the package's sources and its build folder: ninja's objects,
.ninja_log and .ninja_deps) is saved as <resume folder>/<inputs hash>.tar (IMAGEGEN_RESUME_DIR; in
the image a cache mount, on a CI runner a folder its cache keeps). The next build of the same
inputs restores that tree, at the same path and with the files' times, in place of a fresh copy of
the source, and ninja compiles only what the stopped build had not finished: an object its log does
not list (a compile stopped halfway) is compiled again. The state is keyed by the cell's inputs hash,
so a build of anything else (another commit, patch, torch, arch list) never starts from it.
"""

import io
import json
import os
import re
import tarfile
import time

RESUME_DIR_ENV = "IMAGEGEN_RESUME_DIR"
BUDGET_ENV = "IMAGEGEN_BUILD_BUDGET"
INPUTS_ENV = "IMAGEGEN_INPUTS"
# EX_TEMPFAIL: the build stopped at its budget and its state is saved; the same build again resumes.
STOPPED_EXIT = 75
_INPUTS = re.compile(r"^[0-9a-f]{8,64}$")
_MAX_MEMBERS = 2000000
TIMES = ".imagegen-resume-times.json"  # in the saved tree: each file's time in ns, applied and removed


def budget_seconds(env):
    """The build's budget in seconds (IMAGEGEN_BUILD_BUDGET, a whole number > 0), or None."""
    value = (env.get(BUDGET_ENV) or "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def state_path(env):
    """Where this cell's saved state lives (<IMAGEGEN_RESUME_DIR>/<inputs hash>.tar), or None when no
    resume folder is given or the build has no inputs hash to key it by."""
    folder = (env.get(RESUME_DIR_ENV) or "").strip()
    inputs = (env.get(INPUTS_ENV) or "").strip()
    if not folder or not _INPUTS.match(inputs):
        return None
    planned = env.get("IMAGEGEN_PLANNED_ARCHS")
    if planned and env.get("TORCH_CUDA_ARCH_LIST") != planned:
        return None  # archs overridden (bake --set): the inputs hash does not say what this build is
    return os.path.join(folder, inputs + ".tar")


def _build_folders(tree):
    """One walk of ``tree``'s build folders: (object files in them, the steps of each .ninja_log as
    ninja_steps() gives them)."""
    objects, steps = 0, {}
    for folder, _, files in os.walk(os.path.join(tree, "build")):
        objects += sum(1 for f in files if f.endswith((".o", ".obj")))
        if ".ninja_log" in files:
            path = os.path.join(folder, ".ninja_log")
            steps[path] = []
            try:
                with open(path, "rb") as fh:
                    for line in fh:
                        fields = line.rstrip(b"\n").split(b"\t")
                        if len(fields) >= 4 and not line.startswith(b"#"):
                            steps[path].append(os.path.join(folder, fields[3].decode("utf-8", "replace")))
            except OSError:
                pass
    return objects, steps


def ninja_steps(tree):
    """Per .ninja_log under ``tree``: the outputs of its steps in the order ninja logged them (one
    per finished compile; a step run again is logged again)."""
    return _build_folders(tree)[1]


def ninja_entries(tree):
    """How many steps the .ninja_log files under ``tree`` list (finished compiles)."""
    return sum(len(set(outputs)) for outputs in ninja_steps(tree).values())


def steps_since(tree, before):
    """(steps run since ``before`` (a ninja_steps() of this tree), those of them that ``before`` had
    finished already): what a resumed build compiled, and what it compiled again."""
    now, again = [], []
    for path, outputs in ninja_steps(tree).items():
        earlier = before.get(path, [])
        new = outputs[len(earlier):]
        now += new
        again += [o for o in new if o in set(earlier)]
    return now, again


def save(work, path, info):
    """Write ``work``/src (the tree the build ran in) to ``path`` (a PAX tar: the files' times to the
    nanosecond, which ninja compares), under a temporary name first: a reader never sees half a
    state. ``info`` goes beside it as <path>.json. Returns the tar's size in bytes."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = "%s.%d.partial" % (path, os.getpid())
    src = os.path.join(work, "src")
    # Every file's time to the nanosecond: a PAX header's time comes back through a float, ~100 ns off
    # either way, and ninja takes an object newer than the time its deps log recorded for it as out of
    # date (it compiled a third of the finished steps again).
    times = {}
    for folder, _, files in os.walk(src):
        for name in files:
            p = os.path.join(folder, name)
            st = os.lstat(p)
            times[os.path.relpath(p, src)] = st.st_mtime_ns
    try:
        with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
            tar.add(src, arcname="src")
            data = json.dumps(times).encode()
            member = tarfile.TarInfo("src/" + TIMES)
            member.size, member.mtime = len(data), int(time.time())
            tar.addfile(member, io.BytesIO(data))
        with open(tmp + ".json", "w", encoding="utf-8") as fh:
            json.dump(dict(info, saved_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())), fh)
        os.replace(tmp + ".json", path + ".json")
        os.replace(tmp, path)
    finally:
        for leftover in (tmp, tmp + ".json"):
            if os.path.exists(leftover):
                os.unlink(leftover)
    return os.path.getsize(path)


def _safe_members(tar, dest):
    """The members of ``tar`` when each lands inside ``dest``/src (plain files, folders and links
    that stay inside it); else ValueError. For a Python without tarfile's data filter (< 3.11.4)."""
    root = os.path.realpath(os.path.join(dest, "src"))
    members = []
    for n, m in enumerate(tar):
        if n >= _MAX_MEMBERS:
            raise ValueError("more than %d members" % _MAX_MEMBERS)
        target = os.path.realpath(os.path.join(dest, m.name))
        if not (target == root or target.startswith(root + os.sep)) or not (m.isfile() or m.isdir() or m.issym()):
            raise ValueError("member %r is not a file, folder or link inside src/" % m.name[:200])
        if m.issym():
            linked = os.path.realpath(os.path.join(os.path.dirname(target), m.linkname))
            if not (linked == root or linked.startswith(root + os.sep)):
                raise ValueError("link %r leads out of src/" % m.name[:200])
        members.append(m)
    return members


def restore(path, work):
    """Unpack the saved state at ``path`` into ``work`` (as ``work``/src, times kept). Returns what
    it held ({objects, entries, info}), or None when there is no state or it cannot be used (then
    ``work``/src is removed again and the build starts afresh)."""
    if not path or not os.path.isfile(path):
        return None
    import shutil
    dest = os.path.join(work, "src")
    shutil.rmtree(dest, ignore_errors=True)
    try:
        with tarfile.open(path) as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(work, filter="data")
            else:
                tar.extractall(work, members=_safe_members(tar, work))
    except (OSError, tarfile.TarError, ValueError, EOFError):
        shutil.rmtree(dest, ignore_errors=True)
        return None
    if not os.path.isdir(dest):
        return None
    _set_times(dest)
    try:
        with open(path + ".json", encoding="utf-8") as fh:
            info = json.load(fh)
    except (OSError, ValueError):
        info = {}
    objects, steps = _build_folders(dest)  # one walk of the restored tree
    return {"objects": objects, "entries": sum(len(set(o)) for o in steps.values()), "steps": steps,
            "info": info if isinstance(info, dict) else {}}


def _set_times(dest):
    """Give every restored file the time it had to the nanosecond (save() listed them)."""
    listing = os.path.join(dest, TIMES)
    try:
        with open(listing, encoding="utf-8") as fh:
            times = json.load(fh)
    except (OSError, ValueError):
        times = {}
    finally:
        if os.path.lexists(listing):
            os.unlink(listing)
    root = os.path.realpath(dest)
    for rel, ns in (times.items() if isinstance(times, dict) else ()):
        p = os.path.join(dest, rel)
        if isinstance(ns, int) and os.path.realpath(p).startswith(root + os.sep) and os.path.isfile(p) \
                and not os.path.islink(p):
            os.utime(p, ns=(ns, ns))


def forget(path):
    """Remove a saved state once the build it was for has its wheel."""
    for p in (path, path + ".json"):
        try:
            os.unlink(p)
        except OSError:
            pass
