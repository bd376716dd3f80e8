"""The gencode audit's records read and folded into its report: per extension (the .so the linker was
asked for) its sources, and per nvcc call its SASS and PTX targets, its C++ standard and flags; and where
the hook's time went (phases). imagegen (audit.py) judges the report; this module only reads.

Shipped beside imagegen_audit.py, whose stand-in compilers wrote the records (standard library only,
Python 3.8+)."""

import json
import os
import re

from imagegen_audit import _outputs

# A compile that defines one of these builds against torch's stable ABI (torch >= 2.9: flash-attn-3's and
# xformers' flash_api_stable.cpp): torch/extension.h is not its header, and the extension C++ minimum
# is not its rule (the probe's stable unit judges it).
_STABLE_DEFINES = frozenset(("TORCH_TARGET_VERSION", "TORCH_STABLE_ONLY"))


def stable_abi(argv):
    """Does this compile define TORCH_TARGET_VERSION or TORCH_STABLE_ONLY (a torch stable-ABI
    extension, whose sources must not include torch/extension.h)? -DNAME, -D NAME and nvcc's
    --define-macro NAME / --define-macro=NAME, each with or without =VALUE."""
    for i, a in enumerate(argv):
        if a in ("-D", "--define-macro"):
            name = argv[i + 1] if i + 1 < len(argv) else ""
        elif a.startswith("--define-macro="):
            name = a[len("--define-macro="):]
        elif a.startswith("-D"):
            name = a[2:]
        else:
            continue
        if name.split("=", 1)[0] in _STABLE_DEFINES:
            return True
    return False


_GENCODE = re.compile(r"arch=(compute_\w+|sm_\w+),code=\[?([\w,]+)\]?")


def nvcc_targets(argv):
    """The (kind, arch) targets of one nvcc call: ("sass", "sm_90a"), ("ptx", "compute_90a").

    -gencode arch=A,code=C[,C...]; --generate-code; -arch/-code pairs; -arch=sm_X alone
    (shorthand for SASS sm_X + PTX compute_X); -arch=compute_X alone (PTX only); -arch=native/all.
    With no arch option at all, nvcc compiles its own default: ("default", "").
    """
    targets = []
    arch = code = None
    i = 0
    while i < len(argv):
        a = argv[i]
        nxt = argv[i + 1] if i + 1 < len(argv) else ""
        val = None
        for opt in ("-gencode", "--generate-code"):
            if a == opt:
                val, i = nxt, i + 1
            elif a.startswith(opt + "="):
                val = a[len(opt) + 1:]
        if val is not None:
            m = _GENCODE.search(val.replace(" ", "").replace('"', ""))
            if m:
                for c in m.group(2).split(","):
                    targets.append(("ptx" if c.startswith("compute_") else "sass", c))
            i += 1
            continue
        for opt in ("-arch", "--gpu-architecture"):
            if a == opt:
                arch, i = nxt, i + 1
            elif a.startswith(opt + "="):
                arch = a[len(opt) + 1:]
        for opt in ("-code", "--gpu-code"):
            if a == opt:
                code, i = nxt, i + 1
            elif a.startswith(opt + "="):
                code = a[len(opt) + 1:]
        i += 1
    if arch:
        if arch in ("native", "all", "all-major"):
            targets.append(("special", arch))
        elif code:
            for c in code.split(","):
                targets.append(("ptx" if c.startswith("compute_") else "sass", c))
        elif arch.startswith("sm_"):
            targets += [("sass", arch), ("ptx", "compute_" + arch[3:])]
        else:
            targets.append(("ptx", arch))
    if not targets:
        targets.append(("default", ""))
    return list(dict.fromkeys(targets))


_SOURCE = re.compile(r"\.(cu|cpp|cc|cxx|c)$")
_SKIP_FLAG_PREFIX = ("-I", "-D", "-U", "-isystem", "-o", "-MF", "-MD", "-MMD", "--dependency-output",
                     "--generate-dependencies", "-c", "-gencode", "--generate-code", "-arch", "-code",
                     "--gpu-architecture", "--gpu-code")


def _flags(argv):
    """The flags of an nvcc call that shape code generation (no paths, defines or targets)."""
    out = []
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in ("-I", "-isystem", "-o", "-MF", "--dependency-output", "-gencode", "--generate-code", "-arch",
                 "-code", "-x", "-ccbin", "--compiler-bindir"):
            skip = True
            continue
        if a.startswith(_SKIP_FLAG_PREFIX) or _SOURCE.search(a) or a.endswith((".o", ".so")):
            continue
        out.append(a)
    return out


_STD_OPTIONS = ("-std", "--std")
_HOST_OPTIONS = ("-Xcompiler", "--compiler-options")


def std_args(argv):
    """The arguments of a compile that choose its C++ standard, in order and as written: -std=c++17,
    --std c++17 (both words), /std:c++20, and what nvcc hands the host compiler (-Xcompiler -std=...,
    -Xcompiler=...). imagegen (model/cxx_std.py) reads them; this script only records."""
    out = []
    i = 0
    while i < len(argv):
        a = argv[i]
        nxt = argv[i + 1] if i + 1 < len(argv) else None
        if (a in _STD_OPTIONS or a in _HOST_OPTIONS) and nxt is not None:
            if a in _STD_OPTIONS or "std" in nxt:
                out += [a, nxt]
            i += 2
            continue
        if a.startswith(("-std=", "--std=", "/std:", "-std:")) or (a.startswith(tuple(o + "=" for o in _HOST_OPTIONS)) and "std" in a):
            out.append(a)
        i += 1
    return out


def _module_of(so_path):
    """sageattention/_qattn_sm90.cpython-312-x86_64-linux-gnu.so -> sageattention._qattn_sm90."""
    parts = so_path.replace("\\", "/").split("/")
    for i in range(len(parts) - 1, -1, -1):
        if parts[i] == "lib" or parts[i].startswith("lib.") or parts[i] == "build_lib":
            parts = parts[i + 1:]
            break
    else:
        parts = parts[-1:]
    parts[-1] = parts[-1].split(".", 1)[0]
    return ".".join(p for p in parts if p)


def _arch_order(name):
    """sm_80 < sm_90a < sm_120 (numbers, not text)."""
    m = re.search(r"(\d+)([a-z]*)$", name)
    return (int(m.group(1)), m.group(2)) if m else (0, name)


def _is_link(r):
    return r["tool"] == "ld" or ("-shared" in r["argv"] and r["tool"] in ("cc", "cxx"))


def _absolute_outputs(r):
    """The files a compile or link record writes, as absolute paths."""
    outs, _ = _outputs(r["argv"])
    return [os.path.normpath(os.path.join(r["cwd"], o)) for o in outs]


def _link_parts(r):
    """(the file a link record writes, the objects it links), as absolute paths."""
    outs = _absolute_outputs(r)
    objs = [os.path.normpath(os.path.join(r["cwd"], a)) for a in r["argv"] if a.endswith(".o")]
    return (outs[0] if outs else ""), objs


def _link_groups(records):
    """(module, its compile records) per extension the build links, grouped as fold() groups them."""
    compiles, links = {}, []
    for r in records:
        if _is_link(r):
            output, objs = _link_parts(r)
            links.append((_module_of(output), objs))
            continue
        for o in _absolute_outputs(r):
            compiles[o] = r
    return [(module, [compiles[o] for o in objs if o in compiles]) for module, objs in links]


def fold(records, src_root):
    """Group compile records into extensions through the link records that consume their objects."""
    compiles = {}  # object path -> entry
    links = []
    for r in records:
        argv, cwd = r["argv"], r["cwd"]
        if _is_link(r):
            output, objs = _link_parts(r)
            links.append({"output": output, "objects": objs})
            continue
        absolute = _absolute_outputs(r)
        sources = [a for a in argv if _SOURCE.search(a) and not a.startswith("-")]
        src = sources[-1] if sources else ""
        src_abs = os.path.normpath(os.path.join(cwd, src)) if src else ""
        shown = os.path.relpath(src_abs, src_root) if src_abs.startswith(src_root + os.sep) else src
        # A stable-ABI compile (TORCH_TARGET_VERSION / TORCH_STABLE_ONLY) includes only torch's stable
        # headers, which compile as C++17 where torch/extension.h #errors (torch 2.14: g++ -std=c++17
        # -fsyntax-only of torch/csrc/stable/library.h and tensor.h passes): its standard is not held to
        # torch's extension minimum; the header probe (the stable unit, with its flags) judges it.
        stable = stable_abi(argv)
        entry = {"tool": r["tool"], "source": shown, "std": std_args(argv), "stable": stable}
        if r["tool"] == "nvcc":
            entry["targets"] = ["%s:%s" % t for t in nvcc_targets(argv)]
            entry["flags"] = _flags(argv)
        for o in absolute:
            compiles[o] = entry
    extensions, used = [], set()
    for link in links:
        parts = [compiles[o] for o in link["objects"] if o in compiles]
        used.update(o for o in link["objects"] if o in compiles)
        nvcc_parts = [p for p in parts if p["tool"] == "nvcc"]
        sass = sorted({t.split(":", 1)[1] for p in nvcc_parts for t in p["targets"] if t.startswith("sass:")}, key=_arch_order)
        ptx = sorted({t.split(":", 1)[1] for p in nvcc_parts for t in p["targets"] if t.startswith("ptx:")}, key=_arch_order)
        other = sorted({t for p in nvcc_parts for t in p["targets"] if not t.startswith(("sass:", "ptx:"))})
        # The standard of each kind of compile (nvcc, the host compiler): distinct argument lists,
        # an empty one where the command line names none.
        stds = []
        for p in parts:
            if p["stable"]:
                continue
            item = {"tool": p["tool"], "args": p["std"]}
            if item not in stds:
                stds.append(item)
        common = None
        for p in nvcc_parts:
            common = list(p["flags"]) if common is None else [f for f in common if f in p["flags"]]
        extensions.append({
            "module": _module_of(link["output"]),
            "output": os.path.basename(link["output"]),
            "sources": [p["source"] for p in parts],
            "cuda_sources": [{"source": p["source"], "targets": p["targets"]} for p in nvcc_parts],
            "sass": sass,
            "ptx": ptx,
            "other_targets": other,
            "nvcc_flags": common or [],
            "std_args": stds[:20],
            "stable_abi_sources": sum(1 for p in parts if p["stable"]),
        })
    loose = [dict(e, object=o) for o, e in compiles.items() if o not in used and e["tool"] == "nvcc"]
    return {"extensions": extensions, "unlinked_cuda_compiles": loose}


def read_records(log):
    out = []
    try:
        with open(log, encoding="utf-8", errors="replace") as fh:
            for n, line in enumerate(fh):
                if n >= 200000:  # bound what a hostile build can make us hold
                    break
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
    except OSError:
        pass
    return out


def phases(records, started, ended):
    """Where the package's build spent the audit's time, from the records' timestamps: until its first
    compile (setup.py, importing torch, ...), its compiles (stand-ins: recorded, nothing compiled)
    and after the last one (linking, packing the wheel); seconds, and the number of records."""
    times = sorted(r["t"] for r in records if isinstance(r.get("t"), (int, float)))
    if not times:
        return {"records": 0, "before": round(ended - started, 2), "compiles": 0.0, "after": 0.0}
    first, last = max(started, times[0]), min(ended, times[-1])
    return {"records": len(times), "before": round(first - started, 2), "compiles": round(max(0.0, last - first), 2),
            "after": round(max(0.0, ended - last), 2)}
