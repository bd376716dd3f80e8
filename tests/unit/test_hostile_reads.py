"""Issue 32, items 5-8: every read of untrusted data bounded in size, depth, time and kind of file.

Hostile index servers run on 127.0.0.1 (http.server in a thread): file URLs of other schemes, relative
URLs (PEP 691), malformed answers, 200 000-deep JSON, a redirect loop, a METADATA member inflating to
1.5 GiB, a server dripping one byte every 2 s. Hostile wheelhouse files are real: a FIFO, a 3 GiB
sparse file, a symlink to /dev/zero, deep JSON. Hostile wheels are real zips whose member inflates to
600 MiB (0.6 MB on disk). Where the code before the fix hangs, eats memory or fills the disk, the CLI
runs in a child process with a time limit, an address-space limit (2 GiB) and a file-size limit
(256 MiB, standing in for a small TMPDIR): bounded code never comes near them.

docs/security.md ("Untrusted servers and files: every read bounded") lists the limits."""

from __future__ import annotations

import functools
import http.server
import io
import json
import os
import resource
import struct
import subprocess
import sys
import threading
import time
import zipfile
import zlib
from pathlib import Path

import pytest

from imagegen.cli import main
from imagegen.errors import CompatError
from imagegen.model import compat
from tests.unit.command_helpers import ROOT
from tests.unit.test_refresh import send_range

# --------------------------------------------------------------------------------- helpers


def cli(*argv, env: dict | None = None, timeout: float = 60, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`python -m imagegen ARGV` in a child limited to 2 GiB of address space and 256 MiB per file written:
    an unbounded read or unpack dies there (MemoryError: exit 70; SIGXFSZ) instead of eating the machine."""
    def limits():
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
        resource.setrlimit(resource.RLIMIT_FSIZE, (256 << 20, 256 << 20))
    full = dict(os.environ, **(env or {}))
    full["PYTHONPATH"] = os.pathsep.join([str(ROOT), *([full["PYTHONPATH"]] if full.get("PYTHONPATH") else [])])
    return subprocess.run([sys.executable, "-m", "imagegen", *map(str, argv)], capture_output=True, text=True,
                          cwd=cwd or ROOT, env=full, timeout=timeout, preexec_fn=limits)


def one_line_refusal(proc: subprocess.CompletedProcess, code: int | None = None) -> str:
    assert proc.returncode not in (0, 70) and proc.returncode > 0, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines and lines[-1].startswith("imagegen: error: "), proc.stderr[-2000:]
    if code is not None:
        assert proc.returncode == code, proc.stderr
    return lines[-1]


def _zip(members: list[tuple[str, bytes, int, int, int]]) -> bytes:
    """A zip of (name, data as stored, method, crc32, uncompressed size): written by hand, so a member's
    deflate stream can be one made without inflating it first."""
    out, central = io.BytesIO(), io.BytesIO()
    for name, data, method, crc, size in members:
        offset = out.tell()
        raw = name.encode()
        out.write(struct.pack("<4s5H3I2H", b"PK\x03\x04", 20, 0, method, 0, 33, crc, len(data), size, len(raw), 0))
        out.write(raw + data)
        central.write(struct.pack("<4s6H3I5H2I", b"PK\x01\x02", 20, 20, 0, method, 0, 33, crc, len(data), size,
                                  len(raw), 0, 0, 0, 0, 0, offset) + raw)
    cd = central.getvalue()
    start = out.tell()
    out.write(cd + struct.pack("<4s4H2IH", b"PK\x05\x06", 0, 0, len(members), len(members), len(cd), start, 0))
    return out.getvalue()


def _deflated(data: bytes) -> tuple[str, bytes, int, int, int]:
    co = zlib.compressobj(6, zlib.DEFLATED, -15)
    return co.compress(data) + co.flush(), 8, zlib.crc32(data), len(data)


@functools.lru_cache(maxsize=None)
def zeros_member(mib: int) -> tuple[bytes, int, int, int]:
    """A deflate stream of ``mib`` MiB of zeros (about 1 KiB per MiB), made without the MiBs: one
    fully flushed block repeated."""
    zeros = bytes(1 << 20)
    co = zlib.compressobj(9, zlib.DEFLATED, -15)
    co.compress(zeros)
    co.flush(zlib.Z_FULL_FLUSH)
    block = co.compress(zeros) + co.flush(zlib.Z_FULL_FLUSH)  # after a full flush: the same bytes every time
    crc = 0
    for _ in range(mib):
        crc = zlib.crc32(zeros, crc)
    first = zlib.compressobj(9, zlib.DEFLATED, -15)
    head = first.compress(zeros) + first.flush(zlib.Z_FULL_FLUSH)
    return head + block * (mib - 1) + first.flush(), 8, crc, mib << 20


def bomb_wheel(src: Path, dest: Path, name: str, mib: int) -> Path:
    """``src``'s members plus ``name``, inflating to ``mib`` MiB of zeros."""
    with zipfile.ZipFile(src) as zf:
        members = [(i.filename, *_deflated(zf.read(i))) for i in zf.infolist()]
    members.insert(0, (name, *zeros_member(mib)))
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(_zip(members))
    return dest


def test_the_bomb_is_what_it_says():
    data, _, crc, size = zeros_member(8)
    blob = _zip([("x.bin", data, 8, crc, size)])
    assert len(blob) < 16 << 10
    with zipfile.ZipFile(io.BytesIO(blob)) as zf:
        assert zf.read("x.bin") == bytes(8 << 20)  # CRC checked by zipfile


# --------------------------------------------------------------------------------- item 5: refresh

TORCH_META = "Metadata-Version: 2.1\nName: torch\nVersion: {v}\nRequires-Dist: filelock\n{pin}\n"


class Server:
    """A PyPI-like index on 127.0.0.1 whose answers a test replaces: ``routes`` maps a path to bytes
    (a 200 answer) or to a function of the request handler."""

    def __init__(self) -> None:
        self.routes: dict[str, object] = {}
        self.stop = threading.Event()
        routes = self.routes

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_GET(self):
                route = routes.get(self.path.split("?")[0])
                if route is None:
                    self.send_error(404)
                elif callable(route):
                    route(self)
                else:
                    send(self, route)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return self.base + "/simple/"

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


def send(h, body: bytes, ctype: str = "application/vnd.pypi.simple.v1+json", status: int = 200) -> None:
    h.send_response(status)
    h.send_header("Content-Type", ctype)
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


def ranged(data: bytes):
    """A route serving ``data`` with HTTP range requests, as PyPI's file host does."""
    def route(h):
        rng = h.headers.get("Range")
        if not rng:
            return send(h, data, "application/octet-stream")
        send_range(h, data, rng)
    return route


def pypi(server: Server, torch_file=None, *, relative: bool = False) -> None:
    """Pages listing what imagegen's tables say today (so a refresh finds nothing new), PEP 658 metadata
    beside each torch wheel; ``torch_file(entry)`` changes each torch file entry."""
    files = []
    for series in compat.torch_table().values():
        lo, hi = (int(p.split(".")[1]) for p in series.python)
        cu = series.pypi_default
        pin = (f"Requires-Dist: cuda-toolkit[cudart]=={cu[2:-1]}.{cu[-1]}.*" if int(cu[2:-1]) >= 13 else
               f"Requires-Dist: nvidia-cuda-runtime-cu{cu[2:-1]}=={cu[2:-1]}.{cu[-1]}.*")
        for py in range(lo, hi + 1):
            fn = f"torch-{series.latest}-cp3{py}-cp3{py}-manylinux_2_28_x86_64.whl"
            server.routes[f"/files/{fn}.metadata"] = TORCH_META.format(v=series.latest, pin=pin).encode()
            entry = {"filename": fn, "url": f"../../files/{fn}" if relative else f"{server.base}/files/{fn}",
                     "size": 1000, "hashes": {}, "core-metadata": True}
            files.append(torch_file(entry) if torch_file else entry)
    kits = [{"filename": f"cuda_toolkit-{v.pypi_toolkit}-py2.py3-none-manylinux_2_27_x86_64.whl",
             "url": f"{server.base}/files/kit.whl", "hashes": {}}
            for v in compat.cuda_table().values() if v.pypi_toolkit]
    for project, listed in (("torch", files), ("cuda-toolkit", kits)):
        server.routes[f"/simple/{project}/"] = json.dumps({"meta": {"api-version": "1.1"}, "name": project,
                                                           "files": listed}).encode()


@pytest.fixture
def server(tmp_path, monkeypatch):
    monkeypatch.setenv("IMAGEGEN_COMPAT_DIR", str(tmp_path / "overlay"))
    compat.reload()
    s = Server()
    yield s
    s.close()
    compat.reload()


def refresh(server: Server, capsys) -> tuple[int, str]:
    code = main(["refresh", "--index-url", server.url, "--dry-run"])
    return code, capsys.readouterr().err


def test_a_well_formed_index_is_current(server, capsys):
    pypi(server)
    assert refresh(server, capsys) == (0, "")


def test_relative_file_urls_are_resolved_against_the_page_per_pep_691(server, capsys):
    pypi(server, relative=True)
    assert refresh(server, capsys) == (0, "")
    # without PEP 658 metadata: the wheel itself, read by range requests at the resolved URL
    wheel = io.BytesIO()
    with zipfile.ZipFile(wheel, "w") as zf:
        latest = max(compat.torch_table().values(), key=lambda s: s.key)
        zf.writestr(f"torch-{latest.latest}.dist-info/METADATA", server.routes[next(
            p for p in server.routes if p.endswith(".metadata") and latest.latest in p)].decode())
    server.routes.clear()

    def entry(e):
        if latest.latest not in e["filename"]:
            return e
        server.routes["/files/" + e["filename"]] = ranged(wheel.getvalue())
        return {**e, "size": len(wheel.getvalue()), "core-metadata": False}
    pypi(server, entry, relative=True)
    assert refresh(server, capsys) == (0, "")


@pytest.mark.parametrize("page, words", [
    (b'{"meta": {"api-version": "1.1"}, "name": "torch", "files": 5}', "not PEP 691 JSON"),
    (b'{"meta": {"api-version": "1.1"}, "name": "torch", "files": [5, "x"]}', "not PEP 691 JSON"),
    (b"[" * 200_000 + b"]" * 200_000, "nested deeper than"),
    (b'{"files": ' + b"[" * 200_000 + b"]" * 200_000 + b"}", "nested deeper than"),
])
def test_a_malformed_page_is_one_line(server, capsys, page, words):
    pypi(server)
    server.routes["/simple/torch/"] = page
    code, err = refresh(server, capsys)
    assert code == CompatError.exit_code and err.count("\n") == 1 and err.startswith("imagegen: error: ")
    assert words in err


@pytest.mark.parametrize("change, words", [
    (lambda e: {k: v for k, v in e.items() if k != "url"}, "no url"),
    (lambda e: {**e, "url": 5}, "no url"),
    (lambda e: {**e, "size": "abc", "core-metadata": False}, "size"),
    (lambda e: {**e, "size": -3, "core-metadata": False}, "size"),
    (lambda e: {k: v for k, v in e.items() if k not in ("size", "core-metadata")}, "size"),
    (lambda e: {**e, "url": "ftp://127.0.0.1/x.whl"}, "only http(s)"),
    (lambda e: {**e, "url": "file:///etc/passwd"}, "only http(s)"),
    (lambda e: {**e, "url": "data:,x"}, "only http(s)"),
])
def test_a_malformed_file_entry_is_one_line(server, capsys, change, words):
    pypi(server, change)
    code, err = refresh(server, capsys)
    assert code == CompatError.exit_code and err.count("\n") == 1 and err.startswith("imagegen: error: ")
    assert words in err, err


def test_a_redirect_loop_or_a_redirect_to_a_file_url_is_one_line(server, capsys):
    def loop(h):
        h.send_response(302)
        h.send_header("Location", h.path)
        h.send_header("Content-Length", "0")
        h.end_headers()

    def to_file(h):
        h.send_response(302)
        h.send_header("Location", "file:///etc/passwd")
        h.send_header("Content-Length", "0")
        h.end_headers()
    for route, words in ((loop, "redirect"), (to_file, "only http(s)")):
        server.routes.clear()
        pypi(server, lambda e: {**e, "url": f"{server.base}/hop/{e['filename']}", "core-metadata": False})
        for e in json.loads(server.routes["/simple/torch/"])["files"]:
            server.routes[f"/hop/{e['filename']}"] = route
        code, err = refresh(server, capsys)
        assert code == CompatError.exit_code and err.count("\n") == 1 and words in err, err
        server.routes["/simple/torch/"] = route  # the page itself
        code, err = refresh(server, capsys)
        assert code == CompatError.exit_code and err.count("\n") == 1 and words in err, err


def test_a_file_url_to_a_fifo_is_refused_not_opened(server, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    pypi(server, lambda e: {**e, "url": f"file://{fifo}", "core-metadata": False, "size": 1000})
    proc = cli("refresh", "--index-url", server.url, "--dry-run", env={"IMAGEGEN_COMPAT_DIR": str(tmp_path / "o")},
               timeout=30)
    assert "only http(s)" in one_line_refusal(proc, CompatError.exit_code)


def test_a_metadata_member_inflating_to_1_5_gib_is_not_inflated(server, tmp_path):
    latest = max(compat.torch_table().values(), key=lambda s: s.key)
    wheel = _zip([("torch/__init__.py", *_deflated(b"")),
                  (f"torch-{latest.latest}.dist-info/METADATA", *zeros_member(1536))])
    assert len(wheel) < 2 << 20
    server.routes["/files/bomb.whl"] = ranged(wheel)
    pypi(server, lambda e: {**e, "url": f"{server.base}/files/bomb.whl", "size": len(wheel), "core-metadata": False})
    t0 = time.monotonic()
    proc = cli("refresh", "--index-url", server.url, "--dry-run", env={"IMAGEGEN_COMPAT_DIR": str(tmp_path / "o")})
    line = one_line_refusal(proc, CompatError.exit_code)
    assert "METADATA" in line and "MiB" in line and time.monotonic() - t0 < 30, line


@pytest.mark.parametrize("where", ["headers", "body", "metadata"])
def test_a_dripping_server_meets_a_total_deadline(server, tmp_path, where):
    def drip(h):
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/vnd.pypi.simple.v1+json\r\nContent-Length: 100\r\n\r\n"
        h.close_connection = True
        try:
            if where != "headers":
                h.wfile.write(head)
                head = b"{" + b" " * 99
            for byte in head:
                if server.stop.wait(2.0):
                    return
                h.wfile.write(bytes([byte]))
                h.wfile.flush()
        except OSError:
            return
    pypi(server)
    if where == "metadata":
        for path in [p for p in server.routes if p.endswith(".metadata")]:
            server.routes[path] = drip
    else:
        server.routes["/simple/torch/"] = drip
    t0 = time.monotonic()
    proc = cli("refresh", "--index-url", server.url, "--dry-run", timeout=40,
               env={"IMAGEGEN_COMPAT_DIR": str(tmp_path / "o"), "IMAGEGEN_REFRESH_DEADLINE": "3"})
    took = time.monotonic() - t0
    line = one_line_refusal(proc, CompatError.exit_code)
    assert "within the 3 s" in line and took < 15, (took, line)


# --------------------------------------------------------------------------------- item 6: manifest.json

from tests.unit.test_collecting import exported, record_of  # noqa: E402


def _manifest_paths(out: Path) -> Path:
    return record_of(out).parent / "manifest.json"


@pytest.mark.parametrize("kind", ["fifo", "sparse-3gib", "dev-zero", "deep"])
def test_collect_and_the_up_to_date_check_read_a_hostile_manifest_bounded(tmp_path, kind):
    out = exported(tmp_path)
    manifest = _manifest_paths(out)
    if kind == "fifo":
        os.mkfifo(manifest)
    elif kind == "sparse-3gib":
        with manifest.open("wb") as fh:
            fh.truncate(3 << 30)
    elif kind == "dev-zero":
        manifest.symlink_to("/dev/zero")
    else:
        manifest.write_text('{"schema": 1, "cells": ' + "[" * 200_000 + "]" * 200_000 + "}")
    proc = cli("collect", out, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    # a manifest that cannot be read is started afresh (as a broken one always was), replaced by rename:
    # never written through the link, never read whole
    assert manifest.is_file() and not manifest.is_symlink()
    assert list(json.loads(manifest.read_text())["cells"])


def test_read_manifest_is_bounded_and_says_why(tmp_path):
    from imagegen.wheelhouse import manifest as wheelhouse
    from tests.unit.executor_fixtures import tiny_cell
    cell = tiny_cell()  # build's up-to-date check reads the same way: a FIFO is no earlier build, at once
    wheelhouse.cell_dir(tmp_path / "out", cell).mkdir(parents=True)
    os.mkfifo(wheelhouse.cell_dir(tmp_path / "out", cell) / "manifest.json")
    assert wheelhouse.up_to_date(tmp_path / "out", cell, "inputs") is None
    assert wheelhouse.replaced(tmp_path / "out", cell) is None
    os.mkfifo(tmp_path / "manifest.json")
    problems: list[str] = []
    assert wheelhouse.read_manifest(tmp_path, problems=problems) == {"schema": 1, "cells": {}}
    assert problems and "not a regular file" in problems[0]
    (tmp_path / "manifest.json").unlink()
    (tmp_path / "manifest.json").symlink_to("/dev/zero")
    problems.clear()
    assert wheelhouse.read_manifest(tmp_path, problems=problems) == {"schema": 1, "cells": {}}
    assert problems and "not a regular file" in problems[0]


# --------------------------------------------------------------------------------- item 8: other exit 70s


def test_a_deep_build_record_and_patches_5_are_problems_of_their_wheel(tmp_path):
    out = exported(tmp_path)
    record = record_of(out)
    record.write_text("[" * 200_000 + "]" * 200_000)
    line = one_line_refusal(cli("collect", out), 6)
    assert "build record" in line and "nested deeper than" in line
    out = exported(tmp_path / "b")
    doc = json.loads(record_of(out).read_text())
    record_of(out).write_text(json.dumps({**doc, "patches": 5}))
    proc = cli("collect", out)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    entry, = json.loads(_manifest_paths(out).read_text())["cells"].values()
    assert entry["patches"] == []
    # a smoke report (copied into the manifest) nested 900 deep: json takes it, the 64-level bound refuses it
    out = exported(tmp_path / "c")
    doc = json.loads(record_of(out).read_text())
    text = json.dumps({**doc, "smoke": {"ok": True, "deep": "DEEP"}})
    record_of(out).write_text(text.replace('"DEEP"', "[" * 900 + "]" * 900))
    line = one_line_refusal(cli("collect", out), 6)
    assert "nested deeper than" in line


@pytest.mark.parametrize("command", ["index", "publish"])
def test_a_deep_manifest_is_one_line_for_index_and_publish(tmp_path, command):
    from tests.publish_servers import wheelhouse as make_wheelhouse
    wheel = make_wheelhouse(tmp_path / "out")
    (wheel.parent / "manifest.json").write_text('{"cells": {"x": ' + "[" * 200_000 + "]" * 200_000 + "}}")
    argv = ["index", tmp_path / "out"] if command == "index" else \
        ["publish", tmp_path / "out", "--to", "pypi:http://127.0.0.1:9/legacy/"]
    proc = cli(*argv, env={"NETRC": str(tmp_path / "none")})
    one_line_refusal(proc)
    # the manifest it could not read is named, with why, before the error (index: a warning; publish: a problem)
    said = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "nested deeper than" in ln]
    assert said and all(str(wheel.parent / "manifest.json") in ln for ln in said), proc.stderr


def test_git_file_url_of_a_repository_holding_an_absolute_symlink_is_one_line(tmp_path):
    from tests.git_server import git, tiny_kernel_repo
    repo, _ = tiny_kernel_repo(tmp_path)
    (repo / "evil").symlink_to("/etc/passwd")
    git(repo, "add", "evil")
    git(repo, "commit", "-q", "-m", "an absolute link")
    git(repo, "tag", "-f", "-a", "v0.1.0", "-m", "0.1.0")
    recipes = ROOT / "tests" / "fixtures" / "tiny_git_recipe"
    proc = cli("plan", "tiny", "--git", f"file://{repo}@v0.1.0", "--torch", "2.11", "--cuda", "13.0", "--python",
               "3.11", "--arch", "8.0", "--flavor", "pypi", "--recipe-dir", recipes,
               env={"XDG_CACHE_HOME": str(tmp_path / "cache")})
    line = one_line_refusal(proc, 2)
    assert "evil" in line and "/etc/passwd" in line, line
    assert not list((tmp_path / "cache" / "imagegen" / "sources").glob("*/setup.py"))


# --------------------------------------------------------------------------------- item 7: wheels


@pytest.fixture
def bomb(tmp_path):
    from tests.unit.test_check import demo_wheel
    src = demo_wheel(tmp_path)
    return bomb_wheel(src, tmp_path / "bomb" / src.name, "demo_kernel/data.bin", 600)


def test_the_600_mib_member_is_refused_by_verify_python_exe_unpacked_by_nobody(bomb, tmp_path):
    assert bomb.stat().st_size < 1 << 20
    proc = cli("verify", bomb, "--arch", "9.0", "--python-exe", sys.executable,
               env={"IMAGEGEN_CUOBJDUMP": "none", "TMPDIR": str(tmp_path)})
    line = one_line_refusal(proc, 6)
    assert "data.bin" in line and "zip bomb" in line, line


def test_the_600_mib_member_is_refused_by_check_before_anything_runs(bomb, tmp_path):
    from tests.unit.test_check import PASSING, fake_torch, recipe_dir
    proc = cli("check", bomb, "--recipe-dir", recipe_dir(tmp_path, PASSING),
               env={"PYTHONPATH": str(fake_torch(tmp_path, cuda=True)), "TMPDIR": str(tmp_path)})
    line = one_line_refusal(proc, 2)
    assert "data.bin" in line and "zip bomb" in line, line


def test_verify_refuses_an_extension_that_is_a_bomb_without_spooling_it(tmp_path):
    from tests.unit.test_check import demo_wheel
    from tests.unit.test_verify import SO_NAME
    src = demo_wheel(tmp_path)
    with zipfile.ZipFile(src) as zf:
        members = [(i.filename, *_deflated(zf.read(i))) for i in zf.infolist() if i.filename != SO_NAME]
    members.insert(0, (SO_NAME, *zeros_member(600)))
    wheel = tmp_path / "bomb" / src.name
    wheel.parent.mkdir()
    wheel.write_bytes(_zip(members))
    proc = cli("verify", wheel, "--arch", "9.0", env={"IMAGEGEN_CUOBJDUMP": "none", "TMPDIR": str(tmp_path)})
    line = one_line_refusal(proc, 6)
    assert "zip bomb" in line, line
