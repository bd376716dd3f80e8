"""A recipe version's sdist (``--fetch sdist``): recipe data, what the plan and the rendered builder
carry, and the in-build fetch against a real HTTP server on loopback: the sha256 pin, a PyPI mirror
given as PIP_INDEX_URL, and archives that try to write outside the source folder.

The catalogue recipe fetched from real PyPI is in tests/integration/test_audit.py (native) and
tests/integration/test_engine_audit.py (inside its builder image).
"""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import io
import json
import socket
import subprocess
import sys
import tarfile
import threading
import zipfile
from pathlib import Path

import pytest

from imagegen.cli import main
from imagegen.errors import RecipeError
from imagegen.model.catalogue import load_catalogue
from imagegen.model.recipe_file import load_recipe_file
from imagegen.model.recipes import fetched_from
from imagegen.render.dockerfile import builder_files

ROOT = Path(__file__).resolve().parents[2]
CELL = ["--torch", "2.11", "--cuda", "13.0", "--python", "3.11", "--flavor", "pypi", "--arch", "8.0;9.0"]


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 0
    return code, out.getvalue(), err.getvalue()


# ------------------------------------------------------------------------------ recipe data and plan

RECIPE = """\
schema: 1
name: demo
source: {git: https://example.com/demo.git}
versions:
  "1.0":
    ref: v1.0
    archs: ["8.0", "9.0"]
    sdist: %s
arch: {env: TORCH_CUDA_ARCH_LIST, style: torch, ptx: honoured}
smoke: {imports: [demo]}
"""
GOOD_SDIST = "{url: https://files.example.org/packages/aa/demo-1.0.tar.gz, sha256: %s}" % ("ab" * 32)


def recipe_file(tmp_path: Path, sdist: str) -> Path:
    path = tmp_path / "demo.yaml"
    path.write_text(RECIPE % sdist)
    return path


def test_a_version_names_its_sdist_and_fetch_sdist_selects_it(tmp_path):
    recipe = load_recipe_file(recipe_file(tmp_path, GOOD_SDIST))
    version = recipe.version("1.0")
    assert version.sdist.filename == "demo-1.0.tar.gz" and version.sdist.sha256 == "ab" * 32
    assert fetched_from(recipe, version, None) == (recipe, version)
    assert fetched_from(recipe, version, "git") == (recipe, version)
    r, v = fetched_from(recipe, version, "sdist")
    assert r.source_kind == "sdist" and r.source_url == version.sdist.url and not r.submodules
    assert v.ref == "demo-1.0.tar.gz" and v.commit is None and v.archs == version.archs


@pytest.mark.parametrize("sdist, words", [
    ("{url: http://files.example.org/demo-1.0.tar.gz, sha256: %s}" % ("ab" * 32), "versions.1.0.sdist.url"),
    ("{url: https://files.example.org/demo-1.0.whl, sha256: %s}" % ("ab" * 32), "versions.1.0.sdist.url"),
    ("{url: 'https://x.org/demo-1.0.tar.gz;rm -rf /', sha256: %s}" % ("ab" * 32), "versions.1.0.sdist.url"),
    ("{url: https://files.example.org/demo-1.0.tar.gz, sha256: abc}", "versions.1.0.sdist.sha256"),
    ("{url: https://files.example.org/demo-1.0.tar.gz}", "versions.1.0.sdist.sha256"),
    ("{url: https://files.example.org/demo-1.0.tar.gz, sha256: %s, md5: x}" % ("ab" * 32), "versions.1.0.sdist.md5"),
    ("[https://files.example.org/demo-1.0.tar.gz]", "versions.1.0.sdist"),
])
def test_bad_sdist_entries_are_refused_with_their_key(tmp_path, sdist, words):
    with pytest.raises(RecipeError) as info:
        load_recipe_file(recipe_file(tmp_path, sdist))
    assert words in str(info.value) and "\n" not in str(info.value)


def test_fetch_sdist_where_there_is_none_is_one_line(tmp_path):
    code, out, err = run("plan", "sage", "--fetch", "sdist", *CELL)
    assert code == 2 and out == ""
    assert err.startswith("imagegen: error: sageattention 2.2.0 names no sdist") and len(err.splitlines()) == 1
    code, _, err = run("plan", "--source", str(ROOT / "tests" / "fixtures" / "tiny_kernel"), "--fetch", "sdist", *CELL)
    assert code == 2 and "local source tree" in err and len(err.splitlines()) == 1
    code, _, err = run("plan", "causal-conv1d", "--fetch", "svn", *CELL)
    assert code == 2 and "invalid choice" in err


def test_render_and_plan_carry_the_sdist_and_its_pin(tmp_path):
    version = load_catalogue().get("causal-conv1d").version("1.6.1")
    code, out, err = run("render", "causal-conv1d", "--fetch", "sdist", *CELL, "-o", str(tmp_path / "sdist" / "Dockerfile"))
    assert code == 0, err
    out = (tmp_path / "sdist" / "Dockerfile").read_text()
    assert f"#   source  {version.sdist.url}\n" in out  # its sha256 is the cell file's, checked below
    (cell_file,) = (tmp_path / "sdist").glob("*/cell.json")
    doc = json.loads(cell_file.read_text())
    assert doc["source"] == {"kind": "sdist", "url": version.sdist.url, "ref": "causal_conv1d-1.6.1.tar.gz",
                             "commit": None, "submodules": False, "subdir": "", "sha256": version.sdist.sha256}
    # The fetch step sees the package index (a PyPI mirror) as well as the CA bundle.
    fetch = out[out.index("FROM os AS fetch"):out.index("imagegen_build.py fetch")]
    assert "id=pip_cert" in fetch and "id=pip_index_url" in fetch
    git_code, _, _ = run("render", "causal-conv1d", *CELL, "-o", str(tmp_path / "git" / "Dockerfile"))
    (cell_file,) = (tmp_path / "git").glob("*/cell.json")
    git = json.loads(cell_file.read_text())["source"]
    assert git_code == 0 and git["kind"] == "git" and git["commit"] == version.commit


@pytest.mark.parametrize("shell", ["powershell", "cmd"])
@pytest.mark.parametrize("argv", [["causal-conv1d", "--fetch", "sdist"], ["causal-conv1d", "--version", "1.7.0"],
                                  ["flash-attn", "--version", "2.8.3.post2"]])
def test_a_windows_script_carries_the_pinned_sdist_and_the_module_that_fetches_it(argv, shell, tmp_path):
    # The newest releases pinned by their sdist alone (causal-conv1d 1.7.0, flash-attn 2.8.3.post2: their tags are
    # not in the git mirror) and --fetch sdist: the script's document names the file and its sha256, and the
    # helper gets the shared sdist module beside it (it used to refuse: "a Windows script clones the recipe's git
    # source: leave out --fetch sdist", even where no --fetch was given).
    from tests.unit.test_seed_workflows import cmd_blocks, ps_blocks

    script = tmp_path / ("build.ps1" if shell == "powershell" else "build.cmd")
    code, _, err = run("render", *argv, "--shell", shell, "--arch", "8.0", "--torch", "2.8", "--cuda", "12.8",
                       "-o", str(script))
    assert code == 0, err
    text = script.read_bytes().decode()
    blocks = ps_blocks(text) if shell == "powershell" else cmd_blocks(text)
    recipe = load_catalogue().get(argv[0])
    version = recipe.version(argv[2] if argv[1] == "--version" else None)
    source = json.loads(blocks["build.json"])["source"]
    assert (source["kind"], source["url"], source["sha256"]) == ("sdist", version.sdist.url, version.sdist.sha256)
    assert source["ref"] == version.sdist.url.rsplit("/", 1)[-1]
    shipped = ROOT / "imagegen" / "shipped" / "builder" / "imagegen_sdist.py"
    assert blocks["imagegen_sdist.py"] == shipped.read_text()


WINDOWS_RECIPE = """\
schema: 1
name: demo
source: {git: https://example.com/demo.git}
versions:
  "1.0":
    archs: ["8.0", "9.0"]
    sdist: {url: %s, sha256: "%s"}
    patches: [{file: demo-sm90.patch, reason: the archs}]
arch: {env: TORCH_CUDA_ARCH_LIST, style: torch, ptx: honoured}
smoke: {imports: [demo]}
"""
DEMO_PATCH = """\
--- a/setup.py
+++ b/setup.py
@@ -1 +1 @@
-ARCHS = ['8.0']
+ARCHS = ['8.0', '9.0']
"""


def windows_script_for_sdist(tmp_path: Path, digest: str) -> Path:
    """A PowerShell script rendered for a recipe pinned by its sdist alone, with its helper, the helper's
    modules and build.json written out as the script writes them: the folder they are in."""
    from tests.unit.test_seed_workflows import ps_blocks

    recipes = tmp_path / "recipes"
    (recipes / "patches").mkdir(parents=True)
    (recipes / "demo.yaml").write_text(WINDOWS_RECIPE % ("https://files.example.org/packages/demo-1.0.tar.gz", digest))
    (recipes / "patches" / "demo-sm90.patch").write_text(DEMO_PATCH)
    script = tmp_path / "build.ps1"
    code, _, err = run("render", "demo", "--recipe-dir", str(recipes), "--shell", "powershell", "--arch", "8.0",
                       "--torch", "2.8", "--cuda", "12.8", "-o", str(script))
    assert code == 0, err
    work = tmp_path / "imagegen-windows"
    work.mkdir()
    for name, text in ps_blocks(script.read_text()).items():
        (work / name).write_text(text)
    return work


def windows_fetch(work: Path, mirror: str, *extra: str) -> subprocess.CompletedProcess:
    """The script's own fetch line, with the helper as the script writes it, on a machine whose pip is
    pointed at a PyPI mirror (PIP_INDEX_URL, here a server on loopback: the recipe's URL is never asked)."""
    return subprocess.run([sys.executable, str(work / "imagegen_windows.py"), "fetch", "--doc", str(work / "build.json"),
                           *extra], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "PIP_INDEX_URL": mirror + "/simple"})


PAGE = b'<html><body><a href="../../packages/demo-1.0.tar.gz#sha256=x">demo-1.0.tar.gz</a></body></html>'


def test_the_windows_helper_downloads_checks_unpacks_and_patches_the_pinned_sdist(tmp_path):
    data = tar_gz({"setup.py": b"ARCHS = ['8.0']\n", "demo/__init__.py": b""})
    with Files({"/simple/demo/": PAGE, "/packages/demo-1.0.tar.gz": data}) as mirror:
        work = windows_script_for_sdist(tmp_path, sha(data))
        src = work / "src"
        proc = windows_fetch(work, mirror.url, "--src", str(src))
        assert proc.returncode == 0, proc.stderr
        assert "sha256 ok" in proc.stdout and (src / "setup.py").read_text() == "ARCHS = ['8.0', '9.0']\n"
        again = windows_fetch(work, mirror.url, "--src", str(src))  # run again: nothing downloaded, the patch kept
        assert again.returncode == 0 and "already present" in again.stdout and "already in the source" in again.stdout
        assert mirror.asked == ["/simple/demo/", "/packages/demo-1.0.tar.gz"]
        # --src-dir on an empty folder of the user's: unpacked there, patched only in the build's copy
        theirs, copy = tmp_path / "theirs", work / "copy"
        theirs.mkdir()
        proc = windows_fetch(work, mirror.url, "--src", str(theirs), "--copy", str(copy))
        assert proc.returncode == 0, proc.stderr
        assert (theirs / "setup.py").read_text() == "ARCHS = ['8.0']\n"
        assert (copy / "setup.py").read_text() == "ARCHS = ['8.0', '9.0']\n"
        assert "copying the fetched tree" in proc.stdout and "go on the build's copy, not on" in proc.stdout


def test_the_windows_helper_refuses_a_changed_sdist_and_an_archive_that_leaves_its_folder(tmp_path):
    good = tar_gz({"setup.py": b"ARCHS = ['8.0']\n"})
    evil = tar_gz({"../../escaped.py": b"x"})
    with Files({"/simple/demo/": PAGE, "/packages/demo-1.0.tar.gz": good}) as mirror:
        work = windows_script_for_sdist(tmp_path, "0" * 64)
        proc = windows_fetch(work, mirror.url, "--src", str(work / "src"))
    assert proc.returncode == 1 and f"has sha256 {sha(good)}, not the pinned {'0' * 64}: refusing it" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    with Files({"/simple/demo/": PAGE, "/packages/demo-1.0.tar.gz": evil}) as mirror:
        work = windows_script_for_sdist(tmp_path / "b", sha(evil))
        proc = windows_fetch(work, mirror.url, "--src", str(work / "src"))
    assert proc.returncode == 1 and "would land outside the source folder: refused" in proc.stderr
    assert not list(tmp_path.rglob("escaped.py"))


# ------------------------------------------------------------------------- the in-build fetch step


def tar_gz(members: dict[str, bytes], *, links: dict[str, str] | None = None, top: str = "demo-1.0") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(f"{top}/{name}" if top else name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(f"{top}/{name}")
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tf.addfile(info)
    return buf.getvalue()


class Files:
    """A real HTTP server on loopback serving ``files`` (path -> bytes); it records what was asked."""

    def __init__(self, files: dict[str, bytes | int]):
        self.files, self.asked = files, []

    def __enter__(self) -> "Files":
        files, asked = self.files, self.asked

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                asked.append(self.path)
                body = files.get(self.path)
                if isinstance(body, int):  # a status of its own (401: a private index without credentials)
                    self.send_response(body)
                    self.end_headers()
                    return
                self.send_response(200 if body is not None else 404)
                self.end_headers()
                if body is not None:
                    self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def fetch(tmp_path: Path, url: str, data_sha: str, *, filename: str = "demo-1.0.tar.gz", env: dict | None = None,
          src: Path | None = None) -> subprocess.CompletedProcess:
    for name, text in builder_files().items():
        (tmp_path / name).write_text(text)
    script = tmp_path / "imagegen_build.py"
    cell = {"recipe": "demo", "distribution": "Demo_Pkg", "src_dir": str(src or tmp_path / "src"), "patches": [],
            "source": {"kind": "sdist", "url": url, "ref": filename, "sha256": data_sha}}
    (tmp_path / "cell.json").write_text(json.dumps(cell))
    return subprocess.run([sys.executable, str(script), "--cell", str(tmp_path / "cell.json"), "fetch"],
                          capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin", **(env or {})})


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_the_sdist_is_downloaded_checked_and_unpacked_once(tmp_path):
    data = tar_gz({"setup.py": b"# demo\n", "csrc/k.cu": b"__global__ void k() {}\n"})
    with Files({"/packages/demo-1.0.tar.gz": data}) as server:
        proc = fetch(tmp_path, server.url + "/packages/demo-1.0.tar.gz", sha(data))
        assert proc.returncode == 0, proc.stderr
        assert (tmp_path / "src" / "setup.py").read_bytes() == b"# demo\n"
        assert (tmp_path / "src" / "csrc" / "k.cu").is_file()
        assert "sha256 ok" in proc.stdout
        again = fetch(tmp_path, server.url + "/packages/demo-1.0.tar.gz", sha(data))
        assert again.returncode == 0 and "already present" in again.stdout
        assert server.asked == ["/packages/demo-1.0.tar.gz"]  # the second fetch downloaded nothing
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".sdist-")]  # no temporary folder left


def test_a_changed_upload_is_refused_and_nothing_is_unpacked(tmp_path):
    data = tar_gz({"setup.py": b"# evil\n"})
    with Files({"/demo-1.0.tar.gz": data}) as server:
        proc = fetch(tmp_path, server.url + "/demo-1.0.tar.gz", "0" * 64)
    assert proc.returncode != 0
    assert f"has sha256 {sha(data)}, not the pinned {'0' * 64}: refusing it" in proc.stderr
    assert not (tmp_path / "src").exists() or not list((tmp_path / "src").iterdir())


def test_the_package_index_given_to_the_build_is_asked_first(tmp_path):
    # A PyPI mirror (PIP_INDEX_URL, the pip_index_url secret): its project page lists the file; the
    # recipe's own URL (here a dead port) is never needed.
    data = tar_gz({"setup.py": b"# from the mirror\n"})
    page = b'<html><body><a href="../../files/demo-1.0.tar.gz#sha256=x">demo-1.0.tar.gz</a></body></html>'
    with Files({"/simple/demo-pkg/": page, "/files/demo-1.0.tar.gz": data}) as mirror:
        proc = fetch(tmp_path, "http://127.0.0.1:9/demo-1.0.tar.gz", sha(data), env={"PIP_INDEX_URL": mirror.url + "/simple"})
        assert proc.returncode == 0, proc.stderr
        assert mirror.asked == ["/simple/demo-pkg/", "/files/demo-1.0.tar.gz"]
    assert (tmp_path / "src" / "setup.py").read_bytes() == b"# from the mirror\n"


def test_an_unreachable_source_is_one_clear_failure(tmp_path):
    proc = fetch(tmp_path, "http://127.0.0.1:9/demo-1.0.tar.gz", "0" * 64)
    assert proc.returncode != 0 and "cannot download demo-1.0.tar.gz" in proc.stderr and "127.0.0.1:9" in proc.stderr


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("url, says", [
    ("http://nonexistent.invalid/demo-1.0.tar.gz", "cannot reach nonexistent.invalid (DNS: "),
    ("http://127.0.0.1:{port}/demo-1.0.tar.gz", "cannot reach 127.0.0.1 (connection: "),
])
def test_a_host_not_reached_is_named_the_networks_failure_not_a_credentials(tmp_path, url, says):
    proc = fetch(tmp_path, url.format(port=_closed_port()), "0" * 64)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode != 0 and says in last and "check the network or a proxy" in last
    assert "netrc" not in last and "credential" not in last


def test_a_401_from_the_host_is_named_a_credentials_failure(tmp_path):
    with Files({"/packages/demo-1.0.tar.gz": 401}) as server:
        proc = fetch(tmp_path, server.url + "/packages/demo-1.0.tar.gz", "0" * 64)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode != 0 and "HTTP 401: 127.0.0.1 wants credentials: give imagegen build --netrc FILE" in last
    assert "cannot reach" not in last


@pytest.mark.parametrize("archive, words", [
    (lambda: tar_gz({"../../escaped.py": b"x"}), "would land outside"),
    (lambda: tar_gz({"/tmp/abs.py": b"x"}, top=""), "would land outside"),
    (lambda: tar_gz({"setup.py": b"x"}, links={"passwd": "/etc/passwd"}), "not a plain file"),
])
def test_archives_that_write_outside_the_source_folder_are_refused(tmp_path, archive, words):
    data = archive()
    with Files({"/demo-1.0.tar.gz": data}) as server:
        proc = fetch(tmp_path, server.url + "/demo-1.0.tar.gz", sha(data))
    assert proc.returncode != 0 and words in proc.stderr, proc.stderr
    assert not (tmp_path.parent / "escaped.py").exists() and not (tmp_path / "escaped.py").exists()
    assert not Path("/tmp/abs.py").exists()


def test_a_zip_sdist_and_a_folder_holding_another_tree(tmp_path):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("demo-1.0/setup.py", "# zip\n")
    data = buf.getvalue()
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.txt").write_text("the user's")
    with Files({"/demo-1.0.zip": data}) as server:
        proc = fetch(tmp_path, server.url + "/demo-1.0.zip", sha(data), filename="demo-1.0.zip")
        assert proc.returncode == 0, proc.stderr
        assert (tmp_path / "src" / "setup.py").read_text() == "# zip\n"
        refused = fetch(tmp_path, server.url + "/demo-1.0.zip", sha(data), filename="demo-1.0.zip", src=other)
    assert refused.returncode != 0 and "already holds another source tree" in refused.stderr
    assert (other / "keep.txt").read_text() == "the user's"


def test_an_archive_larger_unpacked_than_an_sdist_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    # A compressed bomb: the members' sizes add up past the bound (here lowered to 1 MiB; 8 GiB in a build).
    monkeypatch.syspath_prepend(str(ROOT / "imagegen" / "shipped" / "builder"))
    import imagegen_sdist

    monkeypatch.setattr(imagegen_sdist, "MAX_UNPACKED_BYTES", 1 << 20)
    data = tar_gz({"setup.py": b"x", "big.bin": b"\0" * (2 << 20)})
    assert len(data) < 1 << 20  # small as downloaded

    def fail(msg):
        raise RuntimeError(msg)

    with pytest.raises(RuntimeError, match=r"demo-1.0.tar.gz: 2 members, 2097153 bytes once unpacked: more than an sdist"):
        imagegen_sdist.unpack_sdist(data, "demo-1.0.tar.gz", str(tmp_path / "src"), fail)
    assert not (tmp_path / "src").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".sdist-")]
