"""The gencode audit's include lookup: per extension module, the include folders its compiles ask for
(-I, -isystem, --include-path) inside the package's own tree that are missing or empty, and the git
submodule (.gitmodules) not checked out that each lies in. The classic case: a checkout without `--recursive`, whose
csrc/cutlass is an empty folder; setup.py runs, every compile fails on `cutlass/cutlass.h: No such file`.

Shipped beside imagegen_audit.py (standard library only, Python 3.8+). The tree is untrusted: .gitmodules
is read as bounded text (never by git, nothing it says is run), and only folders inside the tree are
looked at."""

import os

from imagegen_audit_records import _link_groups

MAX_GITMODULES_BYTES = 64 * 1024  # a real one is a few hundred bytes a submodule
MAX_REPORTED = 20


def _include_args(argv):
    """The include folders of a compile command line, as written: -I DIR, -IDIR, -isystem DIR,
    -isystemDIR, --include-path DIR, --include-path=DIR (nvcc's long form)."""
    out = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("-I", "-isystem", "--include-path") and i + 1 < len(argv):
            out.append(argv[i + 1])
            i += 2
            continue
        if a.startswith("--include-path="):
            out.append(a[len("--include-path="):])
        elif a.startswith("-isystem") and len(a) > len("-isystem"):
            out.append(a[len("-isystem"):])
        elif a.startswith("-I") and len(a) > 2:
            out.append(a[2:])
        i += 1
    return out


def submodule_paths(src_root):
    """The `path = ...` entries of the tree's .gitmodules (relative, normalised, inside the tree); none
    when there is no such regular file or it is larger than any real one."""
    name = os.path.join(src_root, ".gitmodules")
    try:
        if os.path.islink(name) or not os.path.isfile(name) or os.path.getsize(name) > MAX_GITMODULES_BYTES:
            return []
        with open(name, encoding="utf-8", errors="replace") as fh:
            text = fh.read(MAX_GITMODULES_BYTES)
    except OSError:
        return []
    paths = []
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if not sep or key.strip() != "path":
            continue
        path = os.path.normpath(value.strip().strip('"'))
        if path and not os.path.isabs(path) and path != "." and not path.startswith(".." + os.sep) and path != "..":
            paths.append(path)
    return paths


def _state(folder):
    """'missing', 'empty' or None (a folder with something in it)."""
    if not os.path.isdir(folder):
        return "missing"
    try:
        with os.scandir(folder) as entries:
            return None if next(entries, None) is not None else "empty"
    except OSError:
        return None


def missing_includes(records, src_root):
    """Per extension module, its compiles' include folders inside ``src_root`` that are missing or empty:
    [{"path": relative to the tree, "state": "missing" | "empty", "submodule": the .gitmodules path it
    lies in when that submodule is not checked out (its folder missing or empty), else ""}], at most
    MAX_REPORTED each."""
    root = os.path.realpath(src_root)
    submodules = submodule_paths(root)
    seen, out = {}, {}
    for module, compiles in _link_groups(records):
        for r in compiles:
            for folder in _include_args(r["argv"]):
                full = os.path.normpath(os.path.join(r["cwd"], folder))
                if not full.startswith(root + os.sep) or not os.path.realpath(full).startswith(root + os.sep):
                    continue  # torch's, the toolkit's, the system's, or a link out of the tree: not looked at
                rel = os.path.relpath(full, root)
                if rel not in seen:
                    seen[rel] = _state(full)
                found = out.setdefault(module, [])
                if seen[rel] is None or any(f["path"] == rel for f in found) or len(found) >= MAX_REPORTED:
                    continue
                sub = next((s for s in submodules if rel == s or rel.startswith(s + os.sep)), "")
                if sub and _state(os.path.join(root, sub)) is None:
                    sub = ""  # checked out, but without this folder (a trimmed copy): the build may not need it
                found.append({"path": rel, "state": seen[rel], "submodule": sub})
    return dict((m, found) for m, found in out.items() if found)


def add_include_missing(report, records, src_root):
    """Each extension's ``include_missing`` (missing_includes)."""
    missing = missing_includes(records, src_root)
    for ext in report.get("extensions", []):
        ext["include_missing"] = missing.get(ext["module"], [])
    return report
