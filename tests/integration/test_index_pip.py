"""`imagegen index` read by a real pip over HTTP: a wheelhouse of two real wheels (the fixture's built wheel,
placed as a build places it, and a pure wheel of another project), indexed through the CLI and served by
``python -m http.server`` on 127.0.0.1, then installed with ``pip install --no-deps`` into fresh venvs from the
simple index and from the find-links page; a wheel changed after indexing is refused on its hash.

Needs pip in this interpreter (it installs into each fresh venv with ``--python``) and a CPython 3.11 on
x86-64 Linux (the fixture wheel's tags): a missing one fails the tests, it is not a skip. No network beyond
127.0.0.1, no torch."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from imagegen.wheelhouse import manifest as wheelhouse
from imagegen.wheelhouse import collect
from tests.unit.executor_fixtures import WHEEL, pure_wheel, tiny_cell

pytestmark = pytest.mark.integration
IMAGEGEN = str(Path(sys.executable).parent / "imagegen")
TINY = "tiny-kernel==0.1.0+cu130torch2.11"


@dataclass
class Served:
    out: Path
    url: str  # where the wheelhouse is served, without the final '/'
    log: Path  # the server's request log
    tiny: Path
    other: Path


def two_project_wheelhouse(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A wheelhouse as builds leave it: the fixture kernel's wheel and a pure wheel of another project,
    each in its cell folder with its manifest. (wheelhouse, the kernel's wheel, the other wheel)"""
    out = tmp_path / "house"
    tiny = collect.place(out, tiny_cell(), WHEEL, inputs="inputs", record={})
    source = pure_wheel(tmp_path / "src" / "other_project-1.0-py3-none-any.whl", {"other_project/__init__.py": ""},
                        name="other_project")
    other = collect.place(out, dataclasses.replace(tiny_cell(), layout="others/a"), source, inputs="i", record={})
    return out, tiny, other


@contextmanager
def http_server(folder: Path, log: Path) -> Iterator[str]:
    """``python -m http.server`` serving ``folder`` on a free port of 127.0.0.1, its requests logged to
    ``log``: its URL (without the final '/'); stopped after."""
    with log.open("w") as log_file:
        server = subprocess.Popen([sys.executable, "-u", "-m", "http.server", "0", "--bind", "127.0.0.1", "--directory",
                                   str(folder)], stdout=subprocess.PIPE, stderr=log_file, text=True)
    try:
        banner = server.stdout.readline()  # "Serving HTTP on 127.0.0.1 port 41234 (http://127.0.0.1:41234/) ..."
        port = re.search(r" port (\d+) ", banner)
        assert port, f"python -m http.server did not start: {banner!r} {log.read_text()[-500:]}"
        yield f"http://127.0.0.1:{port.group(1)}"
    finally:
        server.terminate()
        server.wait(30)
        server.stdout.close()


@pytest.fixture
def served(tmp_path):
    """The indexed wheelhouse, served on a free port of 127.0.0.1 for the test, stopped after it."""
    out, tiny, other = two_project_wheelhouse(tmp_path)
    indexed = imagegen("index", out)
    assert indexed.returncode == 0 and indexed.stderr == "", indexed.stderr
    log = tmp_path / "http.log"
    with http_server(out, log) as url:
        yield Served(out, url, log, tiny, other)


def imagegen(*argv) -> subprocess.CompletedProcess:
    return subprocess.run([IMAGEGEN, *map(str, argv)], capture_output=True, text=True, timeout=120)


def fresh_venv(path: Path) -> Path:
    """A new venv without pip (pip installs into it from outside): its interpreter."""
    made = subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    return path / "bin" / "python"


def pip_install(python: Path, *args: str) -> subprocess.CompletedProcess:
    """pip install --no-deps into ``python``'s venv, with no configuration, cache or PIP_* variable of this host."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    return subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "--isolated", "--no-input",
                           "--disable-pip-version-check", "--no-cache-dir", "install", "--no-deps", *args],
                          capture_output=True, text=True, env=env, timeout=300)


def installed(python: Path, project: str) -> str:
    shown = subprocess.run([str(python), "-c", f"import importlib.metadata as m; print(m.version({project!r}))"],
                           capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    return shown.stdout.strip()


def test_pip_installs_from_the_simple_index_resolving_from_the_metadata_file(served, tmp_path):
    python = fresh_venv(tmp_path / "venv")
    done = pip_install(python, "--index-url", f"{served.url}/simple/", TINY)
    assert done.returncode == 0, done.stdout + done.stderr
    assert installed(python, "tiny-kernel") == "0.1.0+cu130torch2.11"
    requests = served.log.read_text()
    assert '"GET /simple/tiny-kernel/ HTTP/1.1" 200' in requests
    # PEP 658: pip read the metadata file before it downloaded the wheel.
    metadata = requests.index(f"/tiny-kernel-0.1.0/torch2.11/cu130/{served.tiny.name.replace('+', '%2B')}.metadata ")
    assert metadata < requests.index(f"/tiny-kernel-0.1.0/torch2.11/cu130/{served.tiny.name.replace('+', '%2B')} ")


def test_pip_installs_from_the_find_links_page(served, tmp_path):
    python = fresh_venv(tmp_path / "venv")
    done = pip_install(python, "--no-index", "--find-links", f"{served.url}/index.html", TINY, "other-project==1.0")
    assert done.returncode == 0, done.stdout + done.stderr
    assert installed(python, "tiny-kernel") == "0.1.0+cu130torch2.11"
    assert installed(python, "other-project") == "1.0"


def test_pip_refuses_a_wheel_changed_after_indexing_and_a_new_index_leaves_it_out(served, tmp_path):
    indexed_hash = wheelhouse.sha256(served.other)
    with served.other.open("ab") as fh:
        fh.write(b"changed after indexing")
    python = fresh_venv(tmp_path / "venv")
    refused = pip_install(python, "--index-url", f"{served.url}/simple/", "other-project==1.0")
    assert refused.returncode != 0
    assert "DO NOT MATCH THE HASHES" in refused.stderr and f"Expected sha256 {indexed_hash}" in refused.stderr, \
        refused.stderr

    again = imagegen("index", served.out)
    assert again.returncode == 0
    assert again.stderr == (f"imagegen: warning: {served.other}: changed since it was built and verified (sha256"
                            f" differs from {served.other.parent / 'manifest.json'})\n")
    gone = pip_install(python, "--index-url", f"{served.url}/simple/", "other-project==1.0")
    assert gone.returncode != 0 and "No matching distribution found for other-project==1.0" in gone.stderr, gone.stderr


def test_pip_given_a_cuda_variants_index_installs_that_variants_wheel(tmp_path):
    # Issue 36 item 4: a wheelhouse with one project built for two CUDA variants. From the flat index pip
    # takes the highest version (+cu130); from OUT/cu128/simple/ it can only see, and so installs, cu128's.
    from imagegen.model import compat
    out = tmp_path / "house"
    for cuda, dotted in (("cu128", "12.8"), ("cu130", "13.0")):
        source = pure_wheel(tmp_path / "src" / cuda / f"demo-1.0+{cuda}-py3-none-any.whl", {"demo/__init__.py": ""},
                            name="demo", version=f"1.0+{cuda}")
        cell = dataclasses.replace(tiny_cell(), cuda=compat.cuda_variant(dotted), layout=f"demo/{cuda}")
        collect.place(out, cell, source, inputs=cuda, record={})
    indexed = imagegen("index", out)
    assert indexed.returncode == 0, indexed.stderr
    assert "/cu128/simple/ PROJECT   (only the cu128 wheels)" in indexed.stdout
    with http_server(out, tmp_path / "http.log") as url:
        for index_url, want in ((f"{url}/simple/", "1.0+cu130"), (f"{url}/cu128/simple/", "1.0+cu128"),
                                (f"{url}/cu130/simple/", "1.0+cu130")):
            python = fresh_venv(tmp_path / f"venv-{want}-{index_url.count('cu')}")
            done = pip_install(python, "--index-url", index_url, "demo")
            assert done.returncode == 0, done.stdout + done.stderr
            assert installed(python, "demo") == want, index_url
    # The cu128 wheel gone from the wheelhouse: its CUDA's index goes with it, the other stays.
    shutil.rmtree(out / "demo" / "cu128")
    again = imagegen("index", out, "--json")
    assert again.returncode == 0, again.stderr
    assert not (out / "cu128").exists() and (out / "cu130" / "simple" / "demo" / "index.html").is_file()
