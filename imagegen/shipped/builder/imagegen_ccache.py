"""ccache for a build's compiles (nvcc and the host compiler), with the shared remote storage of
`imagegen build --compile-cache URL` when one is given, and the per-build report (ccache.json).

Shipped beside imagegen_build.py (standard library only, Python 3.8+)."""

import json
import os
import shutil

import imagegen_rules as rules
from imagegen_toolchain import SECRETS, log

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
    env.pop(rules.COMPILE_CACHE_VARIABLE, None)  # ccache reads CCACHE_REMOTE_STORAGE below; the compilers need neither
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



def compile_cache_remote():
    """The compile cache's remote storage URL as ccache takes it (its password percent-encoded): from
    its secret in an image, else (a native build) from the variable imagegen set for this script.
    Empty or absent: None. One ccache cannot take (a CI secret imagegen never checked): None, and a
    line in the log that shows it redacted."""
    try:
        with open(os.path.join(SECRETS, rules.COMPILE_CACHE_SECRET), encoding="utf-8") as fh:
            value = fh.read(1024).strip()
    except (OSError, ValueError):
        value = os.environ.get(rules.COMPILE_CACHE_VARIABLE, "").strip()
    if not value:
        return None
    try:
        url, _, note = rules.compile_cache_url(value)
    except ValueError as exc:
        log("compile cache %s not used: %s" % (rules.compile_cache_redacted(value), exc))
        return None
    if note:
        log("compile cache: %s" % note)
    return url


def remote_shown(url):
    """The remote storage for the log: scheme://host[:port][/path], never its user, password, query
    or fragment."""
    try:
        return rules.compile_cache_url(url)[1]
    except ValueError:
        return rules.compile_cache_redacted(url).split("***@")[-1]


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
