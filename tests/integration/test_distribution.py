"""imagegen as a pip user gets it: the sdist and the wheel built from this clone (uv build: the wheel from
the sdist, as PyPI's users' pip would build it), the wheel installed into a fresh venv outside the clone,
and the command run from a folder outside it.

- The distribution is imagegen-wheels (PyPI's 'imagegen' is another project); the command and the import
  package are imagegen, and the installed package is the venv's, not the clone's.
- The headline works from the wheel alone: `imagegen render sage --arch 12.0+PTX -o DIR/Dockerfile` writes
  the Dockerfile and its build context (the builder scripts shipped in the package).
- The set-up scripts are in both archives and `imagegen setup engine --print` prints the shipped one.
- On a fresh Debian 12 (the base image, in a privileged container: no docker client, no engine), the wheel
  installed with pip and `imagegen setup engine` as root leave a running engine with buildx; as another
  user it refuses in one line and runs nothing.

Needs uv (the resolve extra's: pip install -e '.[test]'), PyPI (setuptools for the build, the wheel's
dependencies) and, for the last test, the engine and base image scripts/test.sh provides.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from imagegen import DISTRIBUTION, __version__
from imagegen.commands import setup

ROOT = Path(__file__).resolve().parents[2]
BASE_IMAGE = os.environ.get("IMAGEGEN_TEST_BASE_IMAGE", "imagegen-test/python:3.11-bookworm")
SETUP_FILES = ["install-engine.sh", "install-registry.sh", "install-qemu.sh", "lib/debian-mirror.sh"]

pytestmark = pytest.mark.integration


def _uv() -> str:
    uv = Path(sys.executable).parent / "uv"
    found = str(uv) if uv.is_file() else shutil.which("uv")
    if found is None:
        pytest.fail("uv is required to build imagegen's sdist and wheel: pip install -e '.[test]' (the resolve extra)")
    return found


def _clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without what would let the clone's imagegen or venv leak in."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    return {**env, **extra}


def _run(argv: list, cwd: Path, timeout: int = 300, **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(a) for a in argv], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=_clean_env(), **kwargs)
    assert proc.returncode == 0, f"{argv}: exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    return proc


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> dict[str, Path]:
    """The sdist and the wheel of this clone's files (tracked and not ignored: what a commit of it ships),
    built from a copy, so that the build leaves no build/ or egg-info in the clone."""
    top = tmp_path_factory.mktemp("distribution")
    src = top / "src"
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        path = ROOT / rel
        if path.is_file() and not path.is_symlink():  # a file deleted in the work tree is not shipped
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, src / rel)
    _run([_uv(), "build", "--out-dir", top / "dist", src], cwd=top)
    (sdist,) = (top / "dist").glob("*.tar.gz")
    (wheel,) = (top / "dist").glob("*.whl")
    return {"sdist": sdist, "wheel": wheel, "top": top}


@pytest.fixture(scope="module")
def installed(dists) -> Path:
    """A fresh venv outside the clone with the wheel (and its dependencies from PyPI) installed."""
    venv = dists["top"] / "venv"
    _run([sys.executable, "-m", "venv", venv], cwd=dists["top"])
    _run([_uv(), "pip", "install", "--python", venv / "bin" / "python", dists["wheel"]], cwd=dists["top"])
    return venv


def test_the_archives_are_imagegen_wheels_with_the_set_up_scripts(dists):
    assert dists["wheel"].name == f"imagegen_wheels-{__version__}-py3-none-any.whl"
    assert dists["sdist"].name == f"imagegen_wheels-{__version__}.tar.gz"
    names = zipfile.ZipFile(dists["wheel"]).namelist()
    for name in SETUP_FILES:
        assert f"imagegen/resources/setup/{name}" in names, name
    # what render writes beside a Dockerfile, and the templates, are package data too
    assert "imagegen/shipped/builder/imagegen_build.py" in names and "imagegen/render/templates/Dockerfile.j2" in names
    assert not [n for n in names if n.startswith(("tests/", "scripts/", "benchmarks/"))]
    metadata = zipfile.ZipFile(dists["wheel"]).read(f"imagegen_wheels-{__version__}.dist-info/METADATA").decode()
    assert f"\nName: {DISTRIBUTION}\n" in metadata and "Provides-Extra: publish" in metadata
    assert "imagegen = imagegen.cli:main" in zipfile.ZipFile(dists["wheel"]).read(
        f"imagegen_wheels-{__version__}.dist-info/entry_points.txt").decode()
    with tarfile.open(dists["sdist"]) as sdist:
        members = sdist.getnames()
    for name in SETUP_FILES:
        assert f"imagegen_wheels-{__version__}/imagegen/resources/setup/{name}" in members, name


def test_the_installed_wheel_runs_the_headline_from_outside_the_clone(installed, tmp_path):
    exe = installed / "bin" / "imagegen"
    work = tmp_path / "somewhere"
    work.mkdir()
    assert _run([exe, "--version"], cwd=work).stdout == f"imagegen {__version__}\n"
    # The package the command imports is the venv's, under the distribution's name.
    probe = _run([installed / "bin" / "python", "-c", "import imagegen, importlib.metadata as m;"
                  " print(imagegen.__file__); print(m.packages_distributions()['imagegen']);"
                  " print(m.distribution('imagegen-wheels').metadata['Name'])"], cwd=work).stdout.splitlines()
    assert probe[0].startswith(str(installed)) and not probe[0].startswith(str(ROOT)), probe
    assert probe[1:] == ["['imagegen-wheels']", "imagegen-wheels"], probe

    proc = _run([exe, "render", "sage", "--arch", "12.0+PTX", "-o", work / "out" / "Dockerfile"], cwd=work)
    assert proc.stderr.startswith(f"wrote {work / 'out' / 'Dockerfile'}, "), proc.stderr
    dockerfile = (work / "out" / "Dockerfile").read_text()
    first = dockerfile.splitlines()[0]
    assert first.startswith("# sageattention ") and first.endswith(" archs 12.0+PTX"), first
    assert (work / "out" / "imagegen-scripts" / "imagegen_build.py").is_file()  # shipped with the wheel


def test_setup_print_from_the_installed_wheel_is_the_shipped_script(installed, tmp_path):
    for part in setup.PARTS:
        proc = _run([installed / "bin" / "imagegen", "setup", part, "--print"], cwd=tmp_path)
        assert proc.stdout == setup.printed_script(part) and proc.stderr == "", part
    shipped = list(installed.glob("lib/python3*/site-packages/imagegen/resources/setup"))
    assert len(shipped) == 1 and sorted(p.relative_to(shipped[0]).as_posix() for p in shipped[0].rglob("*.sh")) == \
        sorted(SETUP_FILES)


@pytest.fixture(scope="module")
def wheelhouse(dists, installed) -> Path:
    """The wheel and its dependencies' wheels for the base image's Python (3.11, this machine's arch), for
    an install with no index inside the container."""
    out = dists["top"] / "wheelhouse"
    machine = platform.machine()
    _run([installed / "bin" / "python", "-m", "pip", "download", "-q", "--disable-pip-version-check", "--dest", out,
          "--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311",
          "--platform", f"manylinux_2_17_{machine}", "--platform", f"manylinux2014_{machine}",
          "--platform", f"manylinux_2_28_{machine}", dists["wheel"]], cwd=dists["top"])
    return out


# In the container: pip installs the wheel into a venv; another user's setup engine refuses; root's sets up
# the engine (no docker client on the image: its client comes too); then the engine answers with buildx.
IN_CONTAINER = r"""
set -u
python3 -m venv /v && /v/bin/pip install -q --disable-pip-version-check --no-index --find-links /wheelhouse \
    imagegen-wheels || exit 90
command -v docker && exit 91
cd /tmp
setpriv --reuid=65534 --regid=65534 --clear-groups /v/bin/imagegen setup engine 2>/tmp/refused
echo "refused-exit=$?"
echo "refused-said=$(cat /tmp/refused)"
echo "refused-lines=$(wc -l < /tmp/refused)"
/v/bin/imagegen setup engine > /tmp/setup.log 2>&1
echo "setup-exit=$?"
sed 's/^/setup: /' /tmp/setup.log
echo "buildx=$(docker buildx version)"
echo "server=$(docker info --format '{{.ServerVersion}}')"
/v/bin/imagegen setup engine > /tmp/again.log 2>&1
echo "again-exit=$?"
echo "again=$(cat /tmp/again.log)"
"""


def test_setup_engine_from_the_wheel_on_a_fresh_debian_12(wheelhouse):
    if shutil.which("docker") is None or subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        pytest.fail("a running Docker engine is required: run scripts/install-engine.sh (scripts/test.sh does)")
    if subprocess.run(["docker", "image", "inspect", BASE_IMAGE], capture_output=True).returncode != 0:
        pytest.fail(f"base image {BASE_IMAGE} missing: run scripts/make-base-image.sh {BASE_IMAGE}")
    proc = subprocess.run(["docker", "run", "--rm", "--privileged", "-v", f"{wheelhouse}:/wheelhouse:ro", BASE_IMAGE,
                           "bash", "-c", IN_CONTAINER], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    said = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line and not line.startswith("setup:"))
    where = proc.stdout[-3000:]
    # another user: one line, exit 4, how to re-run it, nothing installed (root's run below installs it all)
    assert said["refused-exit"] == "4" and said["refused-lines"] == "1", where
    assert said["refused-said"].startswith("imagegen: error: imagegen setup engine must run as root ("), where
    assert "re-run it with sudo: sudo /v/bin/imagegen setup engine " in said["refused-said"], where
    # root: the shipped script ran (its own lines), and the engine answers with buildx
    assert said["setup-exit"] == "0", where
    assert "setup: install-engine: fetching docker.io docker-buildx docker-cli from trixie" in proc.stdout, where
    assert said["buildx"].startswith("github.com/docker/buildx "), where
    assert said["server"], where
    # idempotent: a second run sees the running engine and does nothing
    assert said["again-exit"] == "0" and said["again"].startswith("install-engine: engine already running: "), where
