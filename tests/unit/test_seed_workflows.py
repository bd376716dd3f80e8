"""Issue 34: seeds 001 and 002 run as their users would, imagegen command by imagegen command, from the seed's
own values (the workflows' own READMEs: 001's build.sh variables, 002's venv, CUDA 12.9 and clone of `main` with local
setup.py fixes). The Windows scripts are parsed (tree-sitter, as tests/unit/test_windows.py does) and the
helper they embed is taken out of the script itself and run here on Linux, with a stand-in torch and nvcc (as
tests/unit/test_imagegen_windows.py does).

Pure: `docker buildx bake --print` is tests/unit/bake_print_stand_in.py; no engine, no network."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from imagegen.render import bakefiles
from imagegen.render import workflow as render
from imagegen.render.windows import HELPER_MODULES
from tests.unit import bake_print_stand_in as stand_in
from tests.unit.command_helpers import fake_host
from tests.unit.test_ci import lint
from tests.unit.test_imagegen_windows import fake_torch, stand_in as stand_in_exe
from tests.unit.test_windows import parse_errors
from tests.workflow_cli import imagegen

HERE_PY = "%d.%d" % sys.version_info[:2]
REQUIREMENT = "imagegen-wheels @ git+https://github.com/ORG/imagegen@v0.1.0"

# Seed 001's build.sh, its full matrix: FA_VERSIONS, TORCH_SERIES, CUDA_SETS, PY_LINUX / PY_WIN and
# TORCH_CUDA_ARCH_LIST as the seed writes them (space-separated lists, 126 for CUDA 12.6, cp312 for Python).
FA_VERSIONS, TORCH_SERIES, CUDA_SETS, PYTHONS, ARCHS = "2.8.2 2.8.3", "2.6 2.7 2.8", "126 128 129", \
    "cp310 cp311 cp312", "80;86;89;90"
# The seed's own table: which CUDA each torch has. Every other pair is left out, and nothing else is.
SEED_TABLE = {"2.6": {"cu126"}, "2.7": {"cu126", "cu128"}, "2.8": {"cu126", "cu128", "cu129"}}


@pytest.fixture(autouse=True)
def _here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(bakefiles, "print_bake", stand_in.print_bake)
    monkeypatch.setattr("imagegen.render.bakefiles.print_bake", stand_in.print_bake)


def ok(result) -> tuple[str, str]:
    code, out, err = result
    assert code == 0, err
    return out, err


def commas(values: str) -> str:
    return ",".join(values.split())


# ------------------------------------------------------------------------------------------ seed 001


def test_seed_001_one_plan_one_bake_one_workflow_linux_and_windows_both_versions(tmp_path):
    matrix = ["flash-attn", "--version", FA_VERSIONS, "--torch", TORCH_SERIES, "--cuda", CUDA_SETS, "--python", PYTHONS,
              "--arch", ARCHS, "--flavor", "manylinux"]  # the seed's pytorch/manylinux2_28-builder images
    cells = json.loads(ok(imagegen("plan", *matrix, "--json"))[0])["cells"]
    assert len(cells) == 2 * 27
    left_out = {c["name"] for c in cells if c["status"] == "rejected"}
    for c in cells:
        series = ".".join(c["torch"].split(".")[:2])
        assert (c["status"] == "buildable") == (c["cuda"] in SEED_TABLE[series]), c
        assert c["status"] == "buildable" or (len(c["reasons"]) == 1
                                              and c["reasons"][0].startswith(f"torch {series} has no {c['cuda']} build"))
        assert c["archs"] == "8.0;9.0"  # 8.6 and 8.9 run the sm_80 cubin
    assert len(left_out) == 18

    ok(imagegen("bake", *matrix, "--layout", "fa{version}/torch{torch}/{cuda}", "-f", "docker-bake.json"))
    bake = json.loads(Path("docker-bake.json").read_text())
    primary = bake["group"]["default"]["targets"]
    assert len(primary) == 36 and {t.replace("-fallback", "") for t in bake["target"]} == set(primary)
    # the seed's ALT_LINUX_IMAGE_CU*: a <target>-fallback for each cell whose CUDA sameli has (12.8, 12.9)
    fallbacks = [t for t in bake["target"] if t.endswith("-fallback")]
    assert len(fallbacks) == 18 and all("cu126" not in t for t in fallbacks)
    for name in fallbacks:
        body, of = bake["target"][name], bake["target"][name.removesuffix("-fallback")]
        assert body["output"] == of["output"] and body["labels"]["io.imagegen.base-image"].startswith("sameli/")
        assert "FROM ${BASE_IMAGE}" in Path("dockerfiles", body["dockerfile"]).read_text()

    _, err = ok(imagegen("ci", "github", "--bake-file", "docker-bake.json", "--windows", "flash-attn",
                         "--windows-version", commas(FA_VERSIONS), "--windows-torch", commas(TORCH_SERIES),
                         "--windows-cuda", commas(CUDA_SETS), "--windows-python", commas(PYTHONS),
                         "--windows-arch", ARCHS, "--imagegen-from", REQUIREMENT, "-o", "imagegen.yml"))
    doc = yaml.safe_load(Path("imagegen.yml").read_text())
    linux, windows = doc["jobs"]["build"], doc["jobs"]["build-windows"]
    assert linux["strategy"]["matrix"]["target"] == primary
    assert sorted(windows["strategy"]["matrix"]["cell"]) == sorted(primary)  # the same cells, on Windows
    assert {row["version"] for row in windows["strategy"]["matrix"]["include"]} == {"2.8.2", "2.8.3"}
    said = [line.split(": ", 2)[2].split(" (arch")[0] for line in err.splitlines() if "left out of the Windows jobs" in line]
    assert sorted(said) == sorted(left_out)  # the seed's own invalid pairs, each named, and nothing else
    assert "36 Linux jobs" in err and "36 Windows jobs, one per cell (18 left out, listed above)" in err
    assert all(job["timeout-minutes"] < render.RUNNER_LIMIT_MINUTES for job in doc["jobs"].values())
    with_bases = [row for row in linux["strategy"]["matrix"]["include"] if "bases" in row]
    assert len(with_bases) == 18 and all(row["bases"].split("\n")[1].endswith("-fallback") for row in with_bases)
    lint(Path("imagegen.yml"))

    # One Windows job, as its steps run it: the render command line (the job's env: values in it)...
    row = next(r for r in windows["strategy"]["matrix"]["include"]
               if r["version"] == "2.8.3" and r["torch"].startswith("2.8") and r["cuda"] == "12.8"
               and r["python"] == HERE_PY)
    render_step = next(s for s in windows["steps"] if s["name"] == "Render the build script")
    assert "--version $env:RECIPE_VERSION --shell powershell --torch $env:TORCH --cuda $env:CUDA" in render_step["run"]
    ok(imagegen("render", row["recipe"], "--version", row["version"], "--shell", "powershell", "--torch", row["torch"],
                "--cuda", row["cuda"], "--python", row["python"], "--arch", row["arch"], "-o", "build.ps1"))
    script = Path("build.ps1").read_text()
    assert parse_errors(script, "powershell") == []
    assert "'FLASH_ATTN_CUDA_ARCHS' = '80;90'" in script and f"Name = '{row['cell']}'" in script
    # ...and the helper the script writes, run with the cell's torch and nvcc standing in.
    files = ps_blocks(script)
    assert set(files) == {"imagegen_windows.py", "build.json", *(name for _, name in HELPER_MODULES)}
    work = tmp_path / "imagegen-windows"
    work.mkdir()
    for name, text in files.items():
        (work / name).write_text(text)
    build_doc = files["build.json"]
    cell = json.loads(build_doc)["cells"][0]
    assert [e["sass"] for e in cell["expected"]] == ["sm_80", "sm_90"] and cell["toolkit"] == "12.8"
    check = run_helper(tmp_path, work, "check", "--cell", row["cell"], torch="2.8.0+cu128", cuda="12.8", nvcc="12.8")
    assert check.returncode == 0 and "as the cell asks" in check.stdout, check.stdout + check.stderr


def run_helper(tmp_path: Path, work: Path, step: str, *args: str, torch: str, cuda: str, nvcc: str):
    """The script's helper step ``step``, as the script runs it, with a stand-in torch and nvcc."""
    pythonpath = fake_torch(tmp_path / step, torch, cuda)
    bindir = tmp_path / step / "cuda" / "bin"
    stand_in_exe(bindir, "nvcc", f"Cuda compilation tools, release {nvcc}, V{nvcc}.41\n")
    env = dict(os.environ, PYTHONPATH=str(pythonpath), PATH=os.pathsep.join([str(bindir), os.environ["PATH"]]))
    return subprocess.run([sys.executable, str(work / "imagegen_windows.py"), step, "--doc", str(work / "build.json"),
                           *args], capture_output=True, text=True, env=env, timeout=120)


# ------------------------------------------------------------------------------------------ seed 002


def seed_002_checkout(root: Path) -> Path:
    """Their own clone of flash-attention's main: its setup.py reads __version__ from flash_attn/__init__.py, and
    carries the seed's local fix (NVCC_THREADS stripped of spaces), not committed."""
    tree = root / "omni" / "flash-attention"
    (tree / "flash_attn").mkdir(parents=True)
    (tree / "setup.py").write_text(
        "import re\nfrom pathlib import Path\nimport setuptools\n\n"
        "def get_package_version():\n"
        "    text = (Path(__file__).parent / 'flash_attn' / '__init__.py').read_text()\n"
        "    return re.search(r'^__version__\\s*=\\s*(.*)$', text, re.M).group(1).strip('\"')\n\n"
        "setuptools.setup(name='flash_attn', version=get_package_version(), packages=['flash_attn'])\n")
    (tree / "flash_attn" / "__init__.py").write_text('__version__ = "2.8.3"\n')
    env = dict(os.environ, GIT_AUTHOR_NAME="u", GIT_AUTHOR_EMAIL="u@u", GIT_COMMITTER_NAME="u", GIT_COMMITTER_EMAIL="u@u")
    for cmd in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "main"]):
        subprocess.run(["git", *cmd], cwd=tree, env=env, check=True, capture_output=True)
    with (tree / "setup.py").open("a") as fh:
        fh.write("# local fix: os.getenv('NVCC_THREADS', '1').strip()\n")
    return tree


def ps_blocks(script: str) -> dict[str, str]:
    """The files a PowerShell script writes from here-strings, by name: the helper, its modules, build.json."""
    found = re.findall(r"WriteAllText\((\$Helper|\$Doc|\(Join-Path \$Work '([\w.]+)'\)), @'\n(.*?)\n?'@\)", script, re.S)
    names = {"$Helper": "imagegen_windows.py", "$Doc": "build.json"}
    return {names.get(target) or name: text for target, name, text in found}


def cmd_blocks(script: str) -> dict[str, str]:
    """The files a cmd script writes with echoed base64 lines, by name: the helper, its modules, build.json."""
    found = re.findall(r"\(\r\n((?:echo [A-Za-z0-9+/=]+\r\n)+)\) > \"(%IG_HELPER%|%IG_DOC%|%IG_WORK%\\[\w.]+)\.b64\"",
                       script)
    names = {"%IG_HELPER%": "imagegen_windows.py", "%IG_DOC%": "build.json"}
    return {names.get(target) or target.split("\\")[-1]:
            base64.b64decode("".join(line[5:] for line in lines.split("\r\n") if line)).decode()
            for lines, target in found}


def test_seed_002_the_script_comes_from_their_venv_and_their_checkout(tmp_path):
    tree = seed_002_checkout(tmp_path)
    status_before = subprocess.run(["git", "status", "--porcelain"], cwd=tree, capture_output=True, text=True).stdout
    venv_python = fake_host(tmp_path, python=HERE_PY, torch="2.8.0", torch_cuda="12.9", nvcc="12.9")
    # Their command line, with no --torch, --cuda or --python: the venv says them.
    _, err = ok(imagegen("render", "flash-attn", "--shell", "cmd", "--arch", "8.0;12.0", "--src-dir", str(tree),
                         "--python-exe", venv_python, "-o", "build.cmd"))
    cell = f"fa2-2_8_3_local-torch2_8-cu129-py{HERE_PY.replace('.', '')}"
    assert err.strip() == f"wrote build.cmd: 1 cell(s) of flash-attn 2.8.3-local: {cell}"
    script = Path("build.cmd").read_bytes().decode()
    assert parse_errors(script, "cmd") == []
    lines = script.split("\r\n")
    # never a torch into their venv: only the cells' own venvs get one, and the requirements go in without a pin
    assert "if defined IG_PYTHON_EXE goto :have_python" in lines
    requirements = next(line for line in lines if '-m pip install --disable-pip-version-check "setuptools"' in line)
    assert "torch" not in requirements
    assert 'set "IG_SRC_BUILD=%IG_WORK%\\src"' in lines  # their tree is built from a copy
    assert any('fetch --doc "%IG_DOC%" --src "%IG_SRC%" --copy "%IG_WORK%\\src"' in line for line in lines)
    assert 'set "FLASH_ATTN_CUDA_ARCHS=80;120"' in lines and 'set "MAX_JOBS=1"' in lines and 'set "NVCC_THREADS=1"' in lines

    work = tmp_path / "imagegen-windows"
    work.mkdir()
    blocks = cmd_blocks(script)
    assert set(blocks) == {"imagegen_windows.py", "build.json", *(name for _, name in HELPER_MODULES)}
    for name, text in blocks.items():
        (work / name).write_text(text)
    doc = json.loads(blocks["build.json"])
    assert doc["source"]["kind"] == "local" and doc["version"] == "2.8.3-local"
    assert doc["cells"][0]["torch"] == "2.8.0" and doc["cells"][0]["cuda"] == "cu129"
    check = run_helper(tmp_path, work, "check", "--cell", cell, torch="2.8.0+cu129", cuda="12.9", nvcc="12.9")
    assert check.returncode == 0, check.stdout + check.stderr
    fetch = run_helper(tmp_path, work, "fetch", "--src", str(tree), "--copy", str(work / "src"),
                       torch="2.8.0+cu129", cuda="12.9", nvcc="12.9")
    assert fetch.returncode == 0, fetch.stdout + fetch.stderr
    assert "# local fix" in (work / "src" / "setup.py").read_text()  # their fix is what builds
    assert subprocess.run(["git", "status", "--porcelain"], cwd=tree, capture_output=True,
                          text=True).stdout == status_before  # and their tree is as it was


def test_a_checkout_at_the_pin_given_as_src_dir_stays_at_the_pin_and_renders_the_same_script_again(tmp_path):
    # The script used to fetch into a --src-dir checkout at the pin and patch it in place, so rendering
    # again on that folder saw the pin "with changes" and made a -local script. The checkout is the user's:
    # the script fetches into it only when it is empty, and each cell builds a patched copy.
    env = dict(os.environ, GIT_AUTHOR_NAME="u", GIT_AUTHOR_EMAIL="u@u", GIT_COMMITTER_NAME="u", GIT_COMMITTER_EMAIL="u@u")
    tree = tmp_path / "tiny"
    tree.mkdir()
    (tree / "setup.py").write_text("import setuptools\nsetuptools.setup(name='tiny_kernel', version='0.1.0')\n")
    for cmd in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "v0.1.0"]):
        subprocess.run(["git", *cmd], cwd=tree, env=env, check=True, capture_output=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tree, capture_output=True, text=True).stdout.strip()
    recipes = tmp_path / "recipes"
    (recipes / "patches").mkdir(parents=True)
    (recipes / "patches" / "tiny-mark.patch").write_text(
        "--- a/setup.py\n+++ b/setup.py\n@@ -1,2 +1,3 @@\n import setuptools\n+PATCHED_BY_RECIPE = True\n"
        " setuptools.setup(name='tiny_kernel', version='0.1.0')\n")
    (recipes / "tiny.yaml").write_text(
        "schema: 1\nname: tiny\ndistribution: tiny_kernel\nsource:\n  git: https://example.invalid/tiny-kernel.git\n"
        f'versions:\n  "0.1.0":\n    ref: v0.1.0\n    commit: "{commit}"\n    archs: ["8.0", "9.0"]\n'
        "    patches:\n      - file: tiny-mark.patch\n        reason: marks the build\n"
        "arch: {env: TORCH_CUDA_ARCH_LIST, style: torch, ptx: honoured}\n"
        "build:\n  requires: [setuptools, wheel]\nsmoke:\n  imports: [tiny_kernel]\n")
    argv = ("render", "tiny", "--recipe-dir", str(recipes), "--shell", "cmd", "--arch", "8.0", "--src-dir", str(tree),
            "--torch", "2.8", "--cuda", "12.8", "--python", HERE_PY)
    _, err = ok(imagegen(*argv, "-o", "build.cmd"))
    assert "of tiny 0.1.0:" in err  # the pin, not 0.1.0-local
    script = Path("build.cmd").read_bytes().decode()
    work = tmp_path / "imagegen-windows"
    work.mkdir()
    for name, text in cmd_blocks(script).items():
        (work / name).write_text(text)
    (fetch_line,) = [line for line in script.split("\r\n") if '"%IG_HELPER%" fetch ' in line]
    fetch_args = [word.replace("%IG_SRC%", str(tree)).replace("%IG_WORK%", str(work)).replace("\\", os.sep)
                  for word in re.findall(r'"([^"]*)"|(\S+)', fetch_line.split(" fetch ", 1)[1].split(" >> ")[0])
                  for word in word if word]
    assert fetch_args[:2] == ["--doc", "%IG_DOC%"]
    for run in range(2):  # two cells (or two runs of the script) on the same checkout
        fetch = run_helper(tmp_path / f"run{run}", work, "fetch", *fetch_args[2:], torch="2.8.0+cu128", cuda="12.8", nvcc="12.8")
        assert fetch.returncode == 0, fetch.stdout + fetch.stderr
        assert "source already present" in fetch.stdout and "the recipe's patches go on the build's copy" in fetch.stdout
        assert "PATCHED_BY_RECIPE" in (work / "src" / "setup.py").read_text()  # what builds is patched
    assert subprocess.run(["git", "status", "--porcelain"], cwd=tree, capture_output=True, text=True).stdout == ""
    ok(imagegen(*argv, "-o", "build.cmd"))
    assert Path("build.cmd").read_bytes().decode() == script
