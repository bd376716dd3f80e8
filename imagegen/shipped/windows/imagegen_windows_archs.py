"""The Windows helper's arch check (imagegen_windows.py verify): which device code each extension of a
built wheel carries, read with cuobjdump --list-elf / --list-ptx (imagegen_wheeltools.cuobjdump_listing,
as `imagegen verify` reads it), and whether every requested SASS (and PTX where +PTX was asked) is there.

Written beside the helper by a rendered build.ps1/build.cmd. Standard library only, Python 3.8+, ASCII
only (cmd and PowerShell write it out)."""

import os
import re
import shutil
import subprocess
import tempfile
import zipfile

from imagegen_wheeltools import cuobjdump_listing, so_module

_EXTENSION = re.compile(r"\.(pyd|so(\.\d+)*)$")


class CuobjdumpFailed(Exception):
    """cuobjdump could not run, or failed on an extension it should have listed."""


def listed_targets(text):
    """The targets cuobjdump --list-elf / --list-ptx lists, each once: {'sm_80', 'sm_90a', 'compute_120'}."""
    return {("sm_" if kind == "sass" else "compute_") + str(cc) + variant for kind, cc, variant in cuobjdump_listing(text)}


def missing_targets(expected, found, allowed=None):
    """The requested targets (``expected``: {cc, sass, ptx}) an extension with ``found`` lacks; an
    extension whose kernels can target only some ccs (``allowed``, the recipe's knowledge) is held
    to those."""
    out = []
    for want in expected:
        if allowed is not None and want["cc"] not in allowed:
            continue
        for kind in ("sass", "ptx"):
            if want.get(kind) and want[kind] not in found:
                out.append(want[kind])
    return out


def judge(expected, listings, extension_archs):
    """(problems, lines) for the extensions' listings ({name in the wheel: set of targets}): each
    CUDA extension must carry every requested target it can, and the wheel must have one."""
    problems, lines = [], []
    cuda = {name: found for name, found in sorted(listings.items()) if found}
    if not cuda:
        return ["the wheel contains no CUDA extension (no .pyd with device code)"], lines
    wanted = {t for w in expected for t in (w.get("sass"), w.get("ptx")) if t}
    for name, found in cuda.items():
        allowed = extension_archs.get(so_module(name))
        missing = missing_targets(expected, found, allowed)
        extra = sorted(found - wanted - {"compute_" + t[3:] for t in wanted if t.startswith("sm_")})
        lines.append("%s: %s%s" % (name, ", ".join(sorted(found)), " (also %s, not requested)" % ", ".join(extra)
                                   if extra else ""))
        if missing:
            problems.append("%s lacks %s (has %s)" % (name, ", ".join(missing), ", ".join(sorted(found))))
    return problems, lines


def list_extension(exe, path):
    """The targets cuobjdump lists for one extension (empty: no device code)."""
    try:
        proc = subprocess.run([exe, "--list-elf", "--list-ptx", path], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    except OSError as exc:
        raise CuobjdumpFailed("cannot run cuobjdump: %s: %s" % (exe, exc))
    out = proc.stdout.decode("utf-8", "replace")
    found = listed_targets(out)
    if proc.returncode != 0 and not found and "does not contain device code" not in out:
        raise CuobjdumpFailed("cuobjdump failed on %s (exit %d): %s"
                              % (os.path.basename(path), proc.returncode, out.strip()[-300:]))
    return found


def wheel_listings(wheel, exe):
    """{extension's name in the wheel: the targets cuobjdump lists for it}, each extension read from a
    copy outside the wheel (cuobjdump reads files)."""
    listings = {}
    with zipfile.ZipFile(wheel) as zf, tempfile.TemporaryDirectory(prefix="imagegen-verify-") as tmp:
        for i, info in enumerate(zf.infolist()):
            if not _EXTENSION.search(info.filename):
                continue
            copy = os.path.join(tmp, "%d-%s" % (i, os.path.basename(info.filename)))
            with zf.open(info) as src, open(copy, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            listings[info.filename] = list_extension(exe, copy)
    return listings
