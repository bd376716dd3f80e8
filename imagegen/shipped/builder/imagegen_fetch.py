#!/usr/bin/env python3
"""imagegen's fetch step: the pinned source of a recipe (a git checkout at its commit, or an sdist checked
against its sha256) with the recipe's patches, and the copy a build compiles (a local tree's copy patched).

Shipped beside imagegen_build.py (its `fetch` sub-command, and the copy `build` and `audit` make), under the
same rules: the standard library only, Python 3.8+, copied verbatim into every builder image and native
build. Every git call on a tree runs with none of the tree's own commands (imagegen_wheeltools.git_cmd);
credentials come only from the mounted netrc secret.
"""

import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import imagegen_sdist as sdist  # noqa: E402
import imagegen_wheeltools as wheeltools  # noqa: E402
from imagegen_toolchain import fail, log, run, secret_env  # noqa: E402




def cmd_fetch(cell, args):
    env = secret_env(os.environ)
    src = cell["source"]
    dest = cell["src_dir"]
    if src["kind"] == "git":
        # Every git call: none of the tree's own commands (hooks, fsmonitor, filters) run
        # (imagegen_wheeltools.git_cmd); the netrc secret, if mounted, is what git's HTTP reads.
        env = git_fetch_env(env, dest)

        def head():
            try:
                return git_output(dest, ["rev-parse", "HEAD"], env)
            except subprocess.CalledProcessError:
                return None

        wheeltools.fetch_git(src, dest, git=lambda args, reading=True: git_cmd(dest, args, env, reading=reading),
                             run=lambda cmd, check=True: run(cmd, env=env, check=check), head=head, fail=fail, log=log,
                             fetch=lambda cmd: run_said(cmd, env),
                             fetch_failed=lambda rc, said: fetch_failure(src, env, rc, said))
    elif src["kind"] == "sdist":
        sdist.fetch_sdist(src, cell.get("distribution") or cell["recipe"], dest, env, log, fail)
    elif not os.path.isdir(dest):
        fail("local source expected at %s" % dest)
    patches = cell.get("patches", [])
    if getattr(args, "source_only", False) and not patches_the_copy(cell):
        return  # a Dockerfile applies each patch in a step of its own (imagegen_build.py patch NAME)
    if patches_the_copy(cell):  # each build's (or audit's) copy gets them: copy_source
        if patches:
            log(wheeltools.patches_left_to_the_copy(patches, dest))
        return
    for patch in patches:
        apply_patch(patch, dest)


def patches_the_copy(cell):
    """Whether the recipe's patches go into each build's copy rather than into the source folder: a
    local tree is the user's, and so is a native build's source folder (--src-dir: a checkout the
    planner reads again, where a patch written by an earlier run would make the pinned commit look
    like a changed tree; a native build's own work/src likewise stays the pinned tree). In an image
    the fetched tree is the build's own and is patched where it lies."""
    return cell["source"]["kind"] == "local" or bool(cell.get("patch_copy"))


MAX_SAID_BYTES = 1 << 16  # what run_said keeps of a command's stderr (all of it still reaches the log)


def run_said(cmd, env):
    """Run ``cmd`` as run() does, its stderr passed on to the log as it comes and kept (the last
    MAX_SAID_BYTES): (exit status, that text)."""
    log("$ " + " ".join(cmd))
    try:
        proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
    except OSError as exc:
        return 127, str(exc)
    kept = b""
    for line in proc.stderr:
        sys.stderr.buffer.write(line)
        sys.stderr.flush()
        kept = (kept + line)[-MAX_SAID_BYTES:]
    return proc.wait(), kept.decode("utf-8", "replace")


def fetch_failure(src, env, rc, said=""):
    """Why a git fetch failed, in one line: a host that cannot be reached (DNS, a refused or timed-out
    connection) is the network's; otherwise an http(s) repository gets credentials only from the netrc
    secret (imagegen build --netrc FILE), none from the host it was planned on."""
    from urllib.parse import urlsplit

    what = "cannot fetch %s from %s (git exit %d)" % (src["ref"], src["url"], rc)
    host = urlsplit(src["url"]).hostname if "://" in src["url"] else src["url"].partition("@")[2].partition(":")[0]
    host = host or "HOST"
    if wheeltools.unreachable(said):
        return what + ": " + wheeltools.cannot_reach(host, said)
    if not src["url"].startswith(("https://", "http://")):
        return what
    # Refused outright (401/403, git would have prompted): credentials; else (a 404...) maybe a private one.
    lead = "%s wants credentials" % host if wheeltools.auth_refused(said) else "if it is private"
    if env.get("NETRC") and os.path.isfile(env["NETRC"]):
        return what + ": %s, the netrc secret has no working entry for %s" % (lead, host)
    return (what + ": %s, the build has no credential for it: give imagegen build --netrc FILE"
            " (machine %s login USER password TOKEN)" % (lead, host))


def git_fetch_env(env, dest):
    """imagegen_wheeltools.git_env for ``dest``, and git's HTTP pointed at the netrc secret when one is
    mounted (git reads $HOME/.netrc only: HOME becomes a folder outside the source holding a link to
    the secret, removed when the step ends; the link itself holds no secret)."""
    env = wheeltools.git_env(dest, env)
    if env.get("NETRC") and os.path.isfile(env["NETRC"]):
        import atexit
        home = tempfile.mkdtemp(prefix="imagegen-git-home-")
        atexit.register(shutil.rmtree, home, True)
        os.symlink(env["NETRC"], os.path.join(home, ".netrc"))
        env["HOME"] = home
    return env


def git_cmd(dest, args, env, reading=True):
    """imagegen_wheeltools.git_cmd, failing the step for a tree git cannot be run on safely."""
    try:
        return wheeltools.git_cmd(dest, args, env=env, reading=reading)
    except wheeltools.UnsafeTree as exc:
        fail("%s: %s" % (dest, exc))


def git_output(dest, args, env):
    return subprocess.check_output(git_cmd(dest, args, env), env=env, stdin=subprocess.DEVNULL).decode().strip()


def copy_source(cell, work):
    """The tree a build (or an audit) compiles: a copy of the source in ``work/src``, so the pinned
    tree stays pristine and a rebuild with other archs starts clean. Where fetch leaves the source
    folder unpatched (patches_the_copy: a local tree, a native build's folder) the copy gets the
    recipe's patches here: a tree built without them is the bug the patch fixes (SageAttention 2.2.0
    built natively from a local v2.2.0 tree without its sm90 patch compiled, then returned cosine
    0.0002 against SDPA on the H100). Returns the folder to build in (the source's subdir)."""
    src = os.path.join(work, "src")
    shutil.copytree(cell["src_dir"], src, symlinks=True)
    if patches_the_copy(cell):
        for patch in cell.get("patches", []):
            apply_patch(patch, src)
    return os.path.join(src, cell["source"].get("subdir") or "")


def apply_patch(patch, dest):
    """Apply a recipe patch once (imagegen_wheeltools.apply_patch): a tree that already carries it
    (upstream took the fix; a folder an earlier imagegen patched in place) is left alone, one it fits
    neither way is refused."""
    wheeltools.apply_patch(patch, dest, log, fail, "the patch is broken for this version (its recipe's by_version"
                           " range may hold a version it was not written for)")
