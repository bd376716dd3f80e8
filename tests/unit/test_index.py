"""Tests for imagegen.publish.index: the static pip index of a wheelhouse (PEP 503 pages, PEP 691 JSON, PEP 658
metadata files, the find-links page).

Real wheels, placed the way a build places them (imagegen.wheelhouse.collect.place), and pages read back with
html.parser: what a page says (links, hashes, Requires-Python; hostile folder names, file names and metadata
escaped or left out), an unchanged index left as it is, a page that appears only once what it links to is
there and stale files that go only once nothing lists them, two writers at once that leave a consistent
index while a reader never sees a broken page, and a wheel's METADATA read within bounds."""

from __future__ import annotations

import dataclasses
import fcntl
import functools
import hashlib
import json
import multiprocessing
import os
import shutil
import threading
import time
import zipfile
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from imagegen.errors import PublishError, UnsafeValueError
from imagegen.publish import index, index_wheels
from imagegen.wheelhouse import collect
from imagegen.wheelhouse import manifest as wheelhouse
from tests.unit.executor_fixtures import WHEEL, pure_wheel, tiny_cell

TINY = "tiny-kernel"


@functools.cache
def _cell():
    return tiny_cell()


def place(out: Path, wheel: Path, folder: str | None = None) -> Path:
    """Put ``wheel`` into the wheelhouse ``out`` as a build does (collect.place: the file, then its manifest
    entry), in the fixture cell's folder or in ``folder``."""
    cell = _cell() if folder is None else dataclasses.replace(_cell(), layout=folder)
    return collect.place(out, cell, wheel, inputs="inputs", record={})


def a_wheel(tmp_path: Path, name: str = "other_project", version: str = "1.0") -> Path:
    """A real pure-Python wheel of ``name``."""
    return pure_wheel(tmp_path / "src" / f"{name}-{version}-py3-none-any.whl", {f"{name.lower()}/__init__.py": ""},
                      name=name, version=version)


def metadata_wheel(path: Path, metadata: str | bytes, *, dist_info: str | None = None,
                   members: dict[str, str] | None = None) -> Path:
    """A zip named like a wheel with ``metadata`` as its METADATA (and ``members``): what the index reads."""
    name, version = path.name.split("-")[:2]
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(f"{dist_info or f'{name}-{version}.dist-info'}/METADATA", metadata)
        for arcname, text in (members or {}).items():
            zf.writestr(arcname, text)
    return path


def _quiet(message: str) -> None:
    pass


class _Page(HTMLParser):
    """The anchors of a page (attributes and text, unescaped) and whether it ends."""

    def __init__(self) -> None:
        super().__init__()
        self.anchors: list[tuple[dict[str, str | None], str]] = []
        self.ended = False
        self._open: tuple[dict, list[str]] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self._open = (dict(attrs), [])

    def handle_data(self, data):
        if self._open is not None:
            self._open[1].append(data)

    def handle_endtag(self, tag):
        if tag == "a" and self._open is not None:
            self.anchors.append((self._open[0], "".join(self._open[1])))
            self._open = None
        elif tag == "html":
            self.ended = True


def anchors(text: str) -> list[tuple[dict[str, str | None], str]]:
    page = _Page()
    page.feed(text)
    page.close()
    assert page.ended, "a page cut short"
    return page.anchors


def target(page: Path, href: str) -> Path:
    """The file a relative ``href`` on ``page`` names."""
    return Path(os.path.normpath(page.parent / unquote(urlsplit(href).path)))


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def dangling(out: Path) -> list[str]:
    """What a reader of the index would find wrong now: a page cut short, a link to nothing (a project page,
    a wheel, its metadata file). Every project page there counts, listed or not: pip asks for
    /simple/<project>/ without reading the list. Pages not written yet are no fault."""
    wrong: list[str] = []

    def read(page: Path) -> str | None:
        try:
            return page.read_text()
        except FileNotFoundError:
            return None

    def check_wheels(page: Path, text: str) -> None:
        for attrs, _ in anchors(text):
            wheel = target(page, attrs["href"])
            for needed in (wheel, wheel.with_name(wheel.name + ".metadata")):
                if not needed.is_file():
                    wrong.append(f"{page} links to {needed}, which is not there")

    try:
        root = out / "simple" / "index.html"
        text = read(root)
        for attrs, _ in anchors(text) if text is not None else []:
            if read(target(root, attrs["href"]) / "index.html") is None:
                wrong.append(f"{root} lists {attrs['href']}, which has no page")
        for project_page in sorted(out.glob("simple/*/index.html")):
            page_text = read(project_page)
            if page_text is not None:  # not removed since the glob
                check_wheels(project_page, page_text)
        root_json = read(out / "simple" / "index.json")
        for project in json.loads(root_json)["projects"] if root_json is not None else []:
            if read(out / "simple" / project["name"] / "index.json") is None:
                wrong.append(f"{out / 'simple' / 'index.json'} lists {project['name']}, which has no JSON page")
        for page in sorted(out.glob("simple/*/index.json")):
            page_json = read(page)
            for file in json.loads(page_json)["files"] if page_json is not None else []:
                if not target(page, file["url"]).is_file():
                    wrong.append(f"{page} links to {file['url']}, which is not there")
        flat = read(out / "index.html")
        if flat is not None:
            check_wheels(out / "index.html", flat)
    except (AssertionError, ValueError) as exc:  # a page cut short, JSON that does not parse
        wrong.append(f"a broken page: {exc}")
    return wrong


def index_files(out: Path) -> dict[Path, tuple[int, int]]:
    """Every file the index wrote, with its inode and mtime (a rewrite changes both)."""
    files = [p for p in out.rglob("*") if p.is_file() and (p.name.endswith(".metadata") or "simple" in p.parts)]
    files.append(out / "index.html")
    return {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in files}


# --------------------------------------------------------------------------------------------- pages


def test_a_wheelhouse_gets_project_pages_a_project_list_json_and_a_find_links_page(tmp_path):
    out = tmp_path / "house"
    tiny = place(out, WHEEL)
    other = place(out, a_wheel(tmp_path, "Other_Project.Name", "2.0"), "others/a")
    result = index.write_index(out, say=_quiet)
    assert result.projects == {"other-project-name": [other.name], TINY: [tiny.name]}  # PEP 503 names
    assert result.wheels == 2 and result.problems == [] and result.removed == []

    root = out / "simple" / "index.html"
    assert anchors(root.read_text()) == [({"href": "other-project-name/"}, "other-project-name"),
                                         ({"href": f"{TINY}/"}, TINY)]
    assert json.loads((out / "simple" / "index.json").read_text()) == {
        "meta": {"api-version": "1.1"}, "projects": [{"name": "other-project-name"}, {"name": TINY}]}

    page = out / "simple" / TINY / "index.html"
    ((attrs, text),) = anchors(page.read_text())
    metadata = tiny.with_name(tiny.name + ".metadata")
    with zipfile.ZipFile(tiny) as zf:
        assert metadata.read_bytes() == zf.read("tiny_kernel-0.1.0+cu130torch2.11.dist-info/METADATA")
    assert text == tiny.name and target(page, attrs["href"]) == tiny
    assert attrs["href"].startswith("../../tiny-kernel-0.1.0/torch2.11/cu130/tiny_kernel-0.1.0%2Bcu130torch2.11-")
    assert urlsplit(attrs["href"]).fragment == f"sha256={wheelhouse.sha256(tiny)}"
    assert attrs == {"href": attrs["href"], "data-core-metadata": f"sha256={sha256(metadata.read_bytes())}",
                     "data-dist-info-metadata": f"sha256={sha256(metadata.read_bytes())}"}

    document = json.loads((out / "simple" / TINY / "index.json").read_text())
    assert document["meta"] == {"api-version": "1.1"} and document["name"] == TINY
    assert document["versions"] == ["0.1.0+cu130torch2.11"]
    (file,) = document["files"]
    assert file == {"filename": tiny.name, "url": attrs["href"].split("#")[0],
                    "hashes": {"sha256": wheelhouse.sha256(tiny)}, "size": tiny.stat().st_size,
                    "core-metadata": {"sha256": sha256(metadata.read_bytes())},
                    "dist-info-metadata": {"sha256": sha256(metadata.read_bytes())}}

    flat = out / "index.html"
    links = anchors(flat.read_text())
    assert [text for _, text in links] == [other.name, tiny.name]
    assert [target(flat, a["href"]) for a, _ in links] == [other, tiny]
    assert [urlsplit(a["href"]).fragment for a, _ in links] == [f"sha256={wheelhouse.sha256(w)}" for w in (other, tiny)]
    assert dangling(out) == []


def test_requires_python_reaches_the_pages_escaped(tmp_path):
    out = tmp_path / "house"
    wheel = place(out, metadata_wheel(tmp_path / "src" / "demo-1.0-py3-none-any.whl",
                                      "Metadata-Version: 2.1\nName: demo\nVersion: 1.0\nRequires-Python: >=3.8, <4\n"))
    index.write_index(out, say=_quiet)
    page = (out / "simple" / "demo" / "index.html").read_text()
    assert 'data-requires-python="&gt;=3.8, &lt;4"' in page
    ((attrs, _),) = anchors(page)
    assert attrs["data-requires-python"] == ">=3.8, <4"
    assert target(out / "simple" / "demo" / "index.html", attrs["href"]) == wheel
    (file,) = json.loads((out / "simple" / "demo" / "index.json").read_text())["files"]
    assert file["requires-python"] == ">=3.8, <4"
    assert anchors((out / "index.html").read_text())[0][0]["data-requires-python"] == ">=3.8, <4"


def test_hostile_folder_names_file_names_and_metadata_are_escaped_or_left_out(tmp_path):
    out = tmp_path / "house"
    folder = "x\"><img src=x onerror=alert(1)>&amp;%41 #?'"
    odd = place(out, a_wheel(tmp_path, "odd"), folder)
    script = '>=3.8"><script>alert(1)</script>'
    bad_python = place(out, metadata_wheel(tmp_path / "src" / "scripted-1.0-py3-none-any.whl",
                                           f"Metadata-Version: 2.1\nName: scripted\nVersion: 1.0\n"
                                           f"Requires-Python: {script}\n"), "others/scripted")
    badly_named = tmp_path / "src" / 'evil"<b>-1.0-py3-none-any.whl'
    shutil.copy(a_wheel(tmp_path, "evil"), badly_named)
    evil = place(out, badly_named, "others/evil")
    result = index.write_index(out, say=_quiet)

    assert result.projects == {"odd": [odd.name], "scripted": [bad_python.name]}
    # The wheel's name (its path's end) is in the warning whatever the length of TMPDIR (shown() cuts the middle).
    assert any(evil.name in p and "not a wheel file name an index can list" in p for p in result.problems)
    assert any("Requires-Python" in p and "not a version specifier" in p for p in result.problems)
    pages = [out / "index.html", out / "simple" / "odd" / "index.html", out / "simple" / "scripted" / "index.html"]
    for page in pages:
        text = page.read_text()
        assert "<img" not in text and "<script" not in text and "<b>" not in text, text
    ((attrs, text),) = anchors(pages[1].read_text())
    assert text == odd.name and target(pages[1], attrs["href"]) == odd  # percent-encoded, '#' and '?' included
    assert urlsplit(attrs["href"]).fragment == f"sha256={wheelhouse.sha256(odd)}"
    ((attrs, _),) = anchors(pages[2].read_text())
    assert "data-requires-python" not in attrs  # left off, as pip would ignore it
    assert dangling(out) == []


def test_a_base_url_makes_wheel_links_absolute(tmp_path):
    out = tmp_path / "house"
    tiny = place(out, WHEEL)
    result = index.write_index(out, base_url="https://wheels.example.com/house", say=_quiet)
    assert result.base_url == "https://wheels.example.com/house/"
    expected = ("https://wheels.example.com/house/tiny-kernel-0.1.0/torch2.11/cu130/"
                "tiny_kernel-0.1.0%2Bcu130torch2.11-cp311-cp311-linux_x86_64.whl")
    for page in (out / "simple" / TINY / "index.html", out / "index.html"):
        ((attrs, _),) = anchors(page.read_text())
        assert attrs["href"] == f"{expected}#sha256={wheelhouse.sha256(tiny)}"
    assert json.loads((out / "simple" / TINY / "index.json").read_text())["files"][0]["url"] == expected
    assert anchors((out / "simple" / "index.html").read_text())[0][0]["href"] == f"{TINY}/"  # served with the index


@pytest.mark.parametrize("base_url", ["javascript:alert(1)", 'https://x.example/"><a', "ftp://x.example/",
                                      "https://x.example/?page=1", "https://x.example/#top", "https://x.example/a b"])
def test_a_base_url_that_is_no_folder_url_is_refused_before_anything_is_written(tmp_path, base_url):
    out = tmp_path / "house"
    place(out, WHEEL)
    with pytest.raises(UnsafeValueError, match="--base-url") as refused:
        index.write_index(out, base_url=base_url, say=_quiet)
    assert refused.value.exit_code == 2 and "\n" not in str(refused.value)
    assert not (out / "simple").exists() and not (out / index.LOCK).exists()


# ------------------------------------------------------------------------------------ rewrites and order


def test_an_unchanged_index_is_not_rewritten_and_a_new_wheel_rewrites_only_what_lists_it(tmp_path):
    out = tmp_path / "house"
    place(out, WHEEL)
    first = index.write_index(out, say=_quiet)
    # a metadata file, the project's two pages, the list's two, the same four of cu130/simple/, the find-links page
    assert len(first.written) == 10
    before = index_files(out)
    again = index.write_index(out, say=_quiet)
    assert again.written == [] and again.removed == [] and index_files(out) == before

    other = place(out, a_wheel(tmp_path), "others/a")
    third = index.write_index(out, say=_quiet)
    simple, cu130 = out / "simple", out / "cu130" / "simple"
    assert third.written == [other.with_name(other.name + ".metadata"), simple / "other-project" / "index.json",
                             simple / "other-project" / "index.html", simple / "index.json", simple / "index.html",
                             cu130 / "other-project" / "index.json", cu130 / "other-project" / "index.html",
                             cu130 / "index.json", cu130 / "index.html", out / "index.html"]
    after = index_files(out)
    untouched = [p for p in before if p not in third.written]
    assert untouched and all(after[p] == before[p] for p in untouched)


def test_a_page_appears_only_once_what_it_links_to_is_there_and_stale_files_go_only_once_unlisted(
        tmp_path, monkeypatch):
    out = tmp_path / "house"
    tiny = place(out, WHEEL)
    other = place(out, a_wheel(tmp_path), "others/a")
    wrong: list[str] = []
    steps: list[str] = []

    def watched(name):
        real = getattr(os, name)

        def step(*args, **kwargs):
            real(*args, **kwargs)
            steps.append(f"{name} {args[-1]}")
            wrong.extend(f"after {name} {args[-1]}: {w}" for w in dangling(out))
        return step

    for name in ("replace", "unlink", "rmdir"):
        monkeypatch.setattr(os, name, watched(name))
    index.write_index(out, say=_quiet)  # everything new
    with other.open("ab") as fh:
        fh.write(b"changed since its build")  # no longer verified: its project goes
    third = place(out, a_wheel(tmp_path, "third_project"), "others/b")
    steps.append("second run")
    result = index.write_index(out, say=_quiet)  # a project added, one removed
    monkeypatch.undo()

    assert wrong == [] and len(steps) > 10, steps
    assert result.projects == {TINY: [tiny.name], "third-project": [third.name]}
    assert result.removed == [out / "simple" / "other-project", other.with_name(other.name + ".metadata")]
    assert not (out / "simple" / "other-project").exists() and other.is_file()  # the wheel itself is not ours
    assert any("changed since it was built" in p for p in result.problems)
    listed_no_more = steps.index(f"replace {out / 'simple' / 'index.html'}", steps.index("second run"))
    assert listed_no_more < steps.index(f"rmdir {out / 'simple' / 'other-project'}")


def test_a_stale_project_folder_with_files_imagegen_did_not_write_is_left_and_said(tmp_path):
    out = tmp_path / "house"
    place(out, WHEEL)
    other = place(out, a_wheel(tmp_path), "others/a")
    index.write_index(out, say=_quiet)
    (out / "simple" / "other-project" / "notes.txt").write_text("mine")
    (other.parent / "manifest.json").unlink()
    said: list[str] = []
    result = index.write_index(out, say=said.append)
    assert (out / "simple" / "other-project" / "notes.txt").read_text() == "mine"
    assert not (out / "simple" / "other-project" / "index.html").exists()
    assert result.removed == [] and result.projects == {TINY: [WHEEL.name]}
    assert said == [f"warning: {out / 'simple' / 'other-project'}: other-project is no longer in the wheelhouse, but"
                    " its folder holds files imagegen index did not write; left in place"]


def test_temporary_files_of_a_killed_run_are_swept_and_a_builds_own_are_not(tmp_path):
    out = tmp_path / "house"
    tiny = place(out, WHEEL)
    index.write_index(out, say=_quiet)
    leftovers = [out / "simple" / ".index.html.k1ll3d.partial", out / "simple" / TINY / ".index.json.k1ll3d.partial",
                 out / ".index.html.k1ll3d.partial", tiny.parent / f".{tiny.name}.metadata.k1ll3d.partial"]
    in_flight = tiny.parent / f".{tiny.name}.4242.partial"  # collect's copy of a wheel being published
    for path in (*leftovers, in_flight):
        path.write_text("half")
    index.write_index(out, say=_quiet)
    assert [p for p in leftovers if p.exists()] == [] and in_flight.read_text() == "half"


def test_a_wheel_changed_since_its_build_is_left_out_and_said(tmp_path):
    out = tmp_path / "house"
    tiny = place(out, WHEEL)
    other = place(out, a_wheel(tmp_path), "others/a")
    tiny.write_bytes(tiny.read_bytes() + b"!")
    said: list[str] = []
    result = index.write_index(out, say=said.append)
    assert result.projects == {"other-project": [other.name]}
    assert said == [f"warning: {tiny}: changed since it was built and verified (sha256 differs from"
                    f" {tiny.parent / 'manifest.json'})"]
    assert tiny.name not in (out / "index.html").read_text()


def test_one_file_name_in_two_folders_is_one_link(tmp_path):
    out = tmp_path / "house"
    first = place(out, a_wheel(tmp_path), "a")
    place(out, a_wheel(tmp_path), "b")  # the same wheel again: one link, nothing to say
    assert index.write_index(out, say=_quiet).problems == []
    changed = tmp_path / "changed" / first.name
    pure_wheel(changed, {"other_project/__init__.py": "x = 1\n"}, name="other_project")
    other = place(out, changed, "c")
    result = index.write_index(out, say=_quiet)
    assert result.projects == {"other-project": [first.name]}
    assert result.problems == [f"{other}: another wheel of the same name is indexed ({first}); left out"]
    ((attrs, _),) = anchors((out / "simple" / "other-project" / "index.html").read_text())
    assert target(out / "simple" / "other-project" / "index.html", attrs["href"]) == first


# ------------------------------------------------------------------------------------------- refusals


def test_a_wheelhouse_that_is_not_a_directory_is_refused(tmp_path):
    with pytest.raises(PublishError, match="no such directory") as missing:
        index.write_index(tmp_path / "nowhere", say=_quiet)
    assert missing.value.exit_code == 9
    (tmp_path / "file").write_text("")
    with pytest.raises(PublishError, match="is not a directory"):
        index.write_index(tmp_path / "file", say=_quiet)


def test_a_folder_that_is_no_wheelhouse_is_refused_before_anything_is_written_there(tmp_path):
    folder = tmp_path / "home"
    (folder / "notes").mkdir(parents=True)
    with pytest.raises(PublishError, match="no verified wheel to index"):
        index.write_index(folder, say=_quiet)
    assert sorted(p.name for p in folder.iterdir()) == ["notes"]


def test_once_indexed_a_wheelhouse_emptied_gets_an_empty_index(tmp_path):
    out = tmp_path / "house"
    tiny = place(out, WHEEL)
    index.write_index(out, say=_quiet)
    (tiny.parent / "manifest.json").unlink()
    result = index.write_index(out, say=_quiet)
    assert result.projects == {} and anchors((out / "simple" / "index.html").read_text()) == []
    assert anchors((out / "index.html").read_text()) == [] and not (out / "simple" / TINY).exists()


def test_nothing_is_written_outside_the_wheelhouse_through_a_symlink(tmp_path):
    out = tmp_path / "house"
    place(out, WHEEL)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (out / "simple").symlink_to(elsewhere)
    with pytest.raises(PublishError, match="simple is not a directory"):
        index.write_index(out, say=_quiet)
    assert list(elsewhere.iterdir()) == []

    (out / "simple").unlink()
    (out / "simple").mkdir()
    (out / "simple" / TINY).symlink_to(elsewhere)  # a project folder is the index's own: replaced
    index.write_index(out, say=_quiet)
    assert list(elsewhere.iterdir()) == [] and (out / "simple" / TINY / "index.html").is_file()
    assert not (out / "simple" / TINY).is_symlink()


@pytest.mark.parametrize("in_the_way, make, why", [
    ("index.html", Path.mkdir, r"cannot write the index of .*: is a directory \(.*/house/index.html\)"),
    (index.LOCK, Path.mkdir, r"cannot write the index of .*: is a directory \(.*/house/\.imagegen-index.lock\)"),
    (index.LOCK, os.mkfifo, r".*/house/\.imagegen-index.lock is not a regular file: remove it"),
])
def test_an_index_that_cannot_be_written_is_one_line(tmp_path, in_the_way, make, why):
    out = tmp_path / "house"
    place(out, WHEEL)
    make(out / in_the_way)
    with pytest.raises(PublishError, match=why) as failed:
        index.write_index(out, say=_quiet)
    assert "\n" not in str(failed.value) and failed.value.exit_code == 9
    assert [p.name for p in out.rglob("*.partial")] == []


# ---------------------------------------------------------------------------------------- two writers


def _keep_indexing(out: Path, stop, runs) -> None:
    """A writer process: index ``out`` again and again until ``stop`` is set, then once more."""
    while not stop.is_set():
        index.write_index(out, say=_quiet)
        with runs.get_lock():
            runs.value += 1
    index.write_index(out, say=_quiet)


def test_two_writers_at_once_leave_a_consistent_index_and_a_reader_never_sees_it_broken(tmp_path):
    out = tmp_path / "house"
    place(out, WHEEL)
    index.write_index(out, say=_quiet)
    context = multiprocessing.get_context("spawn")
    stop, runs = context.Event(), context.Value("i", 0)
    writers = [context.Process(target=_keep_indexing, args=(out, stop, runs)) for _ in range(2)]
    wrong: list[str] = []
    reads = 0
    reading = threading.Event()
    reading.set()

    def reader() -> None:
        nonlocal reads
        while reading.is_set():
            wrong.extend(dangling(out))
            reads += 1

    thread = threading.Thread(target=reader)
    for writer in writers:
        writer.start()
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while runs.value < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        for n in range(6):  # builds finishing while the writers index
            place(out, a_wheel(tmp_path, f"project{n}"), f"others/{n}")
            time.sleep(0.1)
        started = runs.value
        while runs.value < started + 4 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        for writer in writers:
            writer.join(60)
        reading.clear()
        thread.join(60)
    assert [w.exitcode for w in writers] == [0, 0]
    assert wrong == [] and reads > 10 and runs.value > 6, (wrong[:3], reads, runs.value)
    result = index.write_index(out, say=_quiet)
    assert result.written == [] and result.removed == []  # the last writer left the index of everything there
    assert sorted(result.projects) == [f"project{n}" for n in range(6)] + [TINY]


def test_a_second_writer_waits_for_the_first(tmp_path):
    out = tmp_path / "house"
    place(out, WHEEL)
    index.write_index(out, say=_quiet)
    said: list[str] = []
    results: list[index.IndexResult] = []
    held = os.open(out / index.LOCK, os.O_RDWR)
    fcntl.flock(held, fcntl.LOCK_EX)
    try:
        second = threading.Thread(target=lambda: results.append(index.write_index(out, say=said.append)))
        second.start()
        deadline = time.monotonic() + 30
        while not said and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)
        assert said == [f"waiting for another imagegen index of {out} to finish"] and second.is_alive() and not results
    finally:
        os.close(held)
    second.join(30)
    assert results and results[0].projects == {TINY: [WHEEL.name]}


# ------------------------------------------------------------------------------------ bounded reads


@pytest.mark.parametrize("make, why", [
    (lambda p: p.write_bytes(b"not a zip at all"), "not a zip file"),
    (lambda p: metadata_wheel(p, "Name: demo\n", members={"other-1.0.dist-info/METADATA": "Name: other\n"}),
     "2 top-level .dist-info folders"),
    (lambda p: metadata_wheel(p, "Name: demo\n", dist_info="impostor-1.0.dist-info"), "is not named after demo"),
    (lambda p: metadata_wheel(p, "Name: demo\n", dist_info="demo-1.0.dist-info/sub"), "no METADATA"),
    (lambda p: metadata_wheel(p, "Name: demo\n" + "x" * (index_wheels.MAX_METADATA_BYTES + 1)),
     f"METADATA of {index_wheels.MAX_METADATA_BYTES + 12} bytes; at most {index_wheels.MAX_METADATA_BYTES} are read"),
])
def test_a_wheel_whose_metadata_cannot_be_read_is_left_out_and_said(tmp_path, make, why):
    out = tmp_path / "house"
    place(out, WHEEL)
    source = tmp_path / "src" / "demo-1.0-py3-none-any.whl"
    source.parent.mkdir(parents=True, exist_ok=True)
    make(source)
    demo = place(out, source, "others/demo")
    result = index.write_index(out, say=_quiet)
    assert result.projects == {TINY: [WHEEL.name]}
    (problem,) = result.problems
    assert problem.startswith(f"{demo}: its METADATA cannot be read (") and problem.endswith("); left out")
    assert why in problem
    assert not demo.with_name(demo.name + ".metadata").exists()


def test_members_are_read_by_name_and_never_extracted(tmp_path):
    out = tmp_path / "house"
    escape = "../../../escaped.txt"
    demo = place(out, metadata_wheel(tmp_path / "src" / "demo-1.0-py3-none-any.whl", "Name: demo\n",
                                     members={escape: "out!", "/abs/escaped.txt": "out!"}), "others/demo")
    result = index.write_index(out, say=_quiet)
    assert result.projects == {"demo": [demo.name]} and result.problems == []
    assert list(tmp_path.rglob("escaped.txt")) == []


def test_a_folder_above_another_wheelhouses_index_or_the_home_folder_is_refused(tmp_path, monkeypatch):
    from imagegen.errors import PublishError
    from imagegen.publish.index import LOCK, write_index

    inner = tmp_path / "team" / "wheelhouse"
    inner.mkdir(parents=True)
    (inner / LOCK).write_text("")
    with pytest.raises(PublishError, match="holds another wheelhouse's index"):
        write_index(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["team"]  # nothing written above it
    monkeypatch.setenv("HOME", str(tmp_path / "team"))
    with pytest.raises(PublishError, match="your home folder"):
        write_index(tmp_path / "team")
    with pytest.raises(PublishError, match="the filesystem root"):
        write_index(Path("/"))


def test_per_cuda_indexes_list_their_variant_and_a_hostile_cuda_value_makes_none(tmp_path):
    out = tmp_path / "house"
    place(out, WHEEL)
    index.write_index(out, say=_quiet)
    page = out / "cu130" / "simple" / TINY / "index.html"
    (attrs, text), = anchors(page.read_text())
    assert text == WHEEL.name and target(page, attrs["href"]).is_file()
    assert json.loads((out / "cu130" / "simple" / "index.json").read_text())["projects"] == [{"name": TINY}]
    assert dangling(out) == []
    # A manifest whose "cuda" is no CUDA variant (a path, a long name) gives no folder of that name
    manifest = next(out.rglob("manifest.json"))
    for value in ("../../escape", "cu13000000", "CU130", 130):
        doc = json.loads(manifest.read_text())
        for entry in doc["cells"].values():
            entry["cuda"] = value
        manifest.write_text(json.dumps(doc))
        result = index.write_index(out, say=_quiet)
        assert result.cuda == {} and not (out / "cu130").exists() and result.projects == {TINY: [WHEEL.name]}
        assert not (tmp_path / "escape").exists() and sorted(p.name for p in out.iterdir() if p.name.startswith("cu")) == []


def test_a_stale_cuda_index_in_a_folder_that_also_holds_wheels_keeps_the_wheels(tmp_path):
    # a layout by CUDA puts wheels in OUT/cu130/...: when that CUDA's index goes, only its pages go
    out = tmp_path / "house"
    placed = place(out, WHEEL, "cu130/tiny")
    index.write_index(out, say=_quiet)
    assert (out / "cu130" / "simple" / TINY / "index.html").is_file()
    manifest = placed.parent / "manifest.json"
    doc = json.loads(manifest.read_text())
    for entry in doc["cells"].values():
        entry["cuda"] = "cu128"
    manifest.write_text(json.dumps(doc))
    result = index.write_index(out, say=_quiet)
    assert list(result.cuda) == ["cu128"] and not (out / "cu130" / "simple").exists() and placed.is_file()
