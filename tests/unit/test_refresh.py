"""Tests for imagegen.plan.refresh: `imagegen refresh` against a PyPI-compatible index served on 127.0.0.1 (PEP 691
JSON pages, PEP 658 metadata beside some wheels, HTTP range requests into the others, real zip wheels):
new torch series and CUDA toolkits land in the user-level overlay that imagegen.model.compat reads over
its own tables, and answers that look broken are refused with one line."""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import threading
import zipfile

import pytest

from imagegen.plan import refresh
from imagegen.cli import main
from imagegen.errors import CompatError
from imagegen.model import compat
from imagegen.model.catalogue import load_catalogue

TORCH_META = "Metadata-Version: 2.1\nName: torch\nVersion: {v}\nRequires-Dist: filelock\n{pin}\n"


def send_range(handler: http.server.BaseHTTPRequestHandler, data: bytes, header: str) -> None:
    """Answer a ``Range: bytes=LO-HI`` request for ``data`` with 206 and that span, as PyPI's file host
    does (tests/unit/test_hostile_reads.py serves wheels with it too)."""
    lo, hi = (int(x) for x in header.split("=")[1].split("-"))
    chunk = data[lo:hi + 1]
    handler.send_response(206)
    handler.send_header("Content-Range", f"bytes {lo}-{hi}/{len(data)}")
    handler.send_header("Content-Length", str(len(chunk)))
    handler.end_headers()
    handler.wfile.write(chunk)


def _wheel(name: str, version: str, metadata: str) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr(f"{name}/__init__.py", "# " + "x" * 200_000)  # big enough that a range read matters
        zf.writestr(f"{name}-{version}.dist-info/METADATA", metadata)
        zf.writestr(f"{name}-{version}.dist-info/RECORD", "")
    return buf.getvalue()


class FakeIndex:
    """torch and cuda-toolkit files of our choosing; counts full downloads of wheels (there must be none)."""

    def __init__(self) -> None:
        self.files: dict[str, dict[str, bytes]] = {"torch": {}, "cuda-toolkit": {}}
        self.pep658: set[str] = set()
        self.full_downloads: list[str] = []
        index = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                path = self.path.split("?")[0]
                if path.startswith("/simple/"):
                    project = path.strip("/").split("/")[1]
                    if project not in index.files:  # like PyPI: no page for a project it does not have
                        self.send_error(404)
                        return
                    files = [{"filename": fn, "url": f"http://127.0.0.1:{index.port}/files/{fn}", "size": len(data),
                              "hashes": {"sha256": hashlib.sha256(data).hexdigest()},
                              **({"core-metadata": True} if fn in index.pep658 else {})}
                             for fn, data in index.files.get(project, {}).items()]
                    return self._send(json.dumps({"meta": {"api-version": "1.1"}, "name": project,
                                                  "files": files}).encode(), refresh.JSON_API)
                name = path.rsplit("/", 1)[-1]
                if name.endswith(".metadata") and name[:-9] in index.pep658:
                    with zipfile.ZipFile(io.BytesIO(index._data(name[:-9]))) as zf:
                        meta = next(n for n in zf.namelist() if n.endswith("METADATA"))
                        return self._send(zf.read(meta), "text/plain")
                data = index._data(name)
                if data is None:
                    self.send_error(404)
                    return
                rng = self.headers.get("Range")
                if rng:
                    return send_range(self, data, rng)
                index.full_downloads.append(name)
                self._send(data, "application/octet-stream")

            def _send(self, body, ctype):
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/simple/"

    def _data(self, name: str) -> bytes | None:
        return next((f[name] for f in self.files.values() if name in f), None)

    def torch(self, version: str, pythons: list[int], pin: str, *, pep658: bool = True) -> None:
        for py in pythons:
            fn = f"torch-{version}-cp3{py}-cp3{py}-manylinux_2_28_x86_64.whl"
            self.files["torch"][fn] = _wheel("torch", version, TORCH_META.format(v=version, pin=pin))
            if pep658:
                self.pep658.add(fn)

    def toolkit(self, version: str) -> None:
        fn = f"cuda_toolkit-{version}-py2.py3-none-manylinux_2_27_x86_64.whl"
        self.files["cuda-toolkit"][fn] = _wheel("cuda_toolkit", version, f"Name: cuda-toolkit\nVersion: {version}\n")


@pytest.fixture
def index():
    idx = FakeIndex()
    # What imagegen's tables say today, as PyPI would list it.
    for series in compat.torch_table().values():
        major, minor = series.python
        los, his = int(major.split(".")[1]), int(minor.split(".")[1])
        cu = series.pypi_default
        pin = (f"Requires-Dist: cuda-toolkit[cudart]=={cu[2:-1]}.{cu[-1]}.*" if int(cu[2:-1]) >= 13 else
               f"Requires-Dist: nvidia-cuda-runtime-cu{cu[2:-1]}=={cu[2:-1]}.{cu[-1]}.*")
        idx.torch(series.latest, list(range(los, his + 1)), pin)
    for v in compat.cuda_table().values():
        if v.pypi_toolkit:
            idx.toolkit(v.pypi_toolkit)
    yield idx
    idx.server.shutdown()


@pytest.fixture
def overlay(tmp_path, monkeypatch):
    folder = tmp_path / "overlay"
    monkeypatch.setenv("IMAGEGEN_COMPAT_DIR", str(folder))
    compat.reload()
    yield folder
    compat.reload()


CURRENT = ("the compatibility tables are current\n"
           "the catalogue pins the newest release the index has of each of its packages\n")


def test_nothing_new_is_nothing_written(index, overlay, capsys):
    assert main(["refresh", "--index-url", index.url]) == 0
    assert capsys.readouterr().out == CURRENT and not overlay.exists()


def test_a_new_series_and_toolkit_land_in_the_overlay_and_are_used(index, overlay, capsys):
    index.torch("2.99.1", [11, 12, 13], "Requires-Dist: cuda-toolkit[cudart]==13.9.*", pep658=False)
    index.torch("2.99.0", [11], "Requires-Dist: cuda-toolkit[cudart]==13.9.*")
    index.toolkit("13.9.1")
    index.toolkit("13.9.0")
    with pytest.raises(CompatError, match="torch 2.99 is not in imagegen's compatibility table.*imagegen refresh"):
        compat.torch_series("2.99")
    assert main(["refresh", "--index-url", index.url, "--dry-run"]) == 0
    assert "torch 2.99: new, 2.99.1, Python 3.11-3.13, PyPI's variant cu139" in capsys.readouterr().out
    assert not overlay.exists()
    assert main(["refresh", "--index-url", index.url]) == 0
    out = capsys.readouterr().out
    assert "CUDA cu139: new, cuda-toolkit 13.9.1 from PyPI" in out and f"wrote {overlay / 'torch.yaml'}" in out
    assert index.full_downloads == []  # METADATA was read with range requests, the wheel never downloaded
    compat.reload()
    series, release = compat.torch_series("2.99")
    assert release == "2.99.1" and series.python == ("3.11", "3.13") and series.cuda == ("cu139",)
    assert compat.cuda_variant("cu139").pypi_toolkit == "13.9.1"
    # the plan can now use it: the pypi flavor takes its CUDA from the toolkit wheels
    assert main(["plan", "sage", "--torch", "2.99", "--cuda", "13.9", "--python", "3.12", "--arch", "9.0",
                 "--flavor", "pypi", "--json"]) == 0
    (cell,) = json.loads(capsys.readouterr().out)["cells"]
    assert cell["torch"] == "2.99.1" and cell["cuda"] == "cu139"
    # a second refresh finds nothing new and keeps the overlay
    assert main(["refresh", "--index-url", index.url]) == 0
    assert capsys.readouterr().out == CURRENT
    assert "2.99" in compat.read_overlay(overlay / "torch.yaml", "series")


def test_a_catalogue_package_with_a_newer_release_is_said_after_the_tables(index, overlay, capsys):
    # imagegen.plan.releases' own tests cover what is a release; here, the command as a user runs it.
    assert "1.7.0" in load_catalogue().get("causal-conv1d").versions  # its newest pinned release
    index.files["causal-conv1d"] = {"causal_conv1d-99.0.0.tar.gz": b"an sdist", "causal_conv1d-1.7.0.tar.gz": b"x"}
    assert main(["refresh", "--index-url", index.url, "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "the compatibility tables are current"
    assert out[1:] == [f"causal-conv1d: 99.0.0 is on the index, newer than the newest release the catalogue pins (1.7.0):"
                       f" pin its sdist causal_conv1d-99.0.0.tar.gz (sha256 {hashlib.sha256(b'an sdist').hexdigest()})"
                       " in a recipe of your own (--recipe-dir), or update imagegen"]
    assert index.full_downloads == []  # the sdist itself is never fetched


def test_a_newer_patch_release_and_toolkit_update_a_known_series(index, overlay):
    newest = max(compat.torch_table().values(), key=lambda s: s.key)
    major, minor, patch = newest.latest.split(".")
    later = f"{major}.{minor}.{int(patch) + 1}"
    cu = newest.pypi_default
    index.torch(later, [int(p.split(".")[1]) for p in newest.python], f"Requires-Dist: cuda-toolkit=={cu[2:-1]}.{cu[-1]}.*")
    torch_rows, _, changes = refresh.refresh(index.url, today="2026-11-24")
    assert torch_rows[newest.series]["latest"] == later and f"latest {newest.latest} -> {later}" in changes[-1]
    assert torch_rows[newest.series]["source"] == "imagegen refresh 2026-11-24 (PyPI)"


@pytest.mark.parametrize("setup, words", [
    (lambda i: i.torch("2.99.0", [12], "Requires-Dist: filelock"), "pins no CUDA runtime"),
    (lambda i: i.torch("2.99.0", [12], "Requires-Dist: cuda-toolkit==14.7.*"), "pins CUDA cu147, which no known toolkit"),
    (lambda i: i.files["torch"].clear(), "refusing an answer that lost most of the table"),
    (lambda i: i.files.pop("cuda-toolkit"), "HTTP 404: the index has no cuda-toolkit project page"),
])
def test_suspicious_answers_are_refused_and_nothing_is_written(index, overlay, capsys, setup, words):
    setup(index)
    assert main(["refresh", "--index-url", index.url]) == CompatError.exit_code
    err = capsys.readouterr().err
    assert err.startswith("imagegen: error: ") and words in err and err.count("\n") == 1
    assert not overlay.exists()


def test_a_release_going_backwards_or_losing_pythons_is_refused(index, overlay):
    newest = max(compat.torch_table().values(), key=lambda s: s.key)
    for fn in [f for f in index.files["torch"] if f.startswith(f"torch-{newest.latest}-")]:
        del index.files["torch"][fn]
    cu = newest.pypi_default
    index.torch(f"{newest.series}.0", [int(newest.python[0].split(".")[1])], f"Requires-Dist: cuda-toolkit=={cu[2:-1]}.{cu[-1]}.*")
    with pytest.raises(CompatError, match="older than the table's|less than the table's"):
        refresh.refresh(index.url)


def test_a_broken_overlay_is_one_line_naming_it(overlay, capsys):
    overlay.mkdir()
    (overlay / "torch.yaml").write_text("series: [1, 2]\n")
    compat.reload()
    assert main(["plan", "sage", "--arch", "9.0"]) == CompatError.exit_code
    err = capsys.readouterr().err
    assert str(overlay / "torch.yaml") in err and "not a compatibility overlay" in err and err.count("\n") == 1


def test_unreachable_index_and_bad_urls_are_one_line(overlay, capsys):
    assert main(["refresh", "--index-url", "http://127.0.0.1:9/simple/"]) == CompatError.exit_code
    assert "cannot read http://127.0.0.1:9/simple/torch/" in capsys.readouterr().err
    assert main(["refresh", "--index-url", "file:///etc"]) == 2
    assert "--index-url" in capsys.readouterr().err


def test_the_overlay_is_user_level_never_the_package(monkeypatch, tmp_path):
    monkeypatch.delenv("IMAGEGEN_COMPAT_DIR")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    assert compat.overlay_dir() == tmp_path / "cfg" / "imagegen" / "compat"
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert compat.overlay_dir() == tmp_path / "home" / ".config" / "imagegen" / "compat"
