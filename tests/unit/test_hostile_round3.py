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
