"""Real builds on a real Docker engine: a torch CUDA extension compiled into a wheel by
`imagegen build` and by plain `docker buildx bake`, verified, installed and imported.

Needs: a running Docker engine with buildx and the base image made by scripts/make-base-image.sh
(scripts/test.sh provides both when run as root). Downloads torch 2.11 (cu130, PyPI's default) and
the CUDA 13.0 toolkit from PyPI inside the build; a warm pip cache mount makes re-runs fast.
These tests fail, not skip, when the engine is missing: they are what proves the product works.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from image_scan import find_in_chunks, find_in_image, layer_folders

from imagegen.model.arch_parse import parse_arch_list
from imagegen.finish.verify import verify_wheel
from imagegen.render.dockerfile import builder_files

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
BASE_IMAGE = os.environ.get("IMAGEGEN_TEST_BASE_IMAGE", "imagegen-test/python:3.11-bookworm")
IMAGEGEN = str(Path(sys.executable).parent / "imagegen")
CELL = ["--torch", "2.11", "--cuda", "13.0", "--python", "3.11", "--arch", "8.0;9.0+PTX",
        "--flavor", "pypi", "--base-image", BASE_IMAGE]
TINY = "tiny-kernel-0_1_0-torch2_11-cu130-py311"
BROKEN = "broken-kernel-0_1_0-torch2_11-cu130-py311"
SYSTEM_CA = "/etc/ssl/certs/ca-certificates.crt"

pytestmark = pytest.mark.integration


def sh(*cmd: str, cwd: Path | None = None, env: dict | None = None, timeout: int = 3600) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def engine():
    info = sh("docker", "info", "--format", "{{.ServerVersion}}") if shutil.which("docker") else None
    if info is None or info.returncode != 0:
        pytest.fail("a running Docker engine is required: run scripts/install-engine.sh (scripts/test.sh does)")
    if sh("docker", "image", "inspect", BASE_IMAGE).returncode != 0:
        pytest.fail(f"base image {BASE_IMAGE} missing: run scripts/make-base-image.sh {BASE_IMAGE}")


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, engine):
    root = tmp_path_factory.mktemp("engine")
    # A CA bundle with a marker line: still a valid bundle (text outside PEM blocks is ignored),
    # and the marker shows whether the secret ever reached an image layer or the history.
    marker = f"IMAGEGEN-CA-MARKER-{uuid.uuid4().hex}"
    ca = root / "ca.pem"
    ca.write_text(f"# {marker}\n" + Path(SYSTEM_CA).read_text())
    return {"root": root, "ca": ca, "marker": marker}


@pytest.fixture(scope="module")
def first_build(workspace):
    """One `imagegen build` of two cells: the fixture kernel and a kernel that does not compile."""
    root = workspace["root"]
    t0 = time.time()
    proc = sh(IMAGEGEN, "build", "--source", str(FIXTURES / "tiny_kernel"), "--source", str(FIXTURES / "broken_kernel"),
              *CELL, "--out", str(root / "out"), "--work", str(root / "work"), "--ca-bundle", str(workspace["ca"]),
              cwd=root)
    return {"proc": proc, "seconds": time.time() - t0, "out": root / "out"}


def tiny_wheel(out: Path) -> Path:
    wheels = sorted((out / "tiny-kernel-0.1.0" / "torch2.11" / "cu130").glob("*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_failing_cell_keeps_the_other_cells_wheel(first_build):
    proc = first_build["proc"]
    assert proc.returncode == 5, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("imagegen: error: 1 of 2 cells failed: " + BROKEN) and ".log)" in last
    # The summary names the failed cell, shows the compiler's error and the full log's path.
    assert f"{BROKEN} failed" in proc.stdout, proc.stdout[-2000:]
    assert "broken.cu(4): error: expected a declaration" in proc.stdout, proc.stdout[-2000:]
    wheel = tiny_wheel(first_build["out"])
    assert wheel.name == "tiny_kernel-0.1.0+cu130torch2.11-cp311-cp311-linux_x86_64.whl"
    assert not list(first_build["out"].rglob("*.partial")), "no half-written file may remain"
    assert not (first_build["out"] / "broken-kernel-0.1.0").exists()


def test_wheel_carries_requested_sass_and_ptx(first_build):
    wheel = tiny_wheel(first_build["out"])
    report = verify_wheel(wheel, None)
    (so,) = report.extensions
    assert sorted(map(str, so.entries)) == ["compute_90", "sm_80", "sm_90"]
    proc = sh(IMAGEGEN, "verify", str(wheel), "--arch", "8.0;9.0+PTX")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = sh(IMAGEGEN, "verify", str(wheel), "--arch", "12.0")
    assert proc.returncode == 6 and "lacks sm_120" in proc.stderr


def test_manifest_records_inputs_hash_and_smoke_test(first_build):
    wheel = tiny_wheel(first_build["out"])
    manifest = json.loads((wheel.parent / "manifest.json").read_text())
    entry = manifest["cells"][TINY]
    import hashlib

    assert entry["sha256"] == hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert entry["wheel"] == wheel.name and entry["torch"] == "2.11.0" and entry["archs"] == "8.0;9.0+PTX"
    assert entry["base_image"] == BASE_IMAGE and len(entry["inputs"]) == 16
    # Installed into a fresh copy of the torch environment and imported there (smoke stage).
    assert entry["smoke"] == {"tiny_kernel": "ok"}
    assert Path(entry["log"]).is_file()
    # The gencode audit ran in the builder image before the compile; its verdict and table are kept.
    assert entry["audit"]["verdict"] == "ok" and entry["audit"]["refusals"] == []
    (ext,) = entry["audit"]["extensions"]
    assert ext["module"] == "tiny_kernel._C" and ext["sass"] == ["sm_80", "sm_90"] and ext["ptx"] == ["compute_90"]


def test_unchanged_cell_is_skipped_on_rerun(first_build, workspace):
    root = workspace["root"]
    t0 = time.time()
    proc = sh(IMAGEGEN, "build", "--source", str(FIXTURES / "tiny_kernel"), *CELL, "--out", str(root / "out"),
              "--work", str(root / "work"), cwd=root)
    assert proc.returncode == 0, proc.stderr
    assert f"[{TINY}] up to date" in proc.stderr and "building" not in proc.stderr
    assert "up-to-date" in proc.stdout
    print(f"no-op re-run: {time.time() - t0:.1f} s")


def test_other_job_settings_reuse_the_compiled_layer(first_build, workspace):
    # MAX_JOBS/NVCC_THREADS reach imagegen's bake as a secret, not as build args (cache keys): a cell
    # built before, now in a batch of another size or with other --max-jobs, is not compiled again.
    root = workspace["root"]
    proc = sh(IMAGEGEN, "build", "--source", str(FIXTURES / "tiny_kernel"), *CELL, "--out", str(root / "out"),
              "--work", str(root / "work"), "--force", "--max-jobs", "3", "--nvcc-threads", "1", cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "MAX_JOBS=3 NVCC_THREADS=1" in proc.stderr
    run = max((root / "work" / "runs").iterdir(), key=lambda p: p.stat().st_mtime)
    log = (run / "logs" / f"{TINY}.log").read_text()
    vertex = re.search(r"^#(\d+) \[[^\]]*compile[^\]]*\] RUN .*imagegen_build\.py build", log, re.M)
    assert vertex, log[-3000:]
    assert re.search(rf"^#{vertex.group(1)} CACHED$", log, re.M), log[-3000:]
    assert tiny_wheel(root / "out").is_file()


def test_plain_docker_buildx_bake_of_a_generated_file(first_build, workspace):
    root = workspace["root"] / "plain"
    shutil.copytree(FIXTURES / "tiny_kernel", root / "tiny_kernel")
    proc = sh(IMAGEGEN, "bake", "--source", "tiny_kernel", *CELL, "-f", "docker-bake.hcl", "--out", "wheels", cwd=root)
    assert proc.returncode == 0, proc.stderr
    proc = sh("docker", "buildx", "bake", "--progress", "plain", cwd=root,
              env={"IMAGEGEN_PIP_CERT": str(workspace["ca"])})
    assert proc.returncode == 0, proc.stderr[-3000:]
    wheel = tiny_wheel(root / "wheels")
    assert verify_wheel(wheel, parse_arch_list("8.0;9.0+PTX")).ok
    # Same inputs as the imagegen build: its layers came from the cache.
    assert "CACHED" in proc.stderr
    # The export holds only the wheel and its build record (no root filesystem).
    folder = root / "wheels" / "tiny-kernel-0.1.0" / "torch2.11" / "cu130"
    assert sorted(p.name for p in folder.iterdir()) == [wheel.name, wheel.name + ".imagegen.json"]
    record = json.loads((folder / (wheel.name + ".imagegen.json")).read_text())
    assert record["cell"] == TINY and record["base_image"] == BASE_IMAGE and record["smoke"]["ok"] is True
    # Not in a manifest yet: the index has nothing. `imagegen collect` verifies it and records it.
    proc = sh(IMAGEGEN, "collect", "wheels", cwd=root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith(f"ok   {wheel.relative_to(root)}: recorded ({TINY}, SASS/PTX for 8.0;9.0+PTX)"), proc.stdout
    proc = sh(IMAGEGEN, "index", "wheels", cwd=root)
    assert proc.returncode == 0 and proc.stdout.startswith("indexed 1 wheel of 1 project (tiny-kernel)"), proc.stdout
    # The manifest entry is the one `imagegen build` writes: the same cell is up to date, nothing built.
    proc = sh(IMAGEGEN, "build", "--source", "tiny_kernel", *CELL, "--out", "wheels", "--work", "work", cwd=root)
    assert proc.returncode == 0, proc.stderr
    assert f"[{TINY}] up to date" in proc.stderr and "building" not in proc.stderr


def test_plain_docker_build_of_a_rendered_dockerfile(first_build, workspace):
    # The commands the rendered file's header documents, run as written in the folder render wrote (the
    # Dockerfile, imagegen-scripts/ and the cell's folder beside it): no --build-context imagegen-scripts
    # is needed (the Dockerfile's imagegen-scripts stage copies the folder from the build context); a
    # local tree still comes as the named context `source`. First an RTX 5090 user's two commands: build
    # the builder (the default target), run it with ./out mounted: with no GPU here, it compiles the
    # list the file was rendered for. Then the wheels alone with --target wheels -o out.
    root = workspace["root"] / "rendered"
    proc = sh(IMAGEGEN, "render", "--source", str(FIXTURES / "tiny_kernel"), *CELL, "-o", str(root / "Dockerfile"))
    assert proc.returncode == 0, proc.stderr
    # every file the script needs, nothing else
    assert sorted(p.name for p in (root / "imagegen-scripts").iterdir()) == sorted(builder_files())
    assert (root / TINY / "cell.json").is_file()
    text = (root / "Dockerfile").read_text()
    # a file read in a minute: short lines but those naming the local tree's path (the named context)
    assert len(text.splitlines()) <= 160 and max(len(line) for line in text.splitlines() if str(FIXTURES) not in line) <= 200
    documented = [line.strip("# ").strip() for line in text.splitlines() if line.startswith("#   docker ")]
    build, run = (line.split() for line in documented)
    assert build[:2] == ["docker", "build"] and "--build-context" in build and "--target" not in build
    assert not any(a.startswith("imagegen-scripts=") for a in build)
    assert run[:5] == ["docker", "run", "--rm", "--gpus", "all"]
    ca = ["--secret", f"id=pip_cert,src={workspace['ca']}"]  # this machine's TLS proxy
    tag = build[build.index("-t") + 1]
    try:
        proc = sh(*build[:2], "--progress", "plain", *ca, *build[2:], cwd=root)
        assert proc.returncode == 0, proc.stderr[-3000:]
        (root / "out").mkdir()
        # no --gpus: this machine has none (the builder then compiles TORCH_CUDA_ARCH_LIST, its ARG's list)
        proc = sh("docker", "run", "--rm", "-v", f"{root / 'out'}:/out", tag, cwd=root)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
        (wheel,) = sorted((root / "out").glob("*.whl"))
        assert verify_wheel(wheel, parse_arch_list("8.0;9.0+PTX")).ok
    finally:
        sh("docker", "image", "rm", "-f", tag)
    (wheels_only,) = [line.split("  ", 1)[1].strip() for line in text.splitlines() if line.startswith("# Or the wheels alone")]
    argv = wheels_only.split()
    assert "--target" in argv and argv[argv.index("--target") + 1] == "wheels" and "-o" in argv
    proc = sh(*argv[:2], "--progress", "plain", *ca, *argv[2:], cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = sorted((root / "out").glob("*.whl"))
    assert verify_wheel(wheel, parse_arch_list("8.0;9.0+PTX")).ok


def test_plain_docker_build_with_no_named_context_at_all(first_build, workspace):
    """Seed 004's own command, `docker build -t NAME -f Dockerfile .`, in the folder render wrote: no
    --build-context of any kind. The toolchain and build requirements (stage toolchain: every script, the
    cell, no source) build from the folder alone; stdout's render says what it needs instead."""
    root = workspace["root"] / "plain-build"
    proc = sh(IMAGEGEN, "render", "--source", str(FIXTURES / "tiny_kernel"), *CELL, "-o", str(root / "Dockerfile"))
    assert proc.returncode == 0, proc.stderr
    tag = f"imagegen-plain-build:{uuid.uuid4().hex[:8]}"
    proc = sh("docker", "build", "--progress", "plain", "--secret", f"id=pip_cert,src={workspace['ca']}",
              "--target", "toolchain", "-t", tag, "-f", "Dockerfile", ".", cwd=root)
    try:
        assert proc.returncode == 0, proc.stderr[-3000:]
        listed = sh("docker", "run", "--rm", "--entrypoint", "ls", tag, "/imagegen").stdout.split()
        assert {"imagegen_build.py", "imagegen_toolchain.py", "cell.json"} <= set(listed), listed
    finally:
        sh("docker", "image", "rm", "-f", tag)
    # Without the folder, the failure names the stage that needs it.
    shutil.rmtree(root / "imagegen-scripts")
    proc = sh("docker", "build", "--progress", "plain", "--target", "toolchain", "-f", "Dockerfile", ".", cwd=root)
    assert proc.returncode != 0 and "imagegen-scripts" in proc.stderr
    stdout = sh(IMAGEGEN, "render", "--source", str(FIXTURES / "tiny_kernel"), *CELL).stdout
    assert f"# Written to stdout: it builds only beside ./imagegen-scripts/ and ./{TINY}/" in stdout


def test_ca_bundle_never_reaches_an_image_layer_or_history(first_build, workspace):
    root = workspace["root"] / "plain"
    tag = f"imagegen-ca-check:{uuid.uuid4().hex[:8]}"
    proc = sh("docker", "buildx", "bake", "--progress", "plain", TINY, "--set", f"{TINY}.target=smoke",
              "--set", f"{TINY}.output=type=docker,name={tag}", cwd=root,
              env={"IMAGEGEN_PIP_CERT": str(workspace["ca"])})
    assert proc.returncode == 0, proc.stderr[-3000:]
    try:
        history = sh("docker", "history", "--no-trunc", "--format", "{{.CreatedBy}}", tag).stdout
        assert history and workspace["marker"] not in history and "ca.pem" not in history
        assert "BEGIN CERTIFICATE" not in history
        # Every layer's files, the config and the history. The scan must find what is there (the build
        # script imagegen copies in) and must not find the CA bundle's marker.
        found = find_in_image(tag, [workspace["marker"].encode(), b"in-builder script"])
        assert b"in-builder script" in found, "the scan did not see the image's own files"
        assert workspace["marker"].encode() not in found, "the CA bundle's marker is inside an image layer"
    finally:
        sh("docker", "image", "rm", "-f", tag)


def test_edited_source_is_rebuilt_and_ccache_serves_what_did_not_change(first_build, workspace):
    """A local tree edited after a build is not 'up to date' (its content is in the inputs hash); the
    compile step runs again, and the shared ccache mount serves every compilation whose input did not
    change (here: all of them, only a Python file was edited), with the hit rate in the manifest."""
    import hashlib
    import zipfile

    from imagegen.finish.fatbin import reproducible_digest

    root = workspace["root"] / "edited"
    tree = root / "tiny_kernel"
    shutil.copytree(FIXTURES / "tiny_kernel", tree)
    init = tree / "tiny_kernel" / "__init__.py"
    args = ["build", "--source", str(tree), *CELL, "--out", str(root / "out"), "--work", str(root / "work"), "--json"]

    def build_once() -> tuple[dict, dict]:
        init.write_text(init.read_text() + f"# edit {uuid.uuid4().hex}\n")  # a new context: the compile step runs
        proc = sh(IMAGEGEN, *args, cwd=root)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "up to date" not in proc.stderr
        (result,) = json.loads(proc.stdout)
        with zipfile.ZipFile(result["wheel"]) as zf:
            sos = {n: reproducible_digest(zf.read(n)) for n in zf.namelist() if ".so" in n}
        return result, sos

    first, first_sos = build_once()
    second, second_sos = build_once()
    assert second["status"] == "built" and first["ccache"]["hits"] + first["ccache"]["misses"] > 0
    assert second["ccache"]["misses"] == 0 and second["ccache"]["hits"] > 0 and second["ccache"]["hit_rate"] == 1.0
    assert second_sos == first_sos  # objects from the cache: the same extension
    manifest = json.loads((Path(second["wheel"]).parent / "manifest.json").read_text())
    assert manifest["cells"][TINY]["ccache"] == second["ccache"]
    assert hashlib.sha256(Path(second["wheel"]).read_bytes()).hexdigest() == manifest["cells"][TINY]["sha256"]


def test_a_build_from_a_local_git_repository_at_a_tag(workspace, tmp_path):
    """`--git file:///...@v0.1.0` of a local repository (issue 18): resolved to the tag's commit, exported on the
    host (a build container cannot reach the path), built with the recipe's rules for 0.1.0, verified and
    imported; the recipe's patch that the repository already has is reported as taken, not applied again."""
    sys.path.insert(0, str(ROOT))
    from tests.git_server import tiny_kernel_repo

    repo, commit = tiny_kernel_repo(tmp_path)
    proc = sh(IMAGEGEN, "build", "tiny", "--git", f"file://{repo}@v0.1.0", "--recipe-dir",
              str(FIXTURES / "tiny_git_recipe"), *CELL, "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"),
              "--ca-bundle", str(workspace["ca"]), cwd=tmp_path, env={"XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (wheel,) = (tmp_path / "out" / f"tiny-0.1.0-g{commit[:8]}" / "torch2.11" / "cu130").glob("*.whl")
    assert wheel.name.startswith("tiny_kernel-0.1.0+cu130torch2.11-cp311-")  # the version is the source's
    assert verify_wheel(wheel, parse_arch_list("8.0;9.0+PTX")).ok
    logs = "".join(p.read_text(errors="replace") for p in tmp_path.rglob("*.log"))
    assert "patch tiny-readme.patch is already in the source" in logs, logs[-3000:]


# ------------------------------------------------------------------------------------------------
# A private git host and `build --netrc FILE` (issue 32): the credential reaches the steps that fetch,
# and nothing else: no image layer, no image history or config, no file imagegen writes, no output.

NETRC_LOGIN = "x-access-token"
SCANNED_STAGES = ("fetch", "base", "builder", "compile", "smoke")  # every stage a --no-audit build runs


def _bridge_gateway() -> str:
    """This host's address on Docker's default bridge: a build step's RUN reaches it (a step's 127.0.0.1
    is its own), nothing beyond this machine does."""
    proc = sh("docker", "network", "inspect", "bridge", "--format", "{{(index .IPAM.Config 0).Gateway}}")
    assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr
    return proc.stdout.strip()


@pytest.fixture(scope="module")
def private_git(tmp_path_factory, engine):
    """The tiny kernel's repository (tagged v0.1.0) on a real git host (git http-backend) that answers 401
    to every request without Basic auth of a token made up for this run, listening on the bridge's
    address; the token in a netrc file of its own. imagegen runs with a HOME of its own (no ~/.netrc, no
    git config): the credential can only come from --netrc."""
    sys.path.insert(0, str(ROOT))
    from tests.git_server import GitServer, git, tiny_kernel_repo

    root = tmp_path_factory.mktemp("private-git")
    repo, commit = tiny_kernel_repo(root)
    (root / "srv").mkdir()
    git(root / "srv", "clone", "-q", "--bare", str(repo), "tiny.git")
    token = f"imagegen-netrc-token-{uuid.uuid4().hex}"
    host = _bridge_gateway()
    netrc = root / "netrc"
    netrc.write_text(f"machine {host} login {NETRC_LOGIN} password {token}\n")
    netrc.chmod(0o600)
    (root / "home").mkdir()
    env = {"HOME": str(root / "home"), "XDG_CACHE_HOME": str(root / "cache"),
           "DOCKER_CONFIG": os.environ.get("DOCKER_CONFIG") or str(Path.home() / ".docker")}
    with GitServer(root / "srv", host=host, auth=(NETRC_LOGIN, token)) as srv:
        yield {"root": root, "url": srv.url("tiny.git"), "commit": commit, "token": token, "netrc": netrc,
               "server": srv, "host": host, "env": env}


@pytest.fixture(scope="module")
def netrc_build(first_build, private_git, workspace):
    """`imagegen build tiny --git http://BRIDGE:PORT/tiny.git@v0.1.0 --netrc FILE` (the fixture kernel's
    cell, so the torch layer and ccache are first_build's), then each stage it ran as an image of its
    own (all of them from the build cache, nothing run again), to read their layers and history.

    The layers that were there before this build (the builder up to its toolchain step: the base image
    and the torch layer of several GB, made by first_build without any netrc) are built first, as an
    image of their own, from this cell's Dockerfile cut after that step: the token was made up for this
    run and never handed to them, so the scan leaves them out (reading 8 GB costs ~100 s); every other
    layer, and every layer whose content differs from theirs, is read whole."""
    p, uid = private_git, uuid.uuid4().hex[:8]
    root, env, t0 = p["root"], p["env"], time.time()
    recipe = ["tiny", "--recipe-dir", str(FIXTURES / "tiny_git_recipe"), *CELL]
    pre = root / "pre"
    # A full commit resolves nothing (no credential needed); --version names what v0.1.0 would.
    proc = sh(IMAGEGEN, "render", *recipe, "--git", f"{p['url']}@{p['commit']}", "--version", "0.1.0",
              "-o", str(pre / "Dockerfile"), env=env)
    assert proc.returncode == 0, proc.stderr
    lines = (pre / "Dockerfile").read_text().splitlines(keepends=True)
    (cut,) = [i for i, line in enumerate(lines) if "imagegen_toolchain.py --cell" in line]
    (pre / "Dockerfile.pre").write_text("".join(lines[:cut + 1]))
    tags = {"pre": f"imagegen-netrc-pre:{uid}", **{s: f"imagegen-netrc-{s}:{uid}" for s in SCANNED_STAGES}}
    try:
        proc = sh("docker", "buildx", "build", "--progress", "plain", "--target", "toolchain", "-f", "Dockerfile.pre",
                  "--secret", f"id=pip_cert,src={workspace['ca']}", "--output", f"type=docker,name={tags['pre']}", ".",
                  cwd=pre)
        assert proc.returncode == 0, proc.stderr[-3000:]
        seconds_pre = time.time() - t0
        t0 = time.time()
        build = sh(IMAGEGEN, "build", *recipe, "--git", f"{p['url']}@v0.1.0", "--netrc", str(p["netrc"]), "--no-audit",
                   "--out", str(root / "out"), "--work", str(root / "work"), "--ca-bundle", str(workspace["ca"]),
                   cwd=root, env=env)
        seconds_build = time.time() - t0
        (run,) = (root / "work" / "runs").iterdir()
        bake = json.loads((run / "docker-bake.json").read_text())
        (cell,) = bake["group"]["default"]["targets"]
        made_by_build = sh("docker", "images", "-q", "--filter", f"label=io.imagegen.cell={cell}").stdout.split()
        t0 = time.time()
        if build.returncode == 0:
            (root / "stages.json").write_text(json.dumps({"target": {
                f"scan-{s}": {"inherits": [cell], "target": s, "output": [f"type=docker,name={tags[s]}"]}
                for s in SCANNED_STAGES}}))
            staged = sh("docker", "buildx", "bake", "--progress", "plain", "-f", str(run / "docker-bake.json"),
                        "-f", str(root / "stages.json"), *(f"scan-{s}" for s in SCANNED_STAGES), cwd=root,
                        env={"IMAGEGEN_PIP_CERT": str(workspace["ca"])})
        else:
            staged = None
        yield {"proc": build, "run": run, "cell": cell, "tags": tags, "staged": staged,
               "made_by_build": made_by_build, "seconds": {"pre": seconds_pre, "build": seconds_build,
                                                            "stages": time.time() - t0}}
    finally:
        sh("docker", "image", "rm", "-f", *tags.values())


def _layer_folders(image: str) -> list[tuple[str, Path]]:
    layers = layer_folders(image)
    assert layers is not None, "the layer scan reads overlay2's layer folders: another storage driver is in use"
    return layers


def _found_in(folder: Path, needles: list[bytes], *, skip: set[Path] = frozenset()) -> dict[bytes, set[str]]:
    """needle -> the paths under ``folder`` whose name, link target or content holds it (the members of a
    wheel or zip read inflated)."""
    import stat
    import zipfile

    found: dict[bytes, set[str]] = {}

    def scan(data_chunks, where: str) -> None:
        for n in find_in_chunks(data_chunks, needles):
            found.setdefault(n, set()).add(where)

    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            if Path(path) in skip:
                continue
            st = os.lstat(path)
            extra = os.fsencode(os.readlink(path)) if stat.S_ISLNK(st.st_mode) else b""
            scan([os.fsencode(name) + b"\0" + extra], path)
            if name in filenames and stat.S_ISREG(st.st_mode):
                with open(path, "rb") as fh:
                    scan(iter(lambda: fh.read(1 << 22), b""), path)
                if name.endswith((".whl", ".zip")):
                    with zipfile.ZipFile(path) as zf:
                        for member in zf.namelist():
                            scan([member.encode(), zf.read(member)], f"{path}!{member}")
    return found


def test_a_private_repository_is_fetched_in_the_build_with_the_netrc_secret(netrc_build, private_git):
    proc = netrc_build["proc"]
    print(f"netrc build: {netrc_build['seconds']}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (wheel,) = (private_git["root"] / "out").glob(f"tiny-0.1.0-g{private_git['commit'][:8]}/torch2.11/cu130/*.whl")
    assert verify_wheel(wheel, parse_arch_list("8.0;9.0+PTX")).ok
    # The host refused every request without the token (401), and served the fetch of a build step: the
    # commit's pack went to a container, not to this host's ls-remote (it asks from the gateway address).
    srv = private_git["server"]
    assert srv.refused >= 2, srv.refused
    fetched = [r for r in srv.served if r.endswith(" POST /tiny.git/git-upload-pack?")
               and not r.startswith(private_git["host"] + " ")]
    assert fetched, srv.served
    log = next((netrc_build["run"] / "logs").glob("*.log")).read_text(errors="replace")
    assert re.search(r"^#(\d+) \[[^\]]*fetch \d/\d\] RUN .*imagegen_build\.py fetch", log, re.M), log[-3000:]
    assert "fetch --depth 1 origin" in log


def test_the_netrc_token_is_in_no_layer_history_config_file_or_output(netrc_build, private_git):
    assert netrc_build["proc"].returncode == 0, netrc_build["proc"].stderr[-3000:]
    token = private_git["token"].encode()
    # The build itself exported wheels and logs only: no image of this cell was tagged. Each stage it ran,
    # made an image now, came from the build cache as the build left it (not one step ran again).
    assert netrc_build["made_by_build"] == []
    staged = netrc_build["staged"]
    assert staged.returncode == 0, staged.stderr[-3000:]
    runs = re.findall(r"^#(\d+) \[scan-\S+ \S+ \d+/\d+\] RUN ", staged.stderr, re.M)
    assert runs and all(re.search(rf"^#{n} CACHED$", staged.stderr, re.M) for n in runs), staged.stderr[-3000:]
    tags = netrc_build["tags"]
    for stage in SCANNED_STAGES:
        history = sh("docker", "history", "--no-trunc", "--format", "{{.CreatedBy}} {{.Comment}}", tags[stage])
        assert history.returncode == 0 and "imagegen_build.py" in history.stdout, history.stderr
        assert private_git["token"] not in history.stdout and str(private_git["netrc"]) not in history.stdout, stage
        config = sh("docker", "image", "inspect", tags[stage]).stdout
        assert private_git["token"] not in config, stage
    # Every layer of every stage image, read whole, except those there before the build (built above
    # without the token); the scan must see what the build fetched (the repository's README line).
    before = {diff for diff, _ in _layer_folders(tags["pre"])}
    compile_layers = [diff for diff, _ in _layer_folders(tags["compile"])]
    assert compile_layers[:len(before)] == [diff for diff, _ in _layer_folders(tags["pre"])]
    seen = b"tiny kernel: taken upstream at v0.1.0"
    scanned: dict[str, dict[bytes, set[str]]] = {}
    t0 = time.time()
    for stage in SCANNED_STAGES:
        for diff, folder in _layer_folders(tags[stage]):
            if diff not in before and diff not in scanned:
                scanned[diff] = _found_in(folder, [token, seen])
    print(f"scanned {len(scanned)} layers in {time.time() - t0:.1f} s")
    assert any(seen in found for found in scanned.values()), "the layer scan did not see the fetched tree"
    leaks = {diff: found[token] for diff, found in scanned.items() if token in found}
    assert not leaks, f"the netrc token is in image layers: {leaks}"
    # Nor in anything imagegen wrote (the bake file, Dockerfiles, logs and job files under --work, the
    # wheel, its build record and manifest.json under --out, imagegen's cache) or printed.
    proc = netrc_build["proc"]
    assert private_git["token"] not in proc.stdout + proc.stderr
    assert "id=netrc,src=" + str(private_git["netrc"]) in (netrc_build["run"] / "docker-bake.json").read_text()
    found = _found_in(private_git["root"], [token, seen], skip={private_git["netrc"]})
    assert seen in found and not found.get(token), found.get(token)


def test_without_netrc_a_private_repository_is_refused_in_one_line(private_git):
    """No credential to leak: imagegen resolves the ref with what the build would have (the --netrc file,
    here none) and says what is missing before anything is built, whether or not git on this machine
    has a credential of its own (here: a ~/.netrc in imagegen's HOME)."""
    p = private_git
    argv = ["build", "tiny", "--git", f"{p['url']}@v0.1.0", "--recipe-dir", str(FIXTURES / "tiny_git_recipe"), *CELL,
            "--out", str(p["root"] / "refused-out"), "--work", str(p["root"] / "refused-work")]
    proc = sh(IMAGEGEN, *argv, env=p["env"])
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stderr
    assert "git ls-remote failed" in proc.stderr and "give --netrc FILE" in proc.stderr
    home_netrc = Path(p["env"]["HOME"]) / ".netrc"
    home_netrc.symlink_to(p["netrc"])
    try:
        proc = sh(IMAGEGEN, *argv, env=p["env"])
    finally:
        home_netrc.unlink()
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stderr
    assert "needs credentials" in proc.stderr and "give --netrc ~/.netrc" in proc.stderr
    assert p["token"] not in proc.stderr
    assert not (p["root"] / "refused-out").exists() and not (p["root"] / "refused-work").exists()
