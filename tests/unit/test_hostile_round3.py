"""Hostile input, round 3: a shared compile cache's URL with any password ccache can take, and never a
byte of its credential in a log; the sdist fetch's overall deadline and the links it follows; a top-level
repository path; the layer scan under concurrent builds (docs/security.md)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import pytest

from imagegen.cli import main
from imagegen.commands.common import compile_cache
from imagegen.errors import UsageError
from imagegen.shipped.builder import imagegen_rules as rules
from tests.integration.redis_server import redis_server
from tests.unit.builder_script import CCACHE, builder_module

# --------------------------------------------------------------------------------------------
# 1. the compile cache's URL

# as `openssl rand -base64 32` writes them: '/', '+' and '=' (and, for good measure, an '@' and a ':')
B64 = "q0Zx/7mK+Tf3Lw9/Hb2RcYv8Ns+Pe1Ua4Gd6Jk5Ws0E="
HARD = "K9/p@ss:w+rd=="


@pytest.mark.parametrize("given, url, shown", [
    (f"redis://{B64}@127.0.0.1:6379", f"redis://{quote(B64, safe='+=')}@127.0.0.1:6379", "redis://127.0.0.1:6379"),
    # redis-py's form (an empty user): ccache would send no AUTH at all
    (f"redis://:{B64}@cache:6379/2", f"redis://{quote(B64, safe='+=')}@cache:6379/2", "redis://cache:6379/2"),
    # a second '@' and a ':' in the password: the userinfo ends at the LAST '@'; ccache would split a
    # lone password at its ':', so it goes as user 'default'
    (f"redis://:{HARD}@cache:6379", "redis://default:K9%2Fp%40ss%3Aw+rd==@cache:6379", "redis://cache:6379"),
    # (without the leading ':', the first ':' ends the user name, as in any URL)
    (f"redis://{HARD}@cache:6379", "redis://K9%2Fp%40ss:w+rd==@cache:6379", "redis://cache:6379"),
    (f"redis://alice:{HARD}@cache:6379", "redis://alice:K9%2Fp%40ss%3Aw+rd==@cache:6379", "redis://cache:6379"),
    # a fragment and a query are ccache's business, never the log's
    (f"redis://{B64}@cache:6379/0#s3cretfrag", f"redis://{quote(B64, safe='+=')}@cache:6379/0#s3cretfrag",
     "redis://cache:6379/0"),
    (f"http://u:{B64}@cache:8080/ccache?token=s3cretq", f"http://u:{quote(B64, safe='+=')}@cache:8080/ccache?token=s3cretq",
     "http://cache:8080/ccache"),
    ("redis://cache:6379", "redis://cache:6379", "redis://cache:6379"),
    ("redis://pw%2Fx@cache:6379", "redis://pw%2Fx@cache:6379", "redis://cache:6379"),  # encoded already: as it is
])
def test_a_compile_cache_url_with_any_password_ccache_can_take(given, url, shown):
    got, got_shown, note = rules.compile_cache_url(given)
    assert (got, got_shown) == (url, shown)
    assert bool(note) == (got != given)
    B = builder_module("imagegen_ccache_round3", CCACHE)
    assert B.remote_shown(got) == shown


@pytest.mark.parametrize("bad, reason", [
    (f"redis://{B64}@cache:6379/a b", "a space, quote, '|'"),
    (f"redis://{B64}@cache:6379/x'y", "a space, quote, '|'"),
    (f"{B64}@cache:6379", "not a redis:// or http:// URL"),  # no scheme
    (f"redis:/{B64}@cache:6379", "not a redis:// or http:// URL"),
    (f"ftp://u:{B64}@cache:21", "not a redis:// or http:// URL"),
    (f"redis://{B64}@cache:99999", "port 99999"),
    (f"redis://{B64}@cache:6379/db", "database number"),
    (f"redis://{B64}@", "no host"),
    (f"http://{B64}@cache:8080/x", "USER:PASSWORD"),
    (f"redis://{B64}@cache:6379\nx", "control character"),
])
def test_a_compile_cache_ccache_cannot_take_is_one_line_showing_it_redacted(bad, reason, capsys):
    with pytest.raises(UsageError) as info:
        compile_cache(bad)
    msg = str(info.value)
    assert msg.startswith("--compile-cache ") and reason in msg and "give redis://HOST:PORT" in msg, msg
    assert "\n" not in msg and ("***@" in msg or "@" not in bad), msg
    for piece in B64.split("/") + B64.split("+") + [quote(B64, safe="")]:
        assert piece not in msg, msg
    # the CLI: exit 2, the same line, no traceback
    assert main(["build", "flash-attn", "--torch", "2.8", "--cuda", "12.8", "--python", "3.12", "--arch", "9.0",
                 "--compile-cache", bad]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "--compile-cache" in err and not any(p in err for p in B64.split("/")), err


def test_a_compile_cache_password_is_encoded_for_the_user_and_said_so_in_one_line(capsys):
    assert compile_cache(f"redis://{B64}@127.0.0.1:6379") == f"redis://{quote(B64, safe='+=')}@127.0.0.1:6379"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "percent-encoded" in err and B64[:6] not in err


def _secret_pieces(password: str) -> list[str]:
    """Every run of 4+ characters of the password between its special characters, the password
    itself and its encoded form: none may show up anywhere."""
    import re
    return [password, quote(password, safe=""), quote(password, safe="+=")] + [
        p for p in re.split(r"[/+=@: ]", password) if len(p) >= 4]


@pytest.mark.parametrize("password, given", [
    (B64, lambda r: f"redis://{B64}@127.0.0.1:{r.port}"),          # the base64 password as is
    (B64, lambda r: f"redis://:{B64}@127.0.0.1:{r.port}/0"),       # redis-py's form, a database
    (HARD + " x|y", lambda r: f"redis://:{HARD} x|y@127.0.0.1:{r.port}#frag"),  # '@', ':', ' ', '|'
])
def test_a_real_ccache_shares_objects_through_a_real_redis_with_a_hard_password(tmp_path, monkeypatch, capfd,
                                                                               password, given):
    # The build step (imagegen_ccache.use_ccache, as a native build runs it: the URL in its variable)
    # hands ccache the URL; two compiles of one file from two empty local caches (two machines): the
    # first stores into Redis, the second is a remote hit. No byte of the password in any output, the
    # stats log, ccache's own debug log or the report.
    ccache = shutil.which("ccache")
    if ccache is None or shutil.which("gcc") is None:
        pytest.fail("ccache and gcc are required (scripts/test.sh installs Debian's ccache)")
    B = builder_module("imagegen_ccache_round3_real", CCACHE)
    monkeypatch.setattr(B, "SECRETS", str(tmp_path / "no-secrets"))
    (tmp_path / "a.c").write_text("int f(int x) { return x * 3 + 1; }\n")
    (tmp_path / "redis-dir").mkdir()
    with redis_server("127.0.0.1", tmp_path / "redis-dir", password=password) as redis:
        url = compile_cache(given(redis))
        monkeypatch.setenv(rules.COMPILE_CACHE_VARIABLE, given(redis))  # the build step encodes it again
        outputs = []
        for machine in ("one", "two"):
            work = tmp_path / machine
            work.mkdir()
            env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "CCACHE_DIR": str(work / "ccache"),
                   "CCACHE_LOGFILE": str(work / "ccache-debug.log")}
            (work / "ccache").mkdir()
            stats = B.use_ccache(env, str(work), sys.executable)
            assert stats and env["CCACHE_REMOTE_STORAGE"] == url
            proc = subprocess.run([ccache, "gcc", "-c", str(tmp_path / "a.c"), "-o", str(work / "a.o")], env=env,
                                  capture_output=True, text=True)
            assert proc.returncode == 0, proc.stderr
            B.report_ccache(stats, str(work))
            shown = subprocess.run([ccache, "--show-stats", "--verbose"], env=env, capture_output=True, text=True)
            outputs += [proc.stdout, proc.stderr, shown.stdout, shown.stderr]
            if machine == "one":
                assert redis.keys() >= 1  # stored through the password
        counts = (tmp_path / "two" / "ccache.json").read_text()
        assert '"remote_hits": 1' in counts and '"remote_errors": 0' in counts, counts
        assert '"remote_errors": 0' in (tmp_path / "one" / "ccache.json").read_text()
    logged = capfd.readouterr()
    assert f"remote storage redis://127.0.0.1:{redis.port}" in logged.out
    texts = [logged.out, logged.err, *outputs] + [p.read_text(errors="replace") for p in tmp_path.rglob("*")
                                                  if p.is_file() and p.suffix in (".log", ".json")]
    for piece in _secret_pieces(password):
        for i, text in enumerate(texts):
            assert piece not in text, (piece, i)
    assert "frag" not in logged.out


# --------------------------------------------------------------------------------------------
# 2. the sdist fetch: an overall deadline, and only https links (http to loopback) from a mirror's page

import http.server  # noqa: E402
import socket  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

from tests.unit.builder_script import BUILDER  # noqa: E402

SDIST = BUILDER / "imagegen_sdist.py"


class Trickle:
    """A real server on loopback that answers one byte a second: after its headers (``head``) or from
    its first byte on (the status line itself trickles)."""

    def __init__(self, head: bool):
        self.head, self.conns = head, []

    def __enter__(self) -> "Trickle":
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()
        return self

    def _serve(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn):
        head = b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n"
        try:
            conn.recv(65536)
            if self.head:
                conn.sendall(head)
                head = b""
            for byte in head + b"x" * 100000:
                if self.stop.is_set():
                    return
                conn.sendall(bytes([byte]) if isinstance(byte, int) else byte)
                time.sleep(1)
        except OSError:
            pass

    def __exit__(self, *exc):
        self.stop.set()
        self.sock.close()
        for c in self.conns:
            c.close()


class Failed(Exception):
    pass


def _fetch_in_process(tmp_path, url, env, deadline=None, monkeypatch=None):
    """The build's fetch_sdist itself (a fresh copy of the shipped module), its log and its one failure line."""
    mod = builder_module("imagegen_sdist_round3_%d" % time.monotonic_ns(), SDIST)
    if deadline:
        monkeypatch.setattr(mod, "DOWNLOAD_DEADLINE_S", deadline)
        monkeypatch.setattr(mod, "PAGE_DEADLINE_S", deadline)
    logged = []

    def fail(msg, code=1):
        raise Failed(msg)

    src = {"url": url, "ref": "demo-1.0.tar.gz", "sha256": "0" * 64}
    return mod, logged, lambda: mod.fetch_sdist(src, "Demo_Pkg", str(tmp_path / "src"), env, logged.append, fail)


@pytest.mark.parametrize("head", [True, False], ids=["the-body-trickles", "the-status-line-trickles"])
def test_a_server_that_sends_a_byte_a_second_fails_the_download_within_its_deadline(tmp_path, monkeypatch, head):
    with Trickle(head) as server:
        _, _, run = _fetch_in_process(tmp_path, server.url + "/demo-1.0.tar.gz", {}, deadline=3, monkeypatch=monkeypatch)
        started = time.monotonic()
        with pytest.raises(Failed) as info:
            run()
        took = time.monotonic() - started
    msg = str(info.value)
    assert took < 8, took  # 3 s and the watchdog's second, not 100000 s
    assert "\n" not in msg and msg.startswith("cannot download demo-1.0.tar.gz: http://127.0.0.1:") and \
        "no whole answer within 3 s" in msg, msg


def test_a_mirror_page_in_the_deadline_too_then_the_recipe_url(tmp_path, monkeypatch):
    # PIP_INDEX_URL's page trickles: the page read ends within its deadline, the recipe's URL is used
    data = tar_gz_demo()
    with Trickle(True) as mirror, _files({"/demo-1.0.tar.gz": data}) as origin:
        mod, logged, run = _fetch_in_process(tmp_path, origin.url + "/demo-1.0.tar.gz",
                                             {"PIP_INDEX_URL": mirror.url + "/simple"}, deadline=2,
                                             monkeypatch=monkeypatch)
        started = time.monotonic()
        with pytest.raises(Failed, match="not the pinned"):  # it downloaded the recipe's file (our pin is zeros)
            run()
        assert time.monotonic() - started < 7
    assert any("no whole answer within 2 s" in line for line in logged), logged


def tar_gz_demo() -> bytes:
    import io
    import tarfile
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        info = tarfile.TarInfo("demo-1.0/setup.py")
        info.size = 7
        tf.addfile(info, io.BytesIO(b"# demo\n"))
    return buf.getvalue()


def _files(files):
    from tests.unit.test_sdist import Files
    return Files(files)


@pytest.mark.parametrize("link", ["file://{fifo}", "ftp://127.0.0.1:{port}/demo-1.0.tar.gz",
                                  "http://198.51.100.7/demo-1.0.tar.gz"])
def test_a_mirror_page_linking_a_fifo_or_ftp_is_not_followed(tmp_path, monkeypatch, link):
    # A mirror's page links the sdist at file:///.../demo-1.0.tar.gz, a FIFO (opening it blocks until a
    # writer comes: the build hung), at ftp://, or at plain http:// off loopback: none is opened; the
    # recipe's own URL is used.
    import hashlib

    (tmp_path / "fifo").mkdir()
    fifo = tmp_path / "fifo" / "demo-1.0.tar.gz"
    os.mkfifo(fifo)
    data = tar_gz_demo()
    with _files({"/files/demo-1.0.tar.gz": data}) as origin:
        href = link.format(fifo=fifo, port=origin.server.server_address[1])
        page = f'<html><a href="{href}#sha256=x">demo-1.0.tar.gz</a></html>'.encode()
        origin.files["/simple/demo-pkg/"] = page
        mod, logged, run = _fetch_in_process(tmp_path, origin.url + "/files/demo-1.0.tar.gz",
                                             {"PIP_INDEX_URL": origin.url + "/simple"})
        src = {"url": origin.url + "/files/demo-1.0.tar.gz", "ref": "demo-1.0.tar.gz",
               "sha256": hashlib.sha256(data).hexdigest()}
        done = {}
        worker = threading.Thread(target=lambda: done.setdefault("ok", mod.fetch_sdist(
            src, "Demo_Pkg", str(tmp_path / "src"), {"PIP_INDEX_URL": origin.url + "/simple"}, logged.append,
            lambda m, c=1: done.setdefault("failed", m))), daemon=True)
        worker.start()
        worker.join(20)
        hung = worker.is_alive()
        if hung:  # the fetch opened the FIFO: a writer lets it go
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            os.close(fd)
            worker.join(10)
    assert not hung, "the fetch opened the FIFO the mirror's page linked"
    assert "failed" not in done, done
    assert (tmp_path / "src" / "setup.py").read_bytes() == b"# demo\n"
    assert any("link to demo-1.0.tar.gz is not followed (only https:// links are followed" in line
               for line in logged), logged
    assert origin.asked == ["/simple/demo-pkg/", "/files/demo-1.0.tar.gz"]


def test_a_redirect_to_ftp_is_not_followed(tmp_path):
    mod = builder_module("imagegen_sdist_round3_redirect", SDIST)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(302)
            self.send_header("Location", "ftp://127.0.0.1:9/demo-1.0.tar.gz")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(Exception) as info:
            mod.download(f"http://127.0.0.1:{server.server_address[1]}/demo-1.0.tar.gz", {})
    finally:
        server.shutdown()
        server.server_close()
    assert "redirect not followed: only https:// links are followed, not ftp://" in str(info.value)


# --------------------------------------------------------------------------------------------
# 3. a repository at a top-level path: file:///srv@v2.2.0 is /srv at v2.2.0, not a user "srv"


@pytest.mark.parametrize("url", ["file:///srv@v2.2.0", "file:///srv", "file:////srv@v1", "file:///opt@main"])
def test_a_top_level_file_url_carries_no_credential(url):
    from imagegen import safety
    assert not safety.has_credentials(url) and safety.redact(url) == url


@pytest.mark.parametrize("url", ["file://user:pw@host/srv@v1", "https:///u:tok@host/x", "https://u:tok@h/srv@v1"])
def test_a_credential_is_still_found_beside_it(url):
    from imagegen import safety
    assert safety.has_credentials(url) and "tok" not in safety.redact(url) and "pw@" not in safety.redact(url)


def test_plan_of_a_top_level_repository_reaches_git_with_its_path_shown(tmp_path, capsys, monkeypatch):
    # one not there: git's own reason, the path unmasked, not "carries a credential"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    missing = "/imagegen-no-such-repo-%d" % os.getpid()
    code = main(["plan", "flash-attn", "--git", f"file://{missing}@v2.2.0", "--torch", "2.8", "--cuda", "12.8",
                 "--python", "3.12", "--arch", "9.0"])
    err = capsys.readouterr().err
    assert code == 2 and "carries a credential" not in err and "***" not in err, err
    assert f"cannot resolve v2.2.0 at file://{missing}: git ls-remote failed: fatal: '{missing}' does not appear" in err, err


@pytest.mark.skipif(not os.access("/", os.W_OK), reason="a top-level repository needs a writable / (root in CI)")
def test_a_real_top_level_repository_is_resolved_and_exported(tmp_path, capsys, monkeypatch):
    import json

    from tests.git_server import tiny_kernel_repo

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    repo, commit = tiny_kernel_repo(tmp_path)
    top = Path("/imagegen-round3-%d" % os.getpid())
    top.symlink_to(repo)  # /NAME, one segment: what file:///srv is
    try:
        recipes = Path(__file__).parents[1] / "fixtures" / "tiny_git_recipe"
        assert main(["plan", "tiny", "--git", f"file://{top}@v0.1.0", "--json", "--torch", "2.11", "--cuda", "13.0",
                     "--python", "3.11", "--arch", "8.0", "--flavor", "pypi", "--recipe-dir", str(recipes)]) == 0
    finally:
        top.unlink()
    (c,) = json.loads(capsys.readouterr().out)["cells"]
    assert c["version"] == f"0.1.0-g{commit[:8]}" and f"exported from file://{top} to " in c["notes"][0], c


# --------------------------------------------------------------------------------------------
# 4. the engine tests' layer scan (tests/integration/image_scan.py): layers another build adds or removes
# mid-scan are tolerated, grep's errors are never hidden, and a planted secret is still found


def _layers(tmp_path: Path, secret: bytes) -> tuple[Path, Path]:
    a, b = tmp_path / "layer-a" / "diff", tmp_path / "layer-b" / "diff"
    (a / "usr" / "lib").mkdir(parents=True)
    (b / "opt").mkdir(parents=True)
    (a / "usr" / "lib" / "x.so").write_bytes(b"\x7fELF" + b"\0" * 4096 + secret + b"\0" * 100)
    (b / "opt" / "readme").write_bytes(b"nothing here\n")
    os.mkfifo(b / "opt" / "fifo")  # never opened (-D skip): the scan does not hang on it
    return a, b


def test_the_layer_scan_finds_a_planted_secret(tmp_path):
    from tests.integration import image_scan

    secret = b"imagegen-planted-" + os.urandom(8).hex().encode()
    a, b = _layers(tmp_path, secret)
    assert image_scan._grep([a, b], [secret, b"absent-needle"]) == ({secret}, set())
    assert image_scan._grep([b], [secret]) == (set(), set())


def test_a_layer_that_vanished_before_grep_reads_it_is_dropped_not_a_failure(tmp_path):
    # What another worker's build does: a layer folder listed as made since the build began is removed
    # before grep gets to it. grep says "No such file or directory" and exits 2 (the CI failure was
    # `AssertionError: b''`: --no-messages had hidden that line); the secret in the layer still there is found.
    from tests.integration import image_scan

    secret = b"imagegen-planted-" + os.urandom(8).hex().encode()
    a, b = _layers(tmp_path, secret)
    gone = tmp_path / "layer-c" / "diff"
    found, vanished = image_scan._grep([a, gone, b], [secret])
    assert found == {secret} and vanished == {gone}


def test_files_vanishing_mid_scan_are_scanned_again(tmp_path):
    # a real race: a thread deletes a layer's files (a layer being removed) while grep walks them
    from tests.integration import image_scan

    secret = b"imagegen-planted-" + os.urandom(8).hex().encode()
    a, b = _layers(tmp_path, secret)
    churn = tmp_path / "layer-d" / "diff"
    churn.mkdir(parents=True)
    for i in range(3000):
        (churn / f"f{i}").write_bytes(b"x" * 512)
    stop = threading.Event()

    def remove():
        for p in sorted(churn.iterdir(), reverse=True):
            if stop.is_set():
                return
            p.unlink()
        churn.rmdir()

    remover = threading.Thread(target=remove)
    remover.start()
    try:
        found, vanished = image_scan._grep([churn, a, b], [secret])
    finally:
        stop.set()
        remover.join()
    assert found == {secret} and vanished <= {churn}


def test_any_other_grep_error_fails_the_scan_with_greps_own_line(tmp_path, monkeypatch):
    from tests.integration import image_scan

    a, b = _layers(tmp_path, b"s3cret-x")
    fake = tmp_path / "grep"  # a grep that hits a read error (what a failing disk gives)
    fake.write_text("#!/bin/sh\necho 'grep: /var/lib/docker/overlay2/x/diff/y: Input/output error' >&2\nexit 2\n")
    fake.chmod(0o755)
    monkeypatch.setattr(image_scan, "GREP", str(fake))
    with pytest.raises(AssertionError, match="Input/output error"):
        image_scan._grep([a, b], [b"s3cret-x"])
    # and a "vanished" file that is still there is no vanishing: also grep's line, not a pass
    fake.write_text(f"#!/bin/sh\necho 'grep: {b}/opt/readme: No such file or directory' >&2\nexit 2\n")
    with pytest.raises(AssertionError, match="No such file or directory"):
        image_scan._grep([a, b], [b"s3cret-x"])
