"""imagegen.plan.releases against a real HTTP server on loopback serving PEP 691 pages: a catalogue
package's newer release is found and said with its sdist's name and sha256; what is not a release (a
pre-release, a yanked file, a wheel, another project's file, a file without a well-formed sha256) is
passed over; a project the index lacks is no error; a page that is not PEP 691 JSON is one line."""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
from dataclasses import replace

import pytest

from imagegen.errors import CompatError
from imagegen.model.catalogue import load_catalogue
from imagegen.plan import releases, refresh

SHA = hashlib.sha256(b"flash_attn-2.8.3.post2").hexdigest()


class Index:
    """project -> the list of PEP 691 file entries its page shows (None: the page is not JSON)."""

    def __init__(self, pages: dict[str, list[dict] | None]) -> None:
        self.pages, self.asked = pages, []
        index = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                project = self.path.split("?")[0].strip("/").split("/")[-1]
                index.asked.append(project)
                if project not in index.pages:
                    self.send_error(404)
                    return
                files = index.pages[project]
                body = b"<html>not json</html>" if files is None else json.dumps(
                    {"meta": {"api-version": "1.1"}, "name": project, "files": files}).encode()
                self.send_response(200)
                self.send_header("Content-Type", refresh.JSON_API)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/simple/"


def entry(filename: str, sha: str | None = SHA, **extra) -> dict:
    return {"filename": filename, "url": f"/files/{filename}", "hashes": {"sha256": sha} if sha else {}, **extra}


@pytest.fixture
def serve():
    started = []

    def start(pages):
        started.append(Index(pages))
        return started[-1]
    yield start
    for index in started:
        index.server.shutdown()


def without(version: str):
    """The built-in catalogue with flash-attn's pin ``version`` taken out (what it was before it was pinned)."""
    cat = load_catalogue()
    fa = cat.get("flash-attn")
    cat.add(replace(fa, versions={k: v for k, v in fa.versions.items() if k != version}))
    return cat


FLASH_ATTN_PAGE = [
    entry("flash_attn-2.8.3.post1.tar.gz"),
    entry("flash_attn-2.8.3.post2.tar.gz"),
    entry("flash_attn-2.9.0rc1.tar.gz"),  # a pre-release
    entry("flash_attn-3.0.0.tar.gz", yanked="broken"),
    entry("flash_attn-3.1.0-cp312-cp312-linux_x86_64.whl"),  # a wheel, no sdist
    entry("flash_attn_other-4.0.0.tar.gz"),  # another project's file
    entry("flash_attn-5.0.0.tar.gz", sha="ZZ" * 32),  # no well-formed digest
    entry("flash_attn-6.0.0.tar.gz", sha=None),
]


def test_a_newer_release_is_said_with_its_sdist_and_sha256(serve, capsys):
    index = serve({"flash-attn": FLASH_ATTN_PAGE})
    (new,) = releases.newer_releases(index.url, without("2.8.3.post2"))
    assert (new.recipe, str(new.version), str(new.pinned), new.filename, new.sha256) == \
        ("flash-attn", "2.8.3.post2", "2.8.3.post1", "flash_attn-2.8.3.post2.tar.gz", SHA)
    # every git recipe's distribution was asked for; those the index lacks are passed over without a word
    assert {"flash-attn", "causal-conv1d", "mamba-ssm", "natten", "xformers", "sageattention"} <= set(index.asked)
    assert releases.run(index.url, without("2.8.3.post2")) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [new.line()] and "127.0.0.1" not in out[0] and f"sha256 {SHA}" in out[0]


def test_the_pins_that_hold_the_newest_release_say_so(serve, capsys):
    index = serve({"flash-attn": FLASH_ATTN_PAGE[:3]})
    assert releases.newer_releases(index.url, load_catalogue()) == []
    releases.run(index.url, load_catalogue())
    assert capsys.readouterr().out == "the catalogue pins the newest release the index has of each of its packages\n"


def test_a_development_pin_hides_no_release():
    fa = load_catalogue().get("flash-attn")
    assert fa.versions["main"].source_version == "2.8.4.dev0"
    assert str(releases.newest_pin(fa)) == "2.8.3.post2"  # main (2.8.4.dev0) is not a release


def test_a_page_that_is_not_pep_691_is_one_line(serve):
    index = serve({"flash-attn": None})
    with pytest.raises(CompatError, match="the flash-attn page is not PEP 691 JSON"):
        releases.newer_releases(index.url, load_catalogue())


def test_hostile_names_and_values_are_passed_over(serve):
    index = serve({"flash-attn": [
        entry("flash_attn-9.0.0.tar.gz\n--rm -rf"),
        entry("../flash_attn-9.0.1.tar.gz"),
        entry("flash_attn-9.0.2.tar.gz", hashes=["not", "a", "mapping"]),
        entry("flash_attn-" + "9" * 70 + ".tar.gz"),
    ]})
    assert releases.newer_releases(index.url, without("2.8.3.post2")) == []



def test_the_check_ends_at_the_deadline_it_is_given(serve):
    # imagegen refresh hands both halves one deadline: what the tables' half used is gone for this one.
    import time

    from imagegen import untrusted

    index = serve({"flash-attn": FLASH_ATTN_PAGE})
    spent = untrusted.Deadline(0.05)
    time.sleep(0.1)
    with pytest.raises(CompatError, match="no complete answer within the 0.05 s all requests may take"):
        releases.newer_releases(index.url, without("2.8.3.post2"), spent)
    assert index.asked == []
