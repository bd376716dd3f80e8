#!/usr/bin/env python3
"""imagegen's fetch step: the pinned source of a recipe (a git checkout at its commit, or an sdist checked
against its sha256) with the recipe's patches, and the copy a build compiles (a local tree's copy patched).

Shipped beside imagegen_build.py (its `fetch` sub-command, and the copy `build` and `audit` make), under the
same rules: the standard library only, Python 3.8+, copied verbatim into every builder image and native
build. Every git call on a tree runs with none of the tree's own commands (imagegen_wheeltools.git_cmd);
credentials come only from the mounted netrc secret.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
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
                             fetch_failed=lambda rc: fetch_failure(src, env, rc))
    elif src["kind"] == "sdist":
        fetch_sdist(src, cell.get("distribution") or cell["recipe"], dest, env)
    elif not os.path.isdir(dest):
        fail("local source expected at %s" % dest)
    patches = cell.get("patches", [])
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


def fetch_failure(src, env, rc):
    """Why a git fetch failed, in one line: an http(s) repository gets credentials only from the netrc
    secret (imagegen build --netrc FILE), none from the host it was planned on."""
    from urllib.parse import urlsplit

    what = "cannot fetch %s from %s (git exit %d)" % (src["ref"], src["url"], rc)
    if not src["url"].startswith(("https://", "http://")):
        return what
    host = urlsplit(src["url"]).hostname or "HOST"
    if env.get("NETRC") and os.path.isfile(env["NETRC"]):
        return what + ": if it is private, the netrc secret has no working entry for %s" % host
    return (what + ": if it is private, the build has no credential for it: give imagegen build --netrc FILE"
            " (machine %s login USER password TOKEN)" % host)


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


SDIST_MARKER = ".imagegen-sdist"  # in an unpacked sdist: the sha256 of the archive it came from
MAX_SDIST_BYTES = 1 << 30  # the largest CUDA-extension sdists are tens of MB; more is not an sdist


def fetch_sdist(src, project, dest, env):
    """Download the pinned sdist (through the package index the build is given, PIP_INDEX_URL, when
    it serves the file: a PyPI mirror; else from the recipe's URL), check its sha256 and unpack it
    into ``dest`` (nothing outside it: no absolute names, no `..`, no links out, no devices)."""
    import hashlib

    marker = os.path.join(dest, SDIST_MARKER)
    if os.path.isfile(marker):
        with open(marker, encoding="utf-8") as fh:
            if fh.read().strip() == src["sha256"]:
                log("source already present at %s (%s, sha256 %s)" % (dest, src["ref"], src["sha256"][:12]))
                return
    if os.path.isdir(dest) and os.listdir(dest):
        fail("%s already holds another source tree: remove it (or give another work folder) to unpack %s"
             % (dest, src["ref"]))
    filename = src["ref"]
    errors = []
    for url in sdist_urls(src["url"], filename, project, env):
        try:
            data = download(url, env)
        except Exception as exc:  # every way a download fails: said, then the next place is tried
            errors.append("%s: %s" % (url.split("@")[-1], exc))
            continue
        digest = hashlib.sha256(data).hexdigest()
        if digest != src["sha256"]:
            fail("%s from %s has sha256 %s, not the pinned %s: refusing it (a changed upload, or a proxy"
                 " answering for the host)" % (filename, url.split("@")[-1], digest, src["sha256"]))
        log("downloaded %s (%d bytes, sha256 ok) from %s" % (filename, len(data), url.split("@")[-1]))
        unpack_sdist(data, filename, dest)
        with open(marker, "w", encoding="utf-8") as fh:
            fh.write(src["sha256"] + "\n")
        return
    fail("cannot download %s: %s" % (filename, "; ".join(errors)[-600:]))


def sdist_urls(url, filename, project, env):
    """Where to get ``filename``: the configured index's project page first (a mirror the user
    set up for a reason), then the recipe's URL."""
    index = (env.get("PIP_INDEX_URL") or "").strip()
    urls = []
    if index and "pypi.org/simple" not in index:
        page_url = index.rstrip("/") + "/" + wheeltools.project_name(project) + "/"
        try:
            page = download(page_url, env, limit=16 << 20).decode("utf-8", "replace")
            for href in re.findall(r'href=["\']([^"\']+)["\']', page):
                target = href.split("#", 1)[0]
                if target.rsplit("/", 1)[-1] == filename:
                    from urllib.parse import urljoin
                    urls.append(urljoin(page_url, target.replace("&amp;", "&")))
                    break
        except Exception as exc:
            log("the package index has no page for %s (%s): using %s" % (project, exc, url))
    urls.append(url)
    return urls


def download(url, env, limit=MAX_SDIST_BYTES):
    """The body of ``url`` (at most ``limit`` bytes), with the CA bundle the build was given and
    the user:password of the URL, if any, as basic auth (a private index)."""
    import base64
    import ssl
    import urllib.request
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    headers = {"User-Agent": "imagegen-build"}
    if parts.username is not None:
        cred = "%s:%s" % (parts.username, parts.password or "")
        headers["Authorization"] = "Basic " + base64.b64encode(cred.encode()).decode()
        host = parts.hostname + (":%d" % parts.port if parts.port else "")
        url = urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))
    elif env.get("NETRC") and os.path.isfile(env["NETRC"]):  # the netrc secret, as pip and git use it
        import netrc
        try:
            found = netrc.netrc(env["NETRC"]).authenticators(parts.hostname or "")
        except (netrc.NetrcParseError, OSError):
            found = None
        if found:
            cred = "%s:%s" % (found[0] or "", found[2] or "")
            headers["Authorization"] = "Basic " + base64.b64encode(cred.encode()).decode()
    cafile = env.get("PIP_CERT") or env.get("SSL_CERT_FILE")
    context = ssl.create_default_context(cafile=cafile if cafile and os.path.isfile(cafile) else None)
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=120, context=context) as resp:
        data = resp.read(limit + 1)
    if len(data) > limit:
        raise ValueError("larger than %d bytes" % limit)
    return data


def unpack_sdist(data, filename, dest):
    """Unpack the archive into ``dest``, dropping its one top-level folder (name-version/)."""
    import io
    import shutil
    import tarfile
    import tempfile
    import zipfile

    parent = os.path.dirname(os.path.abspath(dest))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".sdist-", dir=parent)
    try:
        if filename.endswith(".zip"):
            with zipfile.ZipFile(io.BytesIO(data)) as zf:
                for info in zf.infolist():
                    _safe_member(info.filename, filename)
                    if (info.external_attr >> 16) & 0o170000 == 0o120000:
                        fail("%s: %s is a symlink: an sdist is refused when it holds links" % (filename, info.filename))
                zf.extractall(tmp)
        else:
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tf:
                members = tf.getmembers()
                for m in members:
                    _safe_member(m.name, filename)
                    if not (m.isfile() or m.isdir()):
                        fail("%s: %s is not a plain file or folder (a link or device): refused" % (filename, m.name))
                if hasattr(tarfile, "data_filter"):
                    tf.extractall(tmp, members=members, filter="data")
                else:
                    tf.extractall(tmp, members=members)
        entries = os.listdir(tmp)
        top = os.path.join(tmp, entries[0]) if len(entries) == 1 and os.path.isdir(os.path.join(tmp, entries[0])) else tmp
        if os.path.isdir(dest):
            os.rmdir(dest)  # empty: checked by the caller
        shutil.move(top, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _safe_member(name, archive):
    parts = name.replace("\\", "/").split("/")
    if name.startswith(("/", "\\")) or ".." in parts or (len(name) > 1 and name[1] == ":"):
        fail("%s: member %r would land outside the source folder: refused" % (archive, name[:200]))


def apply_patch(patch, dest):
    """Apply a recipe patch once (imagegen_wheeltools.apply_patch): a tree that already carries it
    (upstream took the fix; a folder an earlier imagegen patched in place) is left alone, one it fits
    neither way is refused."""
    wheeltools.apply_patch(patch, dest, log, fail, "the patch is broken for this version (its recipe's by_version"
                           " range may hold a version it was not written for)")
