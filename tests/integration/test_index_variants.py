"""`imagegen index --variants` read by a real pip over HTTP: the wheelhouse of test_index_pip (the fixture's
built wheel and a pure wheel of another project) indexed with wheel variants, served by ``python -m
http.server`` on 127.0.0.1. Plain pip, which knows no variants, installs the plain wheels from the same
simple index and find-links page: it sees the variant wheels and the variants.json on the pages and skips
them (what it says at -vv), and never downloads them. The variant wheel itself, under its plain name, is a
wheel pip installs, variant.json and all.

No variant-aware installer is run: none is available here (the WheelNext pip fork predates this format,
uv's variant support is a branch); tests/unit/test_variants.py runs variantlib's own resolver instead.
Same needs as test_index_pip: pip in this interpreter, a CPython 3.11 on x86-64 Linux, no network beyond
127.0.0.1."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration.test_index_pip import (
    TINY,
    fresh_venv,
    http_server,
    imagegen,
    installed,
    pip_install,
    two_project_wheelhouse,
)

pytestmark = pytest.mark.integration


@dataclass
class Served:
    out: Path
    url: str  # where the wheelhouse is served, without the final '/'
    log: Path  # the server's request log
    tiny: Path
    variant_files: list[Path]  # the variant wheels and variants.json the index wrote


@pytest.fixture
def served(tmp_path):
    """The wheelhouse indexed with variants, served on a free port of 127.0.0.1 for the test."""
    out, tiny, _ = two_project_wheelhouse(tmp_path)
    indexed = imagegen("index", out, "--variants")
    assert indexed.returncode == 0 and indexed.stderr == "", indexed.stderr
    assert "2 variant wheels and 2 variants.json" in indexed.stdout, indexed.stdout
    variant_files = sorted(p for p in (out / "simple").glob("*/*") if p.name not in ("index.html", "index.json")
                           and not p.name.endswith(".metadata"))
    assert len(variant_files) == 4
    log = tmp_path / "http.log"
    with http_server(out, log) as url:
        yield Served(out, url, log, tiny, variant_files)


def dist_info_files(python: Path, project: str) -> list[str]:
    listed = subprocess.run([str(python), "-c", "import importlib.metadata as m, sys;"
                             f" print('\\n'.join(str(f) for f in m.files({project!r}) if '.dist-info' in str(f)))"],
                            capture_output=True, text=True)
    assert listed.returncode == 0, listed.stderr
    return [line.rsplit("/", 1)[-1] for line in listed.stdout.split()]


def no_variant_requested(served: Served) -> None:
    requests = served.log.read_text()
    for path in served.variant_files:
        assert path.name.replace("+", "%2B") not in requests, f"pip asked for {path.name}"


def test_plain_pip_installs_the_plain_wheel_from_the_simple_index_and_skips_the_variants(served, tmp_path):
    python = fresh_venv(tmp_path / "venv")
    done = pip_install(python, "-vv", "--index-url", f"{served.url}/simple/", TINY)
    assert done.returncode == 0, done.stdout + done.stderr
    assert installed(python, "tiny-kernel") == "0.1.0+cu130torch2.11"
    assert "variant.json" not in dist_info_files(python, "tiny-kernel")  # the plain wheel, not its variant
    # pip read the page with the variant links, said why it skipped each, and downloaded none of them
    (variant_wheel,) = [p.name for p in served.variant_files if p.name.startswith("tiny_kernel") and p.suffix == ".whl"]
    (variants_json,) = [p.name for p in served.variant_files if p.name.startswith("tiny_kernel") and p.suffix == ".json"]
    said = done.stdout + done.stderr
    assert re.search(rf"Skipping link: invalid wheel filename: \S*{re.escape(variant_wheel.replace('+', '%2B'))}", said)
    assert re.search(rf"Skipping link: unsupported archive format: \.json: \S*{re.escape(variants_json.replace('+', '%2B'))}",
                     said)
    assert '"GET /simple/tiny-kernel/ HTTP/1.1" 200' in served.log.read_text()
    no_variant_requested(served)


def test_plain_pip_installs_the_plain_wheels_from_the_find_links_page(served, tmp_path):
    python = fresh_venv(tmp_path / "venv")
    done = pip_install(python, "--no-index", "--find-links", f"{served.url}/index.html", TINY, "other-project==1.0")
    assert done.returncode == 0, done.stdout + done.stderr
    assert installed(python, "tiny-kernel") == "0.1.0+cu130torch2.11"
    assert installed(python, "other-project") == "1.0"
    assert "variant.json" not in dist_info_files(python, "tiny-kernel")
    no_variant_requested(served)


def test_the_variant_wheel_under_its_plain_name_is_a_wheel_pip_installs(served, tmp_path):
    """What a variant-aware installer would install: the same wheel, with variant.json in its dist-info."""
    (variant_wheel,) = [p for p in served.variant_files if p.name.startswith("tiny_kernel") and p.suffix == ".whl"]
    renamed = tmp_path / "plain" / served.tiny.name
    renamed.parent.mkdir()
    shutil.copyfile(variant_wheel, renamed)
    python = fresh_venv(tmp_path / "venv")
    done = pip_install(python, "--no-index", str(renamed))
    assert done.returncode == 0, done.stdout + done.stderr
    assert installed(python, "tiny-kernel") == "0.1.0+cu130torch2.11"
    assert "variant.json" in dist_info_files(python, "tiny-kernel")
