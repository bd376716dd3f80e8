"""The gencode audit's link lookup: per extension module, the libraries its link asks for (-lNAME) that the
linker would not find (the classic case: -lcuda where no driver is installed; the compile passes and the
link stops at `cannot find -lcuda`).

Shipped beside imagegen_audit.py (standard library only, Python 3.8+)."""

import json
import os

from imagegen_audit import REAL_ENV
from imagegen_audit_records import _is_link, _link_parts, _module_of


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


def add_link_missing(report, records, env):
    """Each extension's ``link_missing``: the -l libraries its link would not find (missing_libraries)."""
    missing = missing_libraries(records, env)
    for ext in report.get("extensions", []):
        ext["link_missing"] = missing.get(ext["module"], [])
    return report
