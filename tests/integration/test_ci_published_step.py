"""The generated workflow's "Already published?" step (`imagegen ci github --skip-published URL`, issue 36
item 3), run as a runner runs it: its bash, taken from the workflow imagegen wrote (the bake file printed by
the real buildx), with the real curl against a real HTTP server on 127.0.0.1 serving a published wheelhouse
(each folder's manifest.json, as `imagegen collect` writes it). A cell published with the same inputs hash
and its wheel is not built again and the job says so; a new hash, a folder not there, a manifest that is not
one and a server that does not answer all build. Then the publish job's Collect step with nothing uploaded:
nothing to publish, said, and not an error."""

from __future__ import annotations

import functools
import json
import os
import socket
import subprocess
import sys
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.integration
IMAGEGEN = str(Path(sys.executable).parent / "imagegen")
CELL = ["fa2", "--torch", "2.8", "--cuda", "12.8", "--arch", "8.0", "--flavor", "manylinux"]


@pytest.fixture(scope="module")
def workflow(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("published-workflow")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    for argv in (["bake", *CELL, "-f", "bake.json"],
                 ["ci", "github", "-o", "wf.yml", "--bake-file", "bake.json", "--skip-published",
                  "http://127.0.0.1:1/whl", "--publish", "s3://bucket/whl", "--imagegen-from",
                  "imagegen-wheels[publish] @ git+https://github.com/octo/imagegen@v0.1.0"]):
        proc = subprocess.run([IMAGEGEN, *argv], cwd=root, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
    doc = yaml.safe_load((root / "wf.yml").read_text())
    (row,) = doc["jobs"]["build"]["strategy"]["matrix"]["include"]
    steps = {s["name"]: s for s in doc["jobs"]["build"]["steps"]}
    publish = {s["name"]: s for s in doc["jobs"]["publish"]["steps"]}
    return {"row": row, "step": steps["Already published?"], "collect": publish["Collect"]}


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A static server of a published wheelhouse folder on 127.0.0.1."""
    site = tmp_path_factory.mktemp("published-site")
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(site)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield {"site": site, "url": f"http://127.0.0.1:{httpd.server_address[1]}/whl"}
    httpd.shutdown()


def publish(site: Path, row: dict, entry: object) -> None:
    folder = site / "whl" / row["published"]
    folder.mkdir(parents=True, exist_ok=True)
    text = entry if isinstance(entry, str) else json.dumps({"schema": 1, "cells": {row["target"]: entry}})
    (folder / "manifest.json").write_text(text)


def run_step(step: dict, row: dict, url: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess, str]:
    output = tmp_path / "github_output"
    output.write_text("")
    env = {**os.environ, "TARGET": row["target"], "INPUTS": row["inputs"], "FOLDER": row["published"],
           "PUBLISHED": url, "GITHUB_OUTPUT": str(output), "RUNNER_TEMP": str(tmp_path)}
    proc = subprocess.run(["bash", "-e", "-c", step["run"]], env=env, capture_output=True, text=True, timeout=300)
    return proc, output.read_text()


def test_the_matrix_row_carries_the_cells_inputs_hash_and_folder(workflow):
    row = workflow["row"]
    assert len(row["inputs"]) == 16 and row["published"] == "flash-attn-2.8.3/torch2.8/cu128"


def test_a_cell_published_with_the_same_inputs_is_not_built_again(workflow, server, tmp_path):
    row = workflow["row"]
    publish(server["site"], row, {"inputs": row["inputs"], "wheel": "flash_attn-2.8.3-cp312-linux_x86_64.whl"})
    proc, output = run_step(workflow["step"], row, server["url"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert output == "skip=true\n"
    assert f"::notice::{row['target']}: already published with these inputs ({row['inputs']})" in proc.stdout


@pytest.mark.parametrize("entry, says", [
    ({"inputs": "0" * 16, "wheel": "flash_attn-2.8.3-cp312-linux_x86_64.whl"}, "lists no wheel with these inputs"),
    ({"inputs": None, "wheel": None}, "lists no wheel with these inputs"),
    ("{not json", "lists no wheel with these inputs"),
    ("[" * 100000 + "]" * 100000, "lists no wheel with these inputs"),  # too deep for json: no traceback
])
def test_a_changed_or_unreadable_entry_is_built(workflow, server, tmp_path, entry, says):
    row = workflow["row"]
    if isinstance(entry, dict) and entry["inputs"] is None:
        entry = {"inputs": row["inputs"]}  # the hash, but no wheel listed: not published
    publish(server["site"], row, entry)
    proc, output = run_step(workflow["step"], row, server["url"], tmp_path)
    assert proc.returncode == 0 and output == "skip=false\n", proc.stdout + proc.stderr
    assert says in proc.stdout and "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def test_a_folder_not_published_yet_is_built(workflow, server, tmp_path):
    row = workflow["row"]
    proc, output = run_step(workflow["step"], row, server["url"] + "/elsewhere", tmp_path)
    assert proc.returncode == 0 and output == "skip=false\n", proc.stdout + proc.stderr
    assert f"{row['target']}: not published yet (" in proc.stdout and "::warning::" not in proc.stdout


def test_a_server_that_does_not_answer_is_built_with_a_warning(workflow, tmp_path):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc, output = run_step(workflow["step"], workflow["row"], f"http://127.0.0.1:{port}/whl", tmp_path)
    assert proc.returncode == 0 and output == "skip=false\n", proc.stdout + proc.stderr
    assert "::warning::" in proc.stdout and "cannot be read" in proc.stdout


def test_the_publish_job_with_nothing_uploaded_publishes_nothing_and_says_so(workflow, tmp_path):
    output = tmp_path / "github_output"
    output.write_text("")
    env = {**os.environ, "GITHUB_OUTPUT": str(output), "RUNNER_TEMP": str(tmp_path)}
    proc = subprocess.run(["bash", "-e", "-c", workflow["collect"]["run"]], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and output.read_text() == "none=true\n", proc.stdout + proc.stderr
    assert "::notice::nothing new to publish" in proc.stdout
