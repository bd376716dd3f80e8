"""imagegen.publish.index_pages: the pages of the static index, from the wheels as the index read them.
(What the whole index writes, and pip reading it, is tests/unit/test_index.py and
tests/integration/test_index_pip.py.)"""

from __future__ import annotations

import json
from pathlib import Path

from packaging.version import Version

from imagegen.publish import index_pages as pages


def _wheel(name: str = "demo-1.0-py3-none-any.whl", url_path: str = "demo/demo-1.0-py3-none-any.whl",
           requires_python: str | None = ">=3.9") -> pages.IndexedWheel:
    return pages.IndexedWheel(path=Path("/out") / url_path, url_path=url_path, project="demo", version=Version("1.0"),
                              sha256="ab" * 32, size=123, requires_python=requires_python, metadata=b"Name: demo\n")


def test_a_project_page_links_each_wheel_with_its_hash_metadata_and_python_relative_to_its_depth():
    wheel = _wheel()
    text = pages.project_html("demo", [wheel], None).decode()
    assert f'href="../../demo/demo-1.0-py3-none-any.whl#sha256={"ab" * 32}"' in text
    assert 'data-requires-python="&gt;=3.9"' in text
    assert f'data-core-metadata="sha256={wheel.metadata_sha256}"' in text
    # a per-CUDA page is one folder deeper; a base URL makes the links absolute
    assert 'href="../../../demo/' in pages.project_html("demo", [wheel], None, up="../../../").decode()
    assert 'href="https://h.example/w/demo/' in pages.project_html("demo", [wheel], "https://h.example/w/").decode()
    assert wheel.metadata_path == Path("/out/demo/demo-1.0-py3-none-any.whl.metadata")


def test_text_that_reaches_a_page_is_escaped():
    wheel = _wheel(name='x"><script>.whl', url_path="demo/x%22%3E%3Cscript%3E.whl", requires_python='<4"><b>')
    text = pages.project_html("demo", [wheel], None).decode()
    assert "<script>" not in text and "<b>" not in text and "&lt;4&quot;&gt;&lt;b&gt;" in text


def test_the_json_page_says_the_same_as_pep_691_and_700():
    doc = json.loads(pages.project_json("demo", [_wheel()], None))
    assert doc["meta"] == {"api-version": pages.API_VERSION} and doc["versions"] == ["1.0"]
    (entry,) = doc["files"]
    assert entry["url"] == "../../demo/demo-1.0-py3-none-any.whl" and entry["size"] == 123
    assert entry["hashes"] == {"sha256": "ab" * 32} and entry["requires-python"] == ">=3.9"
    assert entry["core-metadata"] == entry["dist-info-metadata"] == {"sha256": _wheel().metadata_sha256}


def test_a_reused_wheel_is_marked_beside_its_link_and_in_the_json():
    import dataclasses
    wheel = dataclasses.replace(_wheel(), reused="built for torch 2.11, checked against torch <2.14>")
    text = pages.find_links_html([wheel], None).decode()
    assert 'data-imagegen-reused="built for torch 2.11, checked against torch &lt;2.14&gt;"' in text
    assert "</a> (reused: built for torch 2.11, checked against torch &lt;2.14&gt;)<br>" in text
    assert json.loads(pages.project_json("demo", [wheel], None))["files"][0]["_imagegen_reused"].startswith("built")
    plain = pages.find_links_html([_wheel()], None).decode()
    assert "reused" not in plain
