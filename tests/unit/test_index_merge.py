"""Tests for imagegen.publish.index_merge and ``imagegen index OUT --merge URL`` (imagegen.publish.index):
an index published by an earlier run, served over real HTTP on 127.0.0.1, merged with this run's wheels, flat
and per CUDA, and each cell folder's manifest merged with the served one. Then the server as a stranger:
nothing there yet, a conflict, an oversize page, a page with a bad file name or a link elsewhere, a redirect to
another host (not followed), a server that drips (bounded time), a page that is not JSON, and the command's
one-line errors."""

from __future__ import annotations

import functools
import json
import re
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable, Iterator

import pytest

from imagegen import cli
from imagegen.errors import PublishError, Unreadable, UnsafeValueError
from imagegen.wheelhouse import collect
from imagegen.publish import index, index_merge
from tests.publish_servers import rebuilt
from tests.unit.executor_fixtures import WHEEL, tiny_cell

TINY = "tiny-kernel"
CP310 = WHEEL.name.replace("cp311-cp311", "cp310-cp310")
FOLDER = "tiny-kernel-0.1.0/torch2.11/cu130"


def _quiet(message: str) -> None:
    pass


class _Static(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@contextmanager
def static_server(folder: Path) -> Iterator[str]:
    """``folder`` served over HTTP on 127.0.0.1 (a static host: no content negotiation); its URL."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Static, directory=str(folder)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    finally:
        httpd.shutdown()
        httpd.server_close()


@contextmanager
def answering(answer: Callable[[BaseHTTPRequestHandler], None]) -> Iterator[tuple[str, list[str]]]:
    """A server whose every GET is answered by ``answer(handler)``; its URL and the paths asked."""
    asked: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            answer(self)

        def log_message(self, *args) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/", asked
    finally:
        httpd.shutdown()
        httpd.server_close()


def send(handler: BaseHTTPRequestHandler, status: int, body: bytes = b"", headers: dict | None = None) -> None:
    handler.send_response(status)
    for name, value in (headers or {}).items():
        handler.send_header(name, value)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def first_run(tmp_path: Path) -> Path:
    """A wheelhouse as the first run published it: the cp311 cell's wheel, its manifest and its index."""
    out = tmp_path / "published"
    collect.place(out, tiny_cell(python="3.11"), WHEEL, inputs="run-1", record={"verify": {"ok": True}})
    index.write_index(out, say=_quiet)
    return out


def second_run(tmp_path: Path) -> tuple[Path, Path]:
    """This run's wheelhouse: the cp310 cell of the same folder (another wheel); the wheelhouse and its wheel."""
    out = tmp_path / "run2"
    wheel = rebuilt(WHEEL, tmp_path / "src", "cp310").rename(tmp_path / "src" / CP310)
    placed = collect.place(out, tiny_cell(python="3.10"), wheel, inputs="run-2", record={"verify": {"ok": True}})
    return out, placed


def page(path: Path) -> dict:
    return json.loads(path.read_text())


def test_the_published_wheels_are_listed_beside_this_runs_flat_and_per_cuda(tmp_path):
    published = first_run(tmp_path)
    out, _ = second_run(tmp_path)
    with static_server(published) as url:
        result = index.write_index(out, say=_quiet, merge_from=url)
    assert result.projects == {TINY: [CP310, WHEEL.name]} and result.problems == []
    assert result.cuda == {"cu130": [TINY]}
    assert result.merged["published"] is True and result.merged["wheels"] == [WHEEL.name]
    for simple, up in ((out / "simple", "../../"), (out / "cu130" / "simple", "../../../")):
        files = {f["filename"]: f for f in page(simple / TINY / "index.json")["files"]}
        assert set(files) == {CP310, WHEEL.name}
        # The served wheel at its path below the URL, with the hashes the served page gave.
        served = files[WHEEL.name]
        assert served["url"] == f"{up}{FOLDER}/{WHEEL.name}".replace("+", "%2B")
        assert served["hashes"] == page(published / "simple" / TINY / "index.json")["files"][0]["hashes"]
        assert served["core-metadata"] == page(published / "simple" / TINY / "index.json")["files"][0]["core-metadata"]
        html = (simple / TINY / "index.html").read_text()
        assert WHEEL.name in html and CP310 in html
    assert WHEEL.name in (out / "index.html").read_text()
    # Its metadata file is the published one: nothing is written for it here.
    assert not (out / FOLDER / (WHEEL.name + ".metadata")).exists() and (out / FOLDER / (CP310 + ".metadata")).exists()
    # The folder's manifest as it is to be served: both runs' cells; its own manifest: this run's only.
    served_manifest = page(out / FOLDER / index.SERVED_MANIFEST)
    assert {c["inputs"] for c in served_manifest["cells"].values()} == {"run-1", "run-2"}
    assert [c["inputs"] for c in page(out / FOLDER / "manifest.json")["cells"].values()] == ["run-2"]
    # Without --merge the served manifest is stale, and goes.
    again = index.write_index(out, say=_quiet)
    assert again.projects == {TINY: [CP310]} and not (out / FOLDER / index.SERVED_MANIFEST).exists()


def test_nothing_published_yet_merges_nothing(tmp_path):
    out, _ = second_run(tmp_path)
    (tmp_path / "empty").mkdir()
    with static_server(tmp_path / "empty") as url:
        result = index.write_index(out, say=_quiet, merge_from=url)
    assert result.projects == {TINY: [CP310]} and result.merged["published"] is False
    assert [c["inputs"] for c in page(out / FOLDER / index.SERVED_MANIFEST)["cells"].values()] == ["run-2"]


def test_a_wheel_name_served_with_another_sha256_is_refused_and_nothing_is_written(tmp_path):
    published = first_run(tmp_path)
    out = tmp_path / "run2"
    other = rebuilt(WHEEL, tmp_path / "src", "another build of the same name")
    collect.place(out, tiny_cell(python="3.11"), other, inputs="run-2", record={})
    with static_server(published) as url:
        with pytest.raises(PublishError, match=f"{url} serves another wheel of this name .*publish a new version"):
            index.write_index(out, say=_quiet, merge_from=url)
    assert not (out / "simple").exists() and not (out / FOLDER / index.SERVED_MANIFEST).exists()


def test_the_same_wheel_served_and_here_is_listed_once(tmp_path):
    published = first_run(tmp_path)
    out = tmp_path / "run2"
    collect.place(out, tiny_cell(python="3.11"), WHEEL, inputs="run-1", record={})
    with static_server(published) as url:
        result = index.write_index(out, say=_quiet, merge_from=url)
    assert result.projects == {TINY: [WHEEL.name]} and result.problems == []


def test_a_served_cell_naming_this_runs_wheel_with_another_sha256_is_refused(tmp_path):
    published = first_run(tmp_path)
    manifest = published / FOLDER / "manifest.json"
    document = page(manifest)
    (entry,) = document["cells"].values()
    document["cells"]["cp310-cell"] = {**entry, "wheel": CP310, "sha256": "0" * 64}
    manifest.write_text(json.dumps(document))
    out, _ = second_run(tmp_path)
    with static_server(published) as url:
        with pytest.raises(PublishError, match=re.escape(f"{FOLDER}/{CP310}: this run's wheel differs from the one published")):
            index.write_index(out, say=_quiet, merge_from=url)


def served_page(files: list[dict]) -> Callable[[BaseHTTPRequestHandler], None]:
    """A server whose project list names tiny-kernel, whose page lists ``files``; nothing else is there."""
    def answer(handler: BaseHTTPRequestHandler) -> None:
        if handler.path == "/simple/index.json":
            send(handler, 200, json.dumps({"meta": {"api-version": "1.1"}, "projects": [{"name": TINY}]}).encode())
        elif handler.path == f"/simple/{TINY}/index.json":
            send(handler, 200, json.dumps({"meta": {"api-version": "1.1"}, "name": TINY, "files": files}).encode())
        else:
            send(handler, 404)
    return answer


GOOD = {"filename": WHEEL.name, "url": f"../../{FOLDER}/{WHEEL.name}", "hashes": {"sha256": "a" * 64}, "size": 10}


@pytest.mark.parametrize("entry, why", [
    ({**GOOD, "filename": "tiny_kernel-0.1.0-cp311-cp311-linux_x86_64.whl\"><script>.whl"}, "not a wheel file name"),
    ({**GOOD, "filename": "setup.py"}, "not a wheel file name"),
    ({**GOOD, "filename": "other-1.0-py3-none-any.whl"}, "a wheel of other, on the page of tiny-kernel"),
    ({**GOOD, "hashes": {"md5": "x"}}, "no sha256"),
    ({**GOOD, "size": "10"}, "no size in bytes"),
    ({**GOOD, "url": f"http://evil.example/{WHEEL.name}"}, "is not below"),
    ({**GOOD, "url": f"//evil.example/{FOLDER}/{WHEEL.name}"}, "is not below"),
    ({**GOOD, "url": f"../../{FOLDER}/other.whl"}, "names another file"),
    ({**GOOD, "url": f"../../{FOLDER}/{WHEEL.name}?x=1"}, "is not below"),
    ({**GOOD, "url": "http://[::1/x.whl"}, "is not a URL"),
    ("not an entry", "not a file entry"),
])
def test_a_file_entry_that_is_no_wheel_imagegen_published_is_left_out_and_said(tmp_path, entry, why):
    out, _ = second_run(tmp_path)
    with answering(served_page([entry, GOOD | {"filename": CP310.replace("cp310", "cp39"),
                                               "url": f"../../{FOLDER}/{CP310.replace('cp310', 'cp39')}"}])) as (url, _):
        result = index.write_index(out, say=_quiet, merge_from=url)
    assert result.projects == {TINY: [CP310, CP310.replace("cp310", "cp39")]}
    (problem,) = result.problems
    assert problem.startswith(f"{url}simple/{TINY}/: ") and why in problem and problem.endswith("; left out")


def test_a_link_above_the_served_folder_is_refused():
    base = "http://127.0.0.1:1/house/"
    assert index_merge._served_path("../../a/x.whl", "x.whl", base, base + "simple/p/") == "a/x.whl"
    for link in ("../../../x.whl", "../../../house2/x.whl", "/x.whl", "../../a/%2E%2E/%2E%2E/x.whl"):
        with pytest.raises(Unreadable, match="is not"):
            index_merge._served_path(link, "x.whl", base, base + "simple/p/")


def test_an_oversize_page_is_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(index_merge, "MAX_PAGE_BYTES", 1000)
    out, _ = second_run(tmp_path)
    with answering(served_page([GOOD] * 50)) as (url, _):
        with pytest.raises(PublishError, match=rf"--merge: {url}simple/{TINY}/index.json: an answer larger than 1000"
                                               r" bytes: refused$"):
            index.write_index(out, say=_quiet, merge_from=url)
    assert not (out / "simple").exists()


def test_a_redirect_to_another_host_is_not_followed(tmp_path):
    out, _ = second_run(tmp_path)
    with answering(lambda h: send(h, 200, b"{}")) as (elsewhere, asked_elsewhere):
        with answering(lambda h: send(h, 302, headers={"Location": elsewhere + "simple/index.json"})) as (url, _):
            with pytest.raises(PublishError, match=f"--merge: {url}simple/index.json: redirected outside {url}"):
                index.write_index(out, say=_quiet, merge_from=url)
    assert asked_elsewhere == []


def test_a_dripping_server_is_cut_off_at_the_deadline(tmp_path):
    out, _ = second_run(tmp_path)
    stop = threading.Event()

    def drip(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Length", "100000")
        handler.end_headers()
        while not stop.is_set():
            try:
                handler.wfile.write(b" ")
                handler.wfile.flush()
            except OSError:
                return
            time.sleep(0.2)

    with answering(drip) as (url, _):
        started = time.monotonic()
        with pytest.raises(PublishError, match="no complete answer within the 2 s"):
            index.write_index(out, say=_quiet, merge_from=url, deadline=2)
        took = time.monotonic() - started
        stop.set()
    assert took < 6, took


def test_a_page_that_is_not_json_or_an_error_status_is_refused(tmp_path):
    out, _ = second_run(tmp_path)
    with answering(lambda h: send(h, 200, b"<html>not json</html>")) as (url, _):
        with pytest.raises(PublishError, match=f"--merge: {url}simple/: not a PEP 691 JSON page"):
            index.write_index(out, say=_quiet, merge_from=url)
    with answering(lambda h: send(h, 500)) as (url, _):
        with pytest.raises(PublishError, match=f"--merge: {url}simple/index.json: HTTP 500$"):
            index.write_index(out, say=_quiet, merge_from=url)


def test_a_served_manifest_that_is_not_one_is_said_and_this_runs_cells_are_served(tmp_path):
    published = first_run(tmp_path)
    (published / FOLDER / "manifest.json").write_text("[1, 2]")
    out, _ = second_run(tmp_path)
    with static_server(published) as url:
        result = index.write_index(out, say=_quiet, merge_from=url)
    assert result.problems == [f"{url}{FOLDER}/manifest.json: not a manifest (no mapping of cells); its cells are"
                               " not merged"]
    assert [c["inputs"] for c in page(out / FOLDER / index.SERVED_MANIFEST)["cells"].values()] == ["run-2"]


def test_cuda_membership_comes_from_the_served_per_cuda_index_and_the_local_version_label():
    assert index_merge.cuda_of_label(index_merge.Version("0.1.0+cu130torch2.11")) == "cu130"
    assert index_merge.cuda_of_label(index_merge.Version("0.1.0+cu13000")) is None
    assert index_merge.cuda_of_label(index_merge.Version("0.1.0")) is None


def test_the_command_says_what_it_merged_and_errors_are_one_line(tmp_path, capsys):
    published = first_run(tmp_path)
    out, _ = second_run(tmp_path)
    with static_server(published) as url:
        assert cli.main(["index", str(out), "--merge", url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == f"  merged with {url}: 1 served wheel; 1 manifest.served.json file (published cells and this run's)"
    assert cli.main(["index", str(out), "--merge", "http://127.0.0.1:1/house"]) == 9
    err = capsys.readouterr().err
    assert err.startswith("imagegen: error: --merge: http://127.0.0.1:1/house/simple/index.json: ") and err.count("\n") == 1
    assert "Traceback" not in err
    with pytest.raises(UnsafeValueError):
        index.write_index(out, say=_quiet, merge_from="https://user:secret@example.com/house")
    assert cli.main(["index", str(out), "--merge", "https://user:secret@example.com/house"]) == 2
    assert "secret" not in capsys.readouterr().err
