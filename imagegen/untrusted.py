"""Reading untrusted data: every read bounded in size, depth, time and kind of file.

One place for the readers of data imagegen did not make and cannot trust: a wheelhouse's manifests and
build records (a folder may come from anywhere), a PyPI-compatible index's answers (``refresh
--index-url``), and wheels and their members (``verify``, ``check``, the import test). Each reader
refuses, with an :class:`~imagegen.errors.Unreadable` (a few words saying why; the caller names the
file or URL and raises its own typed error), what it will not read:

- files: regular files only, never blocking on a FIFO or device (``safety.read_regular_file``), at
  most a size the caller gives;
- JSON: at most ``MAX_JSON_DEPTH`` levels of nesting, checked by a scan before anything parses or
  walks the document (a 200 000-deep document would otherwise crash the parser or the code after it);
- HTTP: http(s) URLs only, also after a redirect (at most ``MAX_REDIRECTS``); at most ``limit`` bytes
  of an answer; and a total deadline for a whole series of requests (:class:`Deadline`), enforced by
  shutting the connection's socket down when it passes, so a server dripping one byte at a time, in
  its headers or its body, cannot outlast it (a socket timeout is only per read);
- zip members: a member is read, or a wheel unpacked, only within ``MAX_MEMBER_BYTES`` per member,
  ``MAX_UNPACKED_BYTES`` in all, ``MAX_RATIO`` of compression for a large member (a zip bomb's
  signature), the free space of the folder it goes to; the bytes are counted as they inflate, never
  trusting the sizes the zip declares.

docs/security.md ("Untrusted servers and files: every read bounded") says what is promised and how
it is tested.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import shutil
import socket
import stat
import threading
import time
import urllib.error
import urllib.request
import zipfile
import zlib
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urljoin, urlsplit

from imagegen.errors import HTTPStatusError, Unreachable, Unreadable
from imagegen.safety import read_regular_file

# ------------------------------------------------------------------------------------------------
# JSON

# imagegen's own documents (manifests, build records, PEP 691 pages) nest 5 levels at most.
MAX_JSON_DEPTH = 64
_JSON_TOKENS_B = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')
_JSON_TOKENS_S = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')


def json_depth(data: bytes | str, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Raise Unreadable when the JSON text ``data`` nests arrays/objects deeper than ``max_depth``
    (strings skipped, so brackets inside them do not count): checked before parsing."""
    tokens = _JSON_TOKENS_B if isinstance(data, (bytes, bytearray)) else _JSON_TOKENS_S
    depth = 0
    for m in tokens.finditer(data):
        c = m.group()[:1]
        if c in (b"[", b"{", "[", "{"):
            depth += 1
            if depth > max_depth:
                raise Unreadable(f"JSON nested deeper than {max_depth} levels")
        elif c in (b"]", b"}", "]", "}"):
            depth -= 1


def loads_json(data: bytes | str, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``data`` parsed as JSON, nested at most ``max_depth`` levels; Unreadable says why not."""
    json_depth(data, max_depth)
    try:
        return json.loads(data)
    except (ValueError, TypeError, RecursionError, MemoryError) as exc:  # UnicodeDecodeError is a ValueError
        raise Unreadable(f"not JSON ({exc.__class__.__name__}: {str(exc)[:120]})") from None


def read_json_file(path: Path, *, limit: int, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """The JSON document in ``path``: a regular file (no FIFO, device or directory; a symlink is
    followed to a regular file only) of at most ``limit`` bytes, nested at most ``max_depth`` levels."""
    return loads_json(read_regular_file(path, limit=limit), max_depth=max_depth)


# ------------------------------------------------------------------------------------------------
# HTTP

MAX_REDIRECTS = 5
HTTP_SCHEMES = ("http", "https")


class Deadline:
    """A total time limit for a series of HTTP requests (all the requests of one `imagegen
    refresh`): each request gets what is left, whatever the server does."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def expired_message(self) -> str:
        return (f"no complete answer within the {self.seconds:g} s all requests may take"
                " (a stalled or dripping server?)")


class _Watch:
    """Shuts down every socket of one request when the deadline passes: a read blocked on a dripping
    server then returns at once (a socket timeout would restart with every byte)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.lock = threading.Lock()
        self.socks: list[tuple[socket.socket, int]] = []
        self.expired = False
        self.timer = threading.Timer(max(seconds, 0.0), self.expire)
        self.timer.daemon = True
        self.timer.start()

    def add(self, sock: socket.socket) -> socket.socket:
        with self.lock:
            self.socks.append((sock, sock.fileno()))
            if self.expired:
                _shutdown(sock, sock.fileno())
        return sock

    def expire(self) -> None:
        with self.lock:
            self.expired = True
            for sock, fd in self.socks:
                _shutdown(sock, fd)

    def cancel(self) -> None:
        self.timer.cancel()


def _shutdown(sock: socket.socket, fd: int) -> None:
    """Shut ``sock`` down; when TLS took it over (wrap_socket detaches the plain socket: its fileno is -1
    then), the connection is shut down through its descriptor ``fd``, which the TLS socket now holds."""
    try:
        if sock.fileno() != -1:
            sock.shutdown(socket.SHUT_RDWR)
            return
    except OSError:
        return
    try:
        if fd >= 0 and stat.S_ISSOCK(os.fstat(fd).st_mode):
            dup = socket.socket(fileno=os.dup(fd))
            try:
                dup.shutdown(socket.SHUT_RDWR)
            finally:
                dup.close()
    except OSError:
        pass


@contextlib.contextmanager
def connections_within(seconds: float) -> Iterator[_Watch]:
    """Every connection this process opens inside the block, from any thread and through any HTTP client
    (requests and twine, httpx for huggingface_hub, botocore), is shut down when ``seconds`` have passed
    since the block began: a server that drips its answer, or never answers, cannot hold a publish
    longer than that (a client's socket timeout restarts with every byte). The returned watch says
    whether it expired: what the client made of its cut connections is then not trusted."""
    watch = _Watch(seconds)
    real = socket.socket.connect

    def connect(sock: socket.socket, address: Any) -> None:
        watch.add(sock)
        return real(sock, address)

    socket.socket.connect = connect  # type: ignore[method-assign]
    try:
        yield watch
    finally:
        socket.socket.connect = real  # type: ignore[method-assign]
        watch.cancel()


def _watched(base: type[http.client.HTTPConnection], watch: _Watch):
    def make(*args, **kwargs):
        conn = base(*args, **kwargs)
        create = conn._create_connection  # socket.create_connection: the raw socket, before any TLS
        conn._create_connection = lambda *a, **k: watch.add(create(*a, **k))
        return conn
    return make


class _HTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, watch: _Watch) -> None:
        super().__init__()
        self.watch = watch

    def http_open(self, req):
        return self.do_open(_watched(http.client.HTTPConnection, self.watch), req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, watch: _Watch) -> None:
        super().__init__()
        self.watch = watch

    def https_open(self, req):
        return self.do_open(_watched(http.client.HTTPSConnection, self.watch), req, context=self._context)


class _Redirects(urllib.request.HTTPRedirectHandler):
    max_redirections = MAX_REDIRECTS

    def __init__(self, within: str | None = None) -> None:
        super().__init__()
        self.within = within

    def http_error_302(self, req, fp, code, msg, headers):
        location = headers.get("location") or headers.get("uri")
        if location:
            target = urljoin(req.full_url, location)
            scheme = urlsplit(target).scheme.lower()
            if scheme not in HTTP_SCHEMES:
                fp.close()
                raise Unreadable(f"redirected to a {scheme} URL: only http(s) URLs are followed")
            if self.within is not None and not target.startswith(self.within):
                fp.close()  # before it is followed: nothing is asked of the other server
                raise Unreadable(f"redirected outside {self.within[:200]} (to {target[:200]}): not followed")
        return super().http_error_302(req, fp, code, msg, headers)

    http_error_301 = http_error_303 = http_error_307 = http_error_308 = http_error_302


def http_get(url: str, *, deadline: Deadline, limit: int, headers: dict[str, str] | None = None,
             within: str | None = None) -> tuple[bytes, str, int]:
    """GET ``url`` (http or https only): (body, the URL it came from after redirects, status). At most
    ``limit`` bytes, within what is left of ``deadline``; HTTPStatusError for an error status,
    Unreadable for anything else that goes wrong (unreachable, a redirect loop or to another scheme,
    too large, too slow). With ``within`` (a URL prefix), a redirect to a URL that does not start with it
    is an Unreadable and is not followed."""
    if urlsplit(url).scheme.lower() not in HTTP_SCHEMES:
        raise Unreadable("not an http(s) URL: only those are read from an index")
    left = deadline.left()
    if left <= 0:
        raise Unreadable(deadline.expired_message())
    watch = _Watch(left)
    opener = urllib.request.OpenerDirector()
    for handler in (urllib.request.ProxyHandler(), urllib.request.UnknownHandler(), _HTTPHandler(watch),
                    _HTTPSHandler(watch), urllib.request.HTTPDefaultErrorHandler(), _Redirects(within),
                    urllib.request.HTTPErrorProcessor()):
        opener.add_handler(handler)
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with opener.open(req, timeout=left) as resp:
            final, status = resp.geturl(), resp.status
            chunks, size = [], 0
            while size <= limit:
                chunk = resp.read(min(1 << 16, limit + 1 - size))
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
    except urllib.error.HTTPError as exc:
        exc.close()
        if watch.expired:
            raise Unreadable(deadline.expired_message()) from None
        if 300 <= exc.code < 400:
            raise Unreadable(f"more than {MAX_REDIRECTS} redirects (a redirect loop?)") from None
        raise HTTPStatusError(exc.code, f"HTTP {exc.code}") from None
    except Unreadable:
        raise
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
        if watch.expired:
            raise Unreadable(deadline.expired_message()) from None
        raise Unreachable(str(getattr(exc, "reason", None) or exc.__class__.__name__)[:200]) from None
    finally:
        watch.cancel()
    if watch.expired:
        raise Unreadable(deadline.expired_message())
    if size > limit:
        raise Unreadable(f"an answer larger than {_size(limit)}: refused")
    return b"".join(chunks), final, status


# ------------------------------------------------------------------------------------------------
# Zip members (wheels)

# A real wheel's largest member is a CUDA extension: flash-attn's is ~1-2 GiB, a fat build for every
# arch a little more. Beyond these a wheel is refused, not read.
MAX_MEMBER_BYTES = 4 << 30
MAX_UNPACKED_BYTES = 16 << 30
# Deflate compresses real extensions and Python files 2-10x, never near its ~1000x limit, which a run
# of zeros reaches: a member over RATIO_FROM bytes compressed more than MAX_RATIO times is a zip bomb.
MAX_RATIO = 100
RATIO_FROM = 16 << 20
_CHUNK = 1 << 20


def _size(n: int) -> str:
    return f"{n / (1 << 30):.3g} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.3g} MiB" if n >= 1 << 20 else f"{n} bytes"


def validate_member(info: zipfile.ZipInfo, *, limit: int = MAX_MEMBER_BYTES) -> None:
    """Unreadable when ``info`` declares more than ``limit`` bytes, or is a large member compressed
    beyond ``MAX_RATIO`` (what is read is counted as well: see read_member)."""
    if info.file_size > limit:
        raise Unreadable(f"{info.file_size} bytes uncompressed: larger than the {_size(limit)} a member may have")
    if info.file_size > RATIO_FROM and info.file_size > MAX_RATIO * max(info.compress_size, 1):
        raise Unreadable(f"{_size(info.file_size)} from {_size(info.compress_size)}: compressed over {MAX_RATIO}x,"
                         " a zip bomb")


def validate_zip(zf: zipfile.ZipFile, *, member_limit: int = MAX_MEMBER_BYTES,
                 total_limit: int = MAX_UNPACKED_BYTES) -> int:
    """Every member's declared size within bounds (validate_member) and all of them within
    ``total_limit``; returns the total. Unreadable names the first member refused."""
    total = 0
    for info in zf.infolist():
        try:
            validate_member(info, limit=member_limit)
        except Unreadable as exc:
            raise Unreadable(f"member {info.filename[:120]!r}: {exc}") from None
        total += info.file_size
    if total > total_limit:
        raise Unreadable(f"{_size(total)} unpacked, over the {_size(total_limit)} a wheel may have")
    return total


def copy_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, out, *, limit: int = MAX_MEMBER_BYTES) -> int:
    """Inflate one member into the binary file ``out``, counting: never more than it declares nor
    ``limit`` (a lying header is refused when the bytes pass it, not after). Returns the size."""
    validate_member(info, limit=limit)
    total = 0
    try:
        with zf.open(info) as src:
            while True:
                chunk = src.read(_CHUNK)
                if not chunk:
                    break
                total += len(chunk)
                if total > info.file_size or total > limit:
                    raise Unreadable(f"inflates past the {info.file_size} bytes it declares")
                out.write(chunk)
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError, ValueError) as exc:
        raise Unreadable(f"cannot be inflated ({exc.__class__.__name__})") from None
    return total


def read_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, *, limit: int) -> bytes:
    """One member's bytes, at most ``limit`` of them (refused past it: see copy_member)."""
    import io
    buf = io.BytesIO()
    copy_member(zf, info, buf, limit=limit)
    return buf.getvalue()


def _member_path(dest: Path, name: str) -> Path | None:
    """Where member ``name`` goes under ``dest``; None for a folder entry. Unreadable for a name that
    would leave ``dest`` (absolute, ``..``, a drive or a backslash)."""
    parts = name.split("/")
    if name.startswith("/") or "\\" in name or "\x00" in name or any(p in ("..",) for p in parts) \
            or re.match(r"[A-Za-z]:", name):
        raise Unreadable(f"member {name[:120]!r} would be written outside the folder it is unpacked into")
    parts = [p for p in parts if p not in ("", ".")]
    if not parts or name.endswith("/"):
        return None
    return dest.joinpath(*parts)


def extract_zip(wheel: Path, dest: Path, *, member_limit: int = MAX_MEMBER_BYTES,
                total_limit: int = MAX_UNPACKED_BYTES) -> None:
    """Unpack ``wheel`` into ``dest`` within the bounds (validate_zip, copy_member) and the free space
    of ``dest``'s file system (what it declares, plus a margin, must fit); Unreadable says why not.
    Nothing outside ``dest`` is written, no link is made."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            total = validate_zip(zf, member_limit=member_limit, total_limit=total_limit)
            dest.mkdir(parents=True, exist_ok=True)
            free = shutil.disk_usage(dest).free
            if total + (64 << 20) > free:
                raise Unreadable(f"it unpacks to {_size(total)}, and {dest.parent} has {_size(free)} free")
            written = 0
            for info in zf.infolist():
                target = _member_path(dest, info.filename)
                if target is None:
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                with open(target, "wb") as out:
                    written += copy_member(zf, info, out, limit=member_limit)
                if written > total_limit:
                    raise Unreadable(f"over the {_size(total_limit)} a wheel may have unpacked")
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError) as exc:
        raise Unreadable(f"not a readable wheel ({exc.__class__.__name__}: {str(exc)[:120]})") from None


__all__ = ["Deadline", "HTTPStatusError", "Unreachable", "copy_member", "extract_zip", "http_get", "json_depth",
           "loads_json", "read_json_file", "read_member", "validate_member", "validate_zip"]
