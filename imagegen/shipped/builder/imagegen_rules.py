"""The rules imagegen and its in-build script must agree on, written once.

imagegen (the library: imagegen.model.arch, imagegen.model.jobs, imagegen.plan) imports this module; every
builder image and native build gets it verbatim beside imagegen_build.py, which imports it too. So a
build inside Docker and a native build size their jobs and write their arch knobs by the same code:

- the canonical arch list imagegen writes into TORCH_CUDA_ARCH_LIST (8.0;9.0a;12.0+PTX;compute_120),
  its formats for each package's knob, and the family mapping of a knob that compiles one cubin for
  several ccs (``runs_on``: flash-attn's 80 serves 8.6 and 8.9);
- how much to compile at once: the machine's cores and the share of its RAM a build may plan for,
  MAX_JOBS x NVCC_THREADS from the recipe's memory figures, the EXT_PARALLEL split, and the peak-RAM
  estimate from the gencode audit's load (imagegen.model.jobs explains the model and its calibration);
- what a value imagegen checked must look like when the build reads it again: a pip requirement
  (the recipe's, the GPU check's), the compile cache's URL (imagegen.safety uses the same patterns).

Standard library only, Python 3.8+ (it runs inside any base image). Errors are ValueError with a
message for the user; callers turn them into their own error type.
"""

import os
import re

# Share of the machine's RAM a build may plan for. Total rather than momentarily free memory: the
# same machine sizes the same build the same way (a value that moved with the page cache would give
# other job counts from one run to the next, and the plan's estimate would not be the build's).
RAM_SHARE = 0.8
# The BuildKit secret through which imagegen's bake hands the compile step its MAX_JOBS and
# NVCC_THREADS (NAME=N lines, written per batch): a secret is no cache key, unlike a build arg.
JOBS_SECRET = "imagegen_jobs"
# Memory of one nvcc process apart from its device threads (nvcc itself, cudafe++ and the host
# compiler over torch's headers): calibrated on SageAttention's H100 builds (imagegen.model.jobs).
NVCC_HOST_GB = 1.0

# A pip requirement imagegen installs (the recipe's build.requires and smoke.check_requires): a name with
# extras and version specifiers, nothing a shell or pip could read as an option, a URL or a file.
PIP_REQUIREMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9_,-]+\])?([<>=!~]=?[A-Za-z0-9.*+-]+)?"
                             r"(,[<>=!~]=?[A-Za-z0-9.*+-]+)*")
# A compile cache's remote storage, as ccache takes it (redis://[[USER]:PASSWORD@]HOST[:PORT][/DB],
# http://HOST[:PORT]/PATH): it reaches builds as a BuildKit secret only, so it may hold a credential.
# `imagegen build --compile-cache URL` / a CI secret: the BuildKit secret that brings it to the compile step,
# read from the bake process's environment variable (empty when unset: no remote). A native build hands
# the URL to the in-build script in that same variable.
COMPILE_CACHE_SECRET = "imagegen_ccache_remote"
COMPILE_CACHE_VARIABLE = "IMAGEGEN_CCACHE_REMOTE"
COMPILE_CACHE_URL = re.compile(r"(redis|http)://[A-Za-z0-9._~:/?#\[\]@!&()*+,;=%-]{1,400}")
_CACHE_HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,252})|\[[0-9A-Fa-f:.]{2,45}\]")
# what may follow the host unencoded (path, query, fragment): no space, quote, '|' (ccache's separators)
_CACHE_REST = re.compile(r"[A-Za-z0-9._~:/?#\[\]@!&()*+,;=%-]{0,400}")
_USERINFO_SAFE = "-._~!$&'()*+,;="  # sub-delims stay as they are; '/', ':', '@', '%', '#', ' ', '|' ... are encoded


def compile_cache_url(value):
    """A compile cache's remote storage URL as ccache takes it: ``(url, shown, note)``.

    ``url`` is the value with its user and password percent-encoded (a password from `openssl rand
    -base64` holds '/', '+', '='; one may hold '@' or ':': the userinfo ends at the LAST '@'), and a
    password with a ':' but no user given as user 'default' (ccache would split it at the ':');
    ``shown`` is scheme://host[:port][/path], never the userinfo, query or fragment; ``note`` says, in
    one line, what was encoded ('' when nothing). ValueError (a message without the value) when ccache
    cannot take it."""
    value = value.strip()
    if len(value) > 1024 or any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ValueError("too long or holds a control character")
    scheme, sep, rest = value.partition("://")
    if not sep or scheme not in ("redis", "http"):
        raise ValueError("not a redis:// or http:// URL")
    userinfo, at, hostpart = rest.rpartition("@")
    if not at:
        userinfo, hostpart = None, rest
    cut = min([i for i in (hostpart.find("/"), hostpart.find("?"), hostpart.find("#")) if i >= 0] or [len(hostpart)])
    authority, tail = hostpart[:cut], hostpart[cut:]
    host, port = authority, ""
    m = re.fullmatch(r"(.*?)(?::([0-9]*))?", authority) if not authority.endswith("]") else None
    if m:
        host, port = m.group(1), m.group(2) or ""
    if not _CACHE_HOST.fullmatch(host):
        raise ValueError("no host (or a host with characters a host name cannot hold)")
    if port and not 0 < int(port) < 65536:
        raise ValueError("port %s is not between 1 and 65535" % port)
    if not _CACHE_REST.fullmatch(tail):
        raise ValueError("a space, quote, '|' or other character ccache cannot take after the host")
    path = re.split(r"[?#]", tail, 1)[0]
    if scheme == "redis":
        if path == "/":
            tail, path = tail[1:], ""
        if path and not re.fullmatch(r"/[0-9]{1,5}", path):
            raise ValueError("a redis URL's path is its database number (redis://HOST:PORT/0)")
    elif not path:
        path = tail = "/" + tail  # http://HOST:PORT is http://HOST:PORT/
    shown = "%s://%s%s%s" % (scheme, host, ":" + port if port else "", path)
    note, userpart = "", ""
    if userinfo is not None:
        from urllib.parse import quote, unquote

        user, colon, password = userinfo.partition(":")
        user, password = unquote(user), unquote(password)
        if not colon:  # redis://PASSWORD@HOST
            if scheme == "http":
                raise ValueError("an http URL's credential is USER:PASSWORD before the host")
            user, password = "", user
        if not password:
            raise ValueError("an empty password before '@'")
        if ":" in user:
            raise ValueError("a user name with a ':'")
        if scheme == "redis" and not user and ":" in password:
            user = "default"  # ccache reads a lone PASSWORD with a ':' as USER:PASSWORD
        encoded = (quote(user, safe=_USERINFO_SAFE) + ":" if user or scheme == "http" else "") + quote(
            password, safe=_USERINFO_SAFE)
        if encoded != userinfo:
            note = "the password was percent-encoded for ccache (its '/', '@', ':' and the like)"
        userpart = encoded + "@"
    url = "%s://%s%s%s" % (scheme, userpart, authority, tail)
    return url, shown, note


def compile_cache_redacted(value):
    """A compile cache value for a message, whatever it holds: its user and password as ***, no query
    or fragment, one line, short."""
    value = re.sub(r"[\x00-\x1f\x7f]+", " ", value.strip())
    scheme, sep, rest = value.partition("://")
    if not sep:
        scheme, rest = "", value
    userinfo, at, hostpart = rest.rpartition("@")
    hostpart = hostpart if at else rest
    for mark in "?#":
        if mark in hostpart:
            hostpart = hostpart.split(mark, 1)[0] + mark + "***"
    shown = (scheme + sep if sep else "") + ("***@" if at else "") + hostpart
    return shown if len(shown) <= 120 else shown[:117] + "..."
UNKNOWN_RAM_GB = 8.0  # /proc/meminfo unreadable: assume a small machine rather than risk an OOM kill

# ------------------------------------------------------------------------------------------------
# Arch lists: imagegen's canonical form and the formats packages read

_ENTRY = re.compile(r"(?:compute_(\d+)(\d)([af]?))|(?:(\d+)\.(\d)([af]?)(\+PTX)?)")
STYLES = ("torch", "numeric", "dotted", "cmake", "gencode")


def parse_canonical(text):
    """imagegen's canonical arch list (8.0;9.0a;12.0+PTX;compute_120;10.0f; `;`, `,` or blanks
    between entries) as tuples (major, minor, variant, sass, ptx). Anything else is a ValueError."""
    out = []
    for tok in re.split(r"[;\s,]+", text.strip()):
        if not tok:
            continue
        m = _ENTRY.fullmatch(tok)
        if not m:
            raise ValueError("TORCH_CUDA_ARCH_LIST entry %r is not in imagegen's form (8.0, 9.0a, 12.0+PTX,"
                             " compute_120)" % tok)
        if m.group(1):
            out.append((int(m.group(1)), int(m.group(2)), m.group(3), False, True))
        else:
            out.append((int(m.group(4)), int(m.group(5)), m.group(6), True, bool(m.group(7))))
    if not out:
        raise ValueError("TORCH_CUDA_ARCH_LIST is empty: set the GPU archs to build for (no GPU is visible in a build)")
    return out


def _code(a, variant=True):
    return "%d%d%s" % (a[0], a[1], a[2] if variant else "")


def format_archs(archs, style, keep_variant=False):
    """``archs`` (tuples as parse_canonical gives) in a knob's format:
    torch "8.0;9.0a;12.0+PTX", numeric "80;90;120" (FLASH_ATTN_CUDA_ARCHS; variants only with
    ``keep_variant``), dotted "8.0;9.0" (NATTEN_CUDA_ARCH), cmake "80-real;120-virtual", gencode
    "-gencode=arch=compute_80,code=sm_80 ..." (PTX as code=compute_XY). Duplicates are dropped
    where a format loses the distinction (numeric, dotted)."""
    if style == "torch":
        parts = []
        for a in archs:
            if not a[3]:
                raise ValueError("a PTX-only target (compute_%s) cannot be written as TORCH_CUDA_ARCH_LIST" % _code(a))
            parts.append("%d.%d%s%s" % (a[0], a[1], a[2], "+PTX" if a[4] else ""))
        return ";".join(parts)
    if style == "numeric":
        return ";".join(dict.fromkeys(_code(a, keep_variant) for a in archs))
    if style == "dotted":
        return ";".join(dict.fromkeys("%d.%d" % (a[0], a[1]) for a in archs))
    if style == "cmake":
        parts = []
        for a in archs:
            if a[3]:
                parts.append(_code(a) + "-real")
            if a[4]:
                parts.append(_code(a) + "-virtual")
        return ";".join(parts)
    if style == "gencode":
        parts = []
        for a in archs:
            if a[3]:
                parts.append("-gencode=arch=compute_%s,code=sm_%s" % (_code(a), _code(a)))
            if a[4]:
                parts.append("-gencode=arch=compute_%s,code=compute_%s" % (_code(a), _code(a)))
        return " ".join(parts)
    raise ValueError("unknown arch format %r: use one of %s" % (style, ", ".join(STYLES)))


def _cc_key(cc):
    return tuple(int(x) for x in cc.split("."))


def map_families(archs, runs_on):
    """The archs a knob with ``runs_on`` (cc -> the cc whose cubin serves it, e.g. {"8.6": "8.0"} for
    flash-attn, whose knob takes 80 but silently ignores 86) really compiles: a requested cc it maps
    becomes the serving cc, entries that meet merge their SASS/PTX flags (8.0 and 8.6+PTX: 8.0+PTX),
    and variant targets (9.0a) are never mapped. Returns (archs, [(serving cc, [requested ccs])])."""
    if not runs_on:
        return list(archs), []
    merged = {}  # (major, minor, variant) -> [sass, ptx], in the order first seen
    moved = {}  # the cc compiled -> the requested ccs it serves
    for a in archs:
        key = tuple(a[:3])
        cc = "%d.%d" % (a[0], a[1])
        got = runs_on.get(cc) if not a[2] else None
        if got and got != cc:
            major, minor = _cc_key(got)
            key = (major, minor, "")
            wants = moved.setdefault(got, [])
            if cc not in wants:
                wants.append(cc)
        flags = merged.setdefault(key, [False, False])
        flags[0] = flags[0] or a[3]
        flags[1] = flags[1] or a[4]
    if not moved:
        return list(archs), []
    out = [k + (v[0], v[1]) for k, v in merged.items()]
    return out, sorted(moved.items(), key=lambda kv: _cc_key(kv[0]))


def family_note(moved, package=None):
    """"8.6, 8.9 run the sm_80 cubin" for what map_families moved (and why, when ``package`` is named)."""
    return "; ".join("%s run%s the sm_%s cubin%s" % (", ".join(wants), "s" if len(wants) == 1 else "",
                                                     got.replace(".", ""),
                                                     " (%s builds one cubin for the %s.x family)" % (package, got.split(".")[0])
                                                     if package else "")
                     for got, wants in moved)


# ------------------------------------------------------------------------------------------------
# Which extensions a list builds: the recipe's per-extension routing (SageAttention's _qattn_sm90 only
# for 9.0a). The gencode audit judges a build by it, the plan resolves the smoke test's modules by it,
# and a build for another list than the planned one (a bake --set, the GPUs `docker run --gpus all`
# sees) resolves them again here.

def routed_builds(route_ccs, ccs):
    """Does a build for the compute capabilities ``ccs`` ("12.0", ...) build an extension whose
    kernels target only ``route_ccs``? Only when the two meet: the package leaves it out otherwise
    (SageAttention builds _qattn_sm90 only for a list with 9.0)."""
    return any(cc in ccs for cc in route_ccs)


def smoke_modules(modules, routes, ccs):
    """``modules`` (a recipe's smoke imports) that a build for ``ccs`` installs: a routed one
    (``routes``: module -> the ccs its kernels target) only where routed_builds says so, every
    other one always."""
    return [m for m in modules if m not in routes or routed_builds(routes[m], ccs)]


def archs_ccs(archs):
    """The compute capabilities ("9.0", ...) of parse_canonical's tuples."""
    return ["%d.%d" % (a[0], a[1]) for a in archs]


# ------------------------------------------------------------------------------------------------
# How much to compile at once

def host_facts():
    """(cores this process may use, GB of RAM builds may plan for: RAM_SHARE of the total)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    mem_gb = None
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    mem_gb = int(line.split()[1]) / 1024 / 1024 * RAM_SHARE
    except (OSError, ValueError):
        pass
    return max(1, cpus), (UNKNOWN_RAM_GB if mem_gb is None else mem_gb)


_CHAIN = re.compile(r"(?:sass|ptx):(?:sm|compute)_(\d+[af]?)$")


def compile_chains(targets):
    """Independent chains nvcc --threads can run for one source: the distinct archs among its
    targets ("sass:sm_120" and "ptx:compute_120" share one cicc run; nvcc --dryrun shows it).
    At least 1: a source without an arch flag still compiles nvcc's default target."""
    return max(1, len({m.group(1) for m in (_CHAIN.match(str(t)) for t in targets) if m}))


def flag_threads(flags):
    """nvcc's --threads from an extension's recorded flags (--threads=8, --threads 8, -t8, -t 8)."""
    flags = [str(f) for f in flags]
    for i, f in enumerate(flags):
        m = re.fullmatch(r"(?:--threads|-t)=?(\d+)", f)
        value = m.group(1) if m else (flags[i + 1] if f in ("--threads", "-t") and i + 1 < len(flags) else None)
        if value is not None and str(value).isdigit():
            return int(value) if int(value) > 0 else None  # --threads 0: as many as nvcc likes
    return None


def split_extensions(total_jobs, ext_max):
    """Share ``total_jobs`` compile jobs between extensions a package builds side by side
    (SageAttention's EXT_PARALLEL): up to ``ext_max`` extensions at once, each with MAX_JOBS jobs, so
    that EXT_PARALLEL x MAX_JOBS never exceeds the budget. Returns (ext_parallel, max_jobs per extension)."""
    parallel = max(1, min(ext_max, total_jobs))
    return parallel, max(1, total_jobs // parallel)


def peak_estimate(extensions, total_jobs, nvcc_threads, per_thread_gb, ext_max=0, host_gb=NVCC_HOST_GB):
    """The peak RAM of a build whose gencode audit found ``extensions`` (dicts: "chains" per CUDA
    source, "threads" its flags fix or None, "gb" the recipe's GB per thread per source or None),
    with MAX_JOBS ``total_jobs`` (the whole budget, split between EXT_PARALLEL extensions when the
    recipe builds ``ext_max`` > 0 at once; else setuptools builds them one after another).
    Returns (GB, nvcc at once, busy threads).

    Each extension runs min(its jobs, its CUDA sources) nvcc at once, the heaviest sources first;
    each nvcc takes ``host_gb`` plus, per busy thread (min(--threads, its chains)), the source's own
    figure where the recipe names one, else ``per_thread_gb``. Upper-bound-minded: all of them are
    assumed at their peak together."""
    def one(ext, jobs_each):
        threads = max(1, int(ext.get("threads") or nvcc_threads))
        figures = ext.get("gb") or []
        each = []
        for i, c in enumerate(ext["chains"]):
            figure = figures[i] if i < len(figures) and figures[i] is not None else per_thread_gb
            each.append((host_gb + min(threads, int(c)) * float(figure), min(threads, int(c))))
        each = sorted(each, reverse=True)[:max(1, jobs_each)]
        return sum(gb for gb, _ in each), len(each), sum(busy for _, busy in each)

    exts = [e for e in extensions if e.get("chains")]
    if not exts:
        return 0.0, 0, 0
    if ext_max > 0:
        parallel, each = split_extensions(total_jobs, ext_max)
        loads = sorted((one(e, each) for e in exts), reverse=True)[:parallel]
        return sum(x[0] for x in loads), sum(x[1] for x in loads), sum(x[2] for x in loads)
    return max(one(e, max(1, total_jobs)) for e in exts)


def job_settings(per_thread_gb, default_threads, cpus, mem_gb, max_jobs=None, nvcc_threads=None, targets=0,
                 extensions=(), ext_max=0, host_gb=NVCC_HOST_GB):
    """MAX_JOBS and NVCC_THREADS for one build on ``cpus`` cores with ``mem_gb`` GB to plan for.

    ``targets`` is how many -gencode targets (SASS + PTX) each nvcc call compiles: nvcc --threads
    works on those in parallel, so a job never runs more busy threads than that. A machine with
    little RAM gets fewer threads (down to one) and one job rather than an OOM kill; an explicit
    value always wins. With the audit's load (``extensions``, as peak_estimate takes them, each nvcc
    with ``host_gb`` of host part): the most jobs, one per core at most, whose estimated peak fits.
    Returns (max_jobs, nvcc_threads, peak GB, (GB, nvcc, busy) from the audit or None)."""
    cpus = max(1, int(cpus))
    mem = max(0.5, float(mem_gb))
    threads = nvcc_threads or default_threads
    if nvcc_threads is None and mem < per_thread_gb * threads:
        threads = max(1, int(mem // per_thread_gb))
    if extensions:
        def peak(j):
            return peak_estimate(extensions, j, threads, per_thread_gb, ext_max, host_gb)
        jobs = max_jobs or next((j for j in range(cpus, 0, -1) if peak(j)[0] <= mem), 1)
        est = peak(jobs)
        return jobs, threads, est[0], est
    busy = min(threads, targets) if targets > 0 else threads
    jobs = max_jobs or max(1, min(cpus, int(mem // (per_thread_gb * busy))))
    return jobs, threads, jobs * busy * per_thread_gb, None


def path_with_venv(path, py):
    """PATH with the bin/ of ``py``'s venv in front (pyvenv.cfg beside that bin/), as `activate` does; PATH as
    it is for a Python that is no venv's or a venv already on PATH (an image's builder venv). A native build
    (``--python-exe VENV/bin/python``) then runs the tools pip installed in that venv (a recipe's
    cmake>=3.26, ninja), not the system's (Debian bookworm's CMake 3.25 cannot compile CUDA as C++20)."""
    if not py:
        return path
    folder = os.path.dirname(os.path.abspath(py))  # not realpath: a venv's python links to its base's
    if not os.path.isfile(os.path.join(os.path.dirname(folder), "pyvenv.cfg")):
        return path
    if any(os.path.abspath(p) == folder for p in path.split(os.pathsep) if p):
        return path
    return folder + os.pathsep + path if path else folder
