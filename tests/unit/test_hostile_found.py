"""Issue 32: the defects the fresh hostile campaign (benchmarks/hostile_campaign.py) found, each at its
cause; each test here failed on the code before its fix (checked against 12361c4).

- credentials shown or written: a registry reference or cache spec with ``user:TOKEN@`` but no scheme
  (printed as given; a cache spec went into the bake file), a token a git server echoed back in its
  error (``Authorization: Basic ...``), a build variable that is or carries a credential (written into
  the Dockerfile, the bake file and so the image's history);
- `publish` held forever by an index page, an upload answer or a server that drips or never answers
  (a socket timeout restarts with every byte);
- writes outside the folder given, through a link planted in it (render's ``imagegen-scripts``, bake's
  Dockerfiles folder, ``--work``'s ``runs``); exit 70 for a --work, a cache folder or a manifest.json
  that cannot be written, for a path 2000 folders deep, for ``check --timeout inf``, for a source tree
  holding a file name that is not UTF-8;
- empty values taken as "not given": ``--torch ''``, ``--cuda ''``, ``--version ''``, ``--layout ''``,
  ``archs --cuda ''``.

docs/security.md ("The fresh campaign") has the campaign's figures."""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from imagegen import engine, safety, untrusted
from imagegen.cli import main
from tests.unit.command_helpers import ROOT

TOKEN = "igtokFoundByTheCampaign0123456789"
CELL = ["--torch", "2.8", "--cuda", "12.8", "--python", "3.12", "--arch", "9.0"]
TINY = ["tiny", "--recipe-dir", str(ROOT / "tests" / "fixtures" / "tiny_git_recipe"), "--torch", "2.11", "--cuda",
        "13.0", "--python", "3.11", "--arch", "8.0", "--flavor", "pypi"]


def run(argv: list, capsys) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_line(code: int, err: str, exit_code: int = 2) -> str:
    """The one error line (the last; a warning may come before it)."""
    assert code == exit_code, (code, err)
    lines = err.splitlines()
    assert lines and lines[-1].startswith("imagegen: error: "), err
    assert sum(line.startswith("imagegen: error: ") for line in lines) == 1, err
    assert TOKEN not in err
    return lines[-1]


def files_with_token(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and not p.is_symlink() and TOKEN.encode() in p.read_bytes()]


@pytest.fixture
def no_engine(monkeypatch):
    for step in ("bake", "docker"):
        monkeypatch.setattr(engine, step, lambda *a, **k: pytest.fail("nothing reaches the engine"))


# --------------------------------------------------------------------------------------------
# credentials


@pytest.mark.parametrize("text, shown", [
    (f"u:{TOKEN}@registry.example/img:1", "***@registry.example/img:1"),
    (f"type=registry,ref=u:{TOKEN}@127.0.0.1:9/c:t", "type=registry,ref=***@127.0.0.1:9/c:t"),
    ("{'Authorization': 'Basic Y2FtcGFpZ24tdXNlcjppZ3Rvaz123'}", "{'Authorization': 'Basic ***'}"),
    ("Authorization: Bearer eyJhbGciOi.JIUzI1NiJ9.x1", "Authorization: Bearer ***"),
])
def test_redact_hides_a_password_without_a_scheme_and_an_echoed_credential(text, shown):
    assert safety.redact(text) == shown and safety.has_credentials(text)


@pytest.mark.parametrize("text", ["img:1.0@sha256:" + "a" * 64, "git@github.com:org/repo", "registry:5000/ns/img:tag",
                                  "type=registry,ref=127.0.0.1:5000/ml/cache:tiny,mode=max", "user@example.com",
                                  "Basic auth is not used", "the token huggingface-cli login stored"])
def test_what_carries_no_credential_is_left_alone(text):
    assert safety.redact(text) == text


def test_a_registry_reference_with_a_password_is_refused_without_showing_it(tmp_path, monkeypatch, capsys, no_engine):
    monkeypatch.chdir(tmp_path)
    code, _, err = run(["plan", "sage", *CELL, "--base-image", f"u:{TOKEN}@registry.example/img:1"], capsys)
    one_line(code, err)
    (tmp_path / "imagegen.toml").write_text(f'registry = "u:{TOKEN}@registry.example/ns"\n')
    code, _, err = run(["plan", "sage", *CELL, "--config", tmp_path / "imagegen.toml"], capsys)
    one_line(code, err)


@pytest.mark.parametrize("flag", ["--cache-from", "--cache-to"])
def test_a_cache_spec_with_a_credential_is_refused_before_it_reaches_the_bake_file(flag, tmp_path, monkeypatch,
                                                                                    capsys, no_engine):
    monkeypatch.chdir(tmp_path)
    code, _, err = run(["build", "sage", *CELL, flag, f"type=registry,ref=u:{TOKEN}@127.0.0.1:9/c:t",
                        "--out", tmp_path / "out", "--work", tmp_path / "work"], capsys)
    assert "docker login" in one_line(code, err)
    assert files_with_token(tmp_path) == []


@pytest.mark.parametrize("value, why", [
    (f"MY_URL=https://u:{TOKEN}@h.example/x", "carries a credential"),
    (f"HF_TOKEN={TOKEN}", "named like a credential"),
    (f"AWS_SECRET_ACCESS_KEY={TOKEN}", "named like a credential"),
    (f"EXTRA=ghp_{TOKEN}", "looks like an access token"),
])
@pytest.mark.parametrize("command", ["render", "plan", "bake", "build"])
def test_a_build_variable_that_is_a_credential_is_refused(command, value, why, tmp_path, monkeypatch, capsys,
                                                          no_engine):
    monkeypatch.chdir(tmp_path)
    tail = {"render": ["-o", "D"], "bake": ["-f", "b.hcl"], "build": ["--out", "out", "--work", "work"]}.get(command, [])
    code, _, err = run([command, "sage", *CELL, "--env", value, *tail], capsys)
    assert why in one_line(code, err)
    assert files_with_token(tmp_path) == []


def test_a_recipes_env_that_is_a_credential_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    import shutil
    recipes = tmp_path / "recipes"
    shutil.copytree(ROOT / "tests" / "fixtures" / "tiny_git_recipe", recipes)
    text = (ROOT / "tests" / "fixtures" / "tiny_git_recipe" / "tiny.yaml").read_text()
    text = text.replace("build:\n", f"build:\n  env:\n    PIP_EXTRA_INDEX_URL: https://u:{TOKEN}@h.example/simple\n")
    (recipes / "tiny.yaml").write_text(text)
    code, _, err = run(["render", "tiny", "--recipe-dir", recipes, *TINY[3:], "-o", "D"], capsys)
    assert "carries a credential" in one_line(code, err)
    assert not (tmp_path / "D").exists()


class Reflector(http.server.BaseHTTPRequestHandler):
    """A git host that asks for credentials (401), then refuses them with the request's headers echoed."""

    def do_GET(self):
        if self.headers.get("Authorization"):
            body = f"denied: you sent {dict(self.headers)}".encode()
            self.send_response(403)
        else:
            body = b"who are you?"
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="git"')
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def test_a_git_host_that_echoes_the_credential_back_never_has_it_shown(tmp_path, monkeypatch, capsys):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Reflector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        home = tmp_path / "home"
        home.mkdir()
        (home / ".netrc").write_text(f"machine 127.0.0.1 login u password {TOKEN}\n")
        monkeypatch.setenv("HOME", str(home))
        url = f"http://127.0.0.1:{server.server_address[1]}/tiny.git@v0.1.0"
        code, _, err = run(["plan", *TINY, "--git", url], capsys)
        line = one_line(code, err)
        assert "denied" in line and "Basic ***" in line, line  # git relayed it; imagegen hid it
        import base64
        assert base64.b64encode(f"u:{TOKEN}".encode()).decode() not in line
    finally:
        server.shutdown()


# --------------------------------------------------------------------------------------------
# publish: a total deadline per exchange


def _dripping_index(kind: str):
    stop = threading.Event()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _any(self):
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            if kind == "never":
                stop.wait(120)
                return
            if kind == "drip-upload" and self.command == "GET":
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 100\r\n\r\n")
            self.wfile.flush()
            for _ in range(100):  # one byte every 2 s: each read is quick, the whole takes 200 s
                if stop.wait(2.0):
                    return
                try:
                    self.wfile.write(b" ")
                    self.wfile.flush()
                except OSError:
                    return

        do_GET = do_POST = _any

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, stop


@pytest.mark.parametrize("kind, dry", [("drip-page", True), ("drip-page", False), ("drip-upload", False),
                                       ("never", True)])
def test_publish_to_a_dripping_or_silent_index_ends_within_its_deadline(kind, dry, tmp_path):
    from tests.publish_servers import wheelhouse
    wheelhouse(tmp_path / "wh")
    server, stop = _dripping_index(kind)
    try:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "IMAGEGEN_PUBLISH_DEADLINE": "3", "TWINE_USERNAME": "u",
               "TWINE_PASSWORD": TOKEN, "NETRC": str(tmp_path / "none")}
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "imagegen", "publish", str(tmp_path / "wh"), "--to",
                               f"pypi:http://127.0.0.1:{server.server_address[1]}/legacy/", *(["--check"] if dry else [])],
                              capture_output=True, text=True, env=env, timeout=120)
        took = time.monotonic() - t0
    finally:
        stop.set()
        server.shutdown()
    assert proc.returncode == 9, proc.stderr
    assert "within the 3 s this exchange may take" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert took < 30, took
    assert TOKEN not in proc.stdout + proc.stderr


def test_a_malformed_publish_deadline_is_one_line(tmp_path, monkeypatch, capsys):
    from tests.publish_servers import wheelhouse
    wheelhouse(tmp_path / "wh")
    monkeypatch.setenv("IMAGEGEN_PUBLISH_DEADLINE", "soon")
    code, _, err = run(["publish", tmp_path / "wh", "--to", "pypi:http://127.0.0.1:9/legacy/", "--dry-run"], capsys)
    assert "IMAGEGEN_PUBLISH_DEADLINE" in one_line(code, err)


def test_the_deadline_shuts_a_connection_down_also_once_tls_took_it_over():
    # wrap_socket detaches the plain socket (its fileno becomes -1): the connection is then shut down
    # through the descriptor it had, which the TLS socket holds (before: nothing happened).
    a, b = socket.socketpair()
    fd = a.fileno()
    taken = socket.socket(fileno=a.detach())
    assert a.fileno() == -1
    untrusted._shutdown(a, fd)
    b.settimeout(5)
    assert b.recv(1) == b""  # the peer sees the end at once
    taken.close()
    b.close()


def test_connections_within_cuts_a_blocked_read_in_time():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    t0 = time.monotonic()
    with untrusted.connections_within(1.0) as watch:
        client = socket.create_connection(server.getsockname())
        peer, _ = server.accept()
        try:
            data = client.recv(1)  # nothing is ever sent: only the deadline ends this
        except OSError:
            data = b""
    assert data == b"" and watch.expired and time.monotonic() - t0 < 10
    for s in (client, peer, server):
        s.close()
    assert socket.socket.connect is not None and "connections_within" not in repr(socket.socket.connect)


# --------------------------------------------------------------------------------------------
# writes outside the folder given, and exit 70s where a place cannot be written


def test_render_writes_no_script_through_a_link_out_of_the_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "imagegen-scripts").symlink_to(elsewhere)
    code, _, err = run(["render", "sage", *CELL, "-o", tmp_path / "out" / "Dockerfile"], capsys)
    assert "leads out of" in one_line(code, err)
    assert list(elsewhere.iterdir()) == []
    (tmp_path / "out" / "imagegen-scripts").unlink()
    (tmp_path / "out" / "imagegen-scripts").mkdir()
    (tmp_path / "out" / "imagegen-scripts" / "imagegen_build.py").symlink_to(elsewhere / "victim.py")
    code, _, err = run(["render", "sage", *CELL, "-o", tmp_path / "out" / "Dockerfile"], capsys)
    assert "leads out of" in one_line(code, err)
    assert list(elsewhere.iterdir()) == []


def test_bake_writes_no_script_through_a_link_out_of_its_dockerfiles_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "dockerfiles").mkdir()
    (tmp_path / "dockerfiles" / "imagegen-scripts").symlink_to(elsewhere)
    code, _, err = run(["bake", "sage", *CELL, "-f", "docker-bake.hcl"], capsys)
    assert "leads out of" in one_line(code, err)
    assert list(elsewhere.iterdir()) == [] and not (tmp_path / "docker-bake.hcl").exists()


@pytest.mark.parametrize("argv", [["build", "sage", *CELL, "--out", "out"], ["plan", "sage", *CELL, "--audit"]])
def test_a_runs_link_out_of_work_is_refused(argv, tmp_path, monkeypatch, capsys, no_engine):
    monkeypatch.chdir(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "runs").symlink_to(elsewhere)
    code, _, err = run([*argv, "--work", "work"], capsys)
    assert "leads out of" in one_line(code, err)
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("argv", [["build", "sage", *CELL, "--out", "out"], ["plan", "sage", *CELL, "--audit"]])
def test_a_work_folder_that_cannot_be_made_is_one_line(argv, tmp_path, monkeypatch, capsys, no_engine):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-file").write_text("x\n")
    code, _, err = run([*argv, "--work", tmp_path / "a-file" / "work"], capsys)
    assert "cannot write there" in one_line(code, err)


def test_a_cache_folder_that_cannot_be_written_is_one_line(tmp_path, monkeypatch, capsys):
    from tests.git_server import tiny_kernel_repo
    repo, _ = tiny_kernel_repo(tmp_path)
    (tmp_path / "a-file").write_text("x\n")
    for cache, says in ((tmp_path / "a-file", "cannot export"), (Path("/etc"), "system folder")):
        monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
        code, _, err = run(["render", *TINY, "--git", f"file://{repo}@v0.1.0", "-o", tmp_path / "D"], capsys)
        assert says in one_line(code, err), err


def test_a_manifest_that_is_a_folder_is_one_line_for_collect(tmp_path, capsys):
    from tests.unit.test_collecting import exported, record_of
    out = exported(tmp_path)
    (record_of(out).parent / "manifest.json").mkdir()
    code, _, err = run(["collect", out], capsys)
    assert "is a folder: remove it" in one_line(code, err, 9)


@pytest.mark.parametrize("command", ["render", "bake"])
def test_a_path_thousands_of_folders_deep_is_one_line(command, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    deep = "/".join(["a"] * 2000)
    argv = ["render", "sage", *CELL, "-o", f"{deep}/D"] if command == "render" else \
        ["bake", "sage", *CELL, "-f", f"{deep}/b.hcl"]
    code, _, err = run(argv, capsys)
    import re
    assert re.search(r"is 20\d\d folders deep; at most 255$", one_line(code, err))


@pytest.mark.parametrize("value", ["inf", "1e400", "nan", "-1", "0", "9e9"])
def test_check_refuses_a_timeout_that_is_no_time_limit(value, tmp_path, capsys):
    from tests.unit.executor_fixtures import WHEEL
    code, _, err = run(["check", WHEEL, "--timeout", value], capsys)
    assert "--timeout must be a positive number" in one_line(code, err)


def test_a_source_tree_with_a_file_name_that_is_not_utf8_renders(tmp_path, monkeypatch, capsys):
    import shutil
    monkeypatch.chdir(tmp_path)
    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "tests" / "fixtures" / "tiny_kernel", tree)
    (tree / os.fsdecode(b"notes-\xff.txt")).write_text("x\n")
    code, _, err = run(["render", "--source", tree, *TINY[3:], "-o", "D"], capsys)
    assert code == 0, err
    assert (tmp_path / "D").is_file()


# --------------------------------------------------------------------------------------------
# an empty value is refused, never taken as "not given"


@pytest.mark.parametrize("flag", ["--torch", "--cuda", "--python", "--version"])
@pytest.mark.parametrize("command", ["plan", "render"])
def test_an_empty_value_is_refused(command, flag, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    argv = [command, "sage", "--arch", "9.0", flag, "", *(["-o", "D"] if command == "render" else [])]
    code, _, err = run(argv, capsys)
    assert "got an empty one" in one_line(code, err)


def test_an_empty_layout_is_flat_and_an_empty_archs_cuda_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    # --layout '' is the flat wheelhouse (as --layout .): every wheel directly in --out
    code, out, err = run(["plan", "sage", *CELL, "--layout", "", "--json"], capsys)
    assert code == 0, err
    assert [c["wheel_dir"] for c in json.loads(out)["cells"]] == ["."]
    for flag in ("--cuda", "--torch"):
        code, _, err = run(["archs", "9.0", flag, ""], capsys)
        assert "got an empty one" in one_line(code, err)


def test_no_writable_temporary_folder_is_one_line(tmp_path, monkeypatch, capsys):
    # A machine (or a sandbox) where tempfile finds no folder it can write: verify's temporary folder
    # was an exit 70. The real tempfile code path, with its list of candidates pointing nowhere.
    import tempfile
    from tests.unit.executor_fixtures import WHEEL
    monkeypatch.setattr(tempfile, "tempdir", None)
    monkeypatch.setattr(tempfile, "_candidate_tempdir_list", lambda: [str(tmp_path / "nowhere")])
    code, _, err = run(["verify", WHEEL, "--arch", "8.0"], capsys)
    assert "set TMPDIR" in one_line(code, err)


def test_repair_into_a_folder_that_cannot_be_written_is_one_line(tmp_path, monkeypatch, capsys):
    from tests.unit.executor_fixtures import WHEEL, temp_files_under
    temp_files_under(tmp_path, monkeypatch)
    (tmp_path / "a-file").write_text("x\n")
    code, _, err = run(["repair", WHEEL, "--out", tmp_path / "a-file" / "out"], capsys)
    assert "cannot write the repaired wheel there" in one_line(code, err, 9)
