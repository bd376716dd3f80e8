"""A recipe's pinned sdist: downloaded (a package index the build is given first, then the recipe's URL),
checked against its sha256 and unpacked into the source folder, nothing outside it.

One implementation for the Linux build's fetch step (imagegen_fetch.py, in every builder image and native
build) and the Windows helper (imagegen_windows.py, written beside it by the rendered script): the standard
library only, Python 3.8+, ASCII only. The callers pass their own ``log`` and ``fail`` (``fail`` never
returns: the build exits, the helper raises).
"""

import os
import re

import imagegen_wheeltools as wheeltools

SDIST_MARKER = ".imagegen-sdist"  # in an unpacked sdist: the sha256 of the archive it came from
MAX_SDIST_BYTES = 1 << 30  # the largest CUDA-extension sdists are tens of MB; more is not an sdist
MAX_UNPACKED_BYTES = 8 << 30  # what its members may add up to once unpacked (a compressed bomb is refused)
MAX_MEMBERS = 200000
# The whole of one download, connect to last byte: a server that stalls or sends a byte a second fails
# the download in this time, not a socket timeout's per read (the sdist's tens of MB take seconds).
DOWNLOAD_DEADLINE_S = 600
PAGE_DEADLINE_S = 120  # a mirror's project page


def fetch_sdist(src, project, dest, env, log, fail):
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
    for url in sdist_urls(src["url"], filename, project, env, log):
        try:
            data = download(url, env)
        except Exception as exc:  # every way a download fails: said, then the next place is tried
            errors.append("%s: %s" % (url.split("@")[-1], download_failure(url, exc, env)))
            continue
        digest = hashlib.sha256(data).hexdigest()
        if digest != src["sha256"]:
            fail("%s from %s has sha256 %s, not the pinned %s: refusing it (a changed upload, or a proxy"
                 " answering for the host)" % (filename, url.split("@")[-1], digest, src["sha256"]))
        log("downloaded %s (%d bytes, sha256 ok) from %s" % (filename, len(data), url.split("@")[-1]))
        unpack_sdist(data, filename, dest, fail)
        with open(marker, "w", encoding="utf-8") as fh:
            fh.write(src["sha256"] + "\n")
        return
    fail("cannot download %s: %s" % (filename, "; ".join(errors)[-600:]))


def sdist_urls(url, filename, project, env, log):
    """Where to get ``filename``: the configured index's project page first (a mirror the user
    set up for a reason), then the recipe's URL."""
    index = (env.get("PIP_INDEX_URL") or "").strip()
    urls = []
    if index and "pypi.org/simple" not in index:
        page_url = index.rstrip("/") + "/" + wheeltools.project_name(project) + "/"
        try:
            page = download(page_url, env, limit=16 << 20, deadline_s=PAGE_DEADLINE_S).decode("utf-8", "replace")
            for href in re.findall(r'href=["\']([^"\']+)["\']', page):
                target = href.split("#", 1)[0]
                if target.rsplit("/", 1)[-1] == filename:
                    from urllib.parse import urljoin
                    link = urljoin(page_url, target.replace("&amp;", "&"))
                    why = not_followed(link, page_url)
                    if why:  # file://, ftp://, plain http elsewhere: never opened (a FIFO there would hang the build)
                        log("the package index's link to %s is not followed (%s): using %s" % (
                            filename, why, url.split("@")[-1]))
                    else:
                        urls.append(link)
                    break
        except Exception as exc:
            log("the package index has no page for %s (%s): using %s" % (project, exc, url.split("@")[-1]))
    urls.append(url)
    return urls


def download_failure(url, exc, env):
    """Why downloading ``url`` failed, in words that name the fix: a host not reached (DNS, a refused
    or timed-out connection) is the network's; an HTTP 401/403 wants credentials (the netrc secret,
    or user:password in a private index's URL); anything else as Python said it."""
    from urllib.parse import urlsplit

    host = urlsplit(url).hostname or "HOST"
    code = getattr(exc, "code", None)
    if code in (401, 403):
        had = bool(urlsplit(url).username is not None or (env.get("NETRC") and os.path.isfile(env["NETRC"])))
        return ("HTTP %d: %s wants credentials%s: give imagegen build --netrc FILE (machine %s login USER"
                " password TOKEN), or a private index's user:password in its URL"
                % (code, host, ", and the ones given were refused" if had else "", host))
    said = "%s %s" % (exc, getattr(exc, "reason", "") or "")
    if code is None and wheeltools.unreachable(said):
        return wheeltools.cannot_reach(host, str(getattr(exc, "reason", None) or exc))
    return str(exc)


def _loopback(host):
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def not_followed(url, origin):
    """Why a link (on a mirror's page, or a redirect) from ``origin`` is not followed, '' when it is:
    https:// only, plain http:// to loopback or to the origin's own http host and port (a LAN mirror's
    relative links); never file://, ftp:// or any other scheme (a local file, a FIFO, a device)."""
    from urllib.parse import urlsplit

    parts, start = urlsplit(url), urlsplit(origin)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        return "only https:// links are followed, not %s://" % (scheme or "a scheme-less")
    if not parts.hostname:
        return "no host"
    if scheme == "https":
        return ""
    if scheme == "http" and (_loopback(parts.hostname) or (start.scheme.lower() == "http" and (
            parts.hostname, parts.port) == (start.hostname, start.port))):
        return ""
    return "only https:// links are followed (plain http:// to loopback or the page's own host)"


def download(url, env, limit=MAX_SDIST_BYTES, deadline_s=None):
    """The body of ``url`` (at most ``limit`` bytes, all of it within ``deadline_s`` seconds: else
    TimeoutError), with the CA bundle the build was given and the user:password of the URL, if any,
    as basic auth (a private index). http:// and https:// only; a redirect goes where a link may
    (``not_followed``), without the credential when it leaves the host."""
    import threading
    import time
    from urllib.parse import urlsplit

    deadline_s = deadline_s or DOWNLOAD_DEADLINE_S
    if urlsplit(url).scheme.lower() not in ("http", "https") or not urlsplit(url).hostname:
        raise ValueError("not an http:// or https:// URL")
    sockets, result = [], {}
    end = time.monotonic() + deadline_s

    def work():
        try:
            result["data"] = _download(url, env, limit, end, sockets, deadline_s)
        except BaseException as exc:  # handed to the caller below
            result["error"] = exc

    worker = threading.Thread(target=work, name="imagegen-download", daemon=True)
    worker.start()
    worker.join(deadline_s + 1)
    if worker.is_alive():
        for sock in list(sockets):  # unblock the worker's read: it ends instead of waiting on the server
            try:
                sock.shutdown(2)
            except OSError:
                pass
        raise TimeoutError(_late(deadline_s))
    if "error" in result:
        raise result["error"]
    return result["data"]


def _late(deadline_s):
    return "no whole answer within %d s (the server stalls or trickles)" % deadline_s


def _download(url, env, limit, end, sockets, deadline_s):
    import base64
    import http.client
    import ssl
    import time
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

    def kept(cls):
        class Kept(cls):
            def connect(self):
                cls.connect(self)
                sockets.append(self.sock)
        return Kept

    class Http(urllib.request.HTTPHandler):
        def http_open(self, req):
            return self.do_open(kept(http.client.HTTPConnection), req)

    class Https(urllib.request.HTTPSHandler):
        def https_open(self, req):
            return self.do_open(kept(http.client.HTTPSConnection), req, context=context)

    class Redirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, req, fp, code, msg, hdrs, newurl):
            why = not_followed(newurl, req.full_url)
            if why:
                raise urllib.error.HTTPError(newurl, code, "redirect not followed: %s" % why, hdrs, fp)
            new = urllib.request.HTTPRedirectHandler.redirect_request(self, req, fp, code, msg, hdrs, newurl)
            if new is not None and urlsplit(newurl).netloc != urlsplit(req.full_url).netloc:
                for name in ("Authorization", "authorization"):  # the credential stays with its host
                    new.headers.pop(name, None)
                    new.unredirected_hdrs.pop(name, None)
            return new

    import urllib.error

    # no FileHandler, FTPHandler or DataHandler: only http and https are ever opened
    opener = urllib.request.OpenerDirector()
    for handler in (urllib.request.ProxyHandler(), urllib.request.UnknownHandler(), Http(), Https(),
                    urllib.request.HTTPDefaultErrorHandler(), Redirect(), urllib.request.HTTPErrorProcessor()):
        opener.add_handler(handler)
    request = urllib.request.Request(url, headers=headers)
    timeout = max(1.0, min(120.0, end - time.monotonic()))
    chunks, size = [], 0
    with opener.open(request, timeout=timeout) as resp:
        while True:
            if time.monotonic() > end:
                raise TimeoutError(_late(deadline_s))
            chunk = resp.read1(1 << 16) if hasattr(resp, "read1") else resp.read(1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise ValueError("larger than %d bytes" % limit)
    return b"".join(chunks)


def unpack_sdist(data, filename, dest, fail):
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
                infos = zf.infolist()
                _bounded(filename, len(infos), sum(i.file_size for i in infos), fail)
                for info in infos:
                    _safe_member(info.filename, filename, fail)
                    if (info.external_attr >> 16) & 0o170000 == 0o120000:
                        fail("%s: %s is a symlink: an sdist is refused when it holds links" % (filename, info.filename))
                zf.extractall(tmp)
        else:
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tf:
                members = tf.getmembers()
                _bounded(filename, len(members), sum(m.size for m in members), fail)
                for m in members:
                    _safe_member(m.name, filename, fail)
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


def _bounded(archive, members, size, fail):
    if members > MAX_MEMBERS or size > MAX_UNPACKED_BYTES:
        fail("%s: %d members, %d bytes once unpacked: more than an sdist holds (at most %d members, %d bytes):"
             " refused" % (archive, members, size, MAX_MEMBERS, MAX_UNPACKED_BYTES))


def _safe_member(name, archive, fail):
    parts = name.replace("\\", "/").split("/")
    if name.startswith(("/", "\\")) or ".." in parts or (len(name) > 1 and name[1] == ":"):
        fail("%s: member %r would land outside the source folder: refused" % (archive, name[:200]))
