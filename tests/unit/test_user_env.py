"""`--env NAME=VALUE`: a package's own build variables, passed to every way of building (the cell
document of a rendered Dockerfile or bake file, a native build, a pulled builder image's `docker run`,
the Windows scripts); the variables imagegen sets itself are refused, each with the flag that sets it."""

from __future__ import annotations

import json
import re

import pytest

from imagegen.executors.prebuilt import env_args
from imagegen.model.arch_parse import parse_arch_list
from imagegen.model.catalogue import load_catalogue
from imagegen.plan.matrix import make_cell
from tests.unit.test_cli import run

CELL = ["--torch", "2.9", "--cuda", "12.8", "--python", "3.12", "--arch", "9.0"]


def rendered(tmp_path, *argv: str) -> tuple[str, dict]:
    """`imagegen render ARGV -o DIR/Dockerfile`: the Dockerfile and the cell document beside it
    (<cell>/cell.json, what the build script reads)."""
    out = tmp_path / f"r{len(list(tmp_path.glob('r*')))}"
    code, _, err = run("render", *argv, "-o", str(out / "Dockerfile"))
    assert code == 0, err
    (doc,) = out.glob("*/cell.json")
    return (out / "Dockerfile").read_text(), json.loads(doc.read_text())


def inputs_label(text: str) -> str:
    return re.search(r'io\.imagegen\.inputs="([0-9a-f]+)"', text).group(1)


def test_env_reaches_the_cell_document_and_the_inputs_hash(tmp_path):
    plain, plain_doc = rendered(tmp_path, "fa2", *CELL)
    out, doc = rendered(tmp_path, "fa2", *CELL, "--env", "FLASH_ATTENTION_DISABLE_BACKWARD=TRUE",
                        "--env", "NVCC_APPEND_FLAGS=-lineinfo")
    env = doc["env"]
    assert env["FLASH_ATTENTION_DISABLE_BACKWARD"] == "TRUE" and env["NVCC_APPEND_FLAGS"] == "-lineinfo"
    assert {k: v for k, v in env.items() if k not in ("FLASH_ATTENTION_DISABLE_BACKWARD", "NVCC_APPEND_FLAGS")} \
        == plain_doc["env"]  # the recipe's own stay
    # Another build, another wheel: the up-to-date check must not take the plain one for it.
    assert inputs_label(out) != inputs_label(plain)
    # Only as JSON: no RUN, ENV or ARG instruction carries it.
    assert not any(ln.startswith(("RUN", "ENV", "ARG")) and "NVCC_APPEND_FLAGS" in ln for ln in out.splitlines())


def test_the_knobs_that_lighten_each_file_give_the_cell_its_memory_figure(tmp_path):
    # flash-attn-3's memory_when_env: with all five in-file paths turned off, each kernel file takes
    # less (the H100 runs of docs/records/verification.md): the cell document (what the in-build script sizes
    # MAX_JOBS from) carries that figure; four of the five are not enough.
    cell = ["--torch", "2.11", "--cuda", "13.0", "--python", "3.12", "--arch", "9.0a"]
    lite = [f"FLASH_ATTENTION_DISABLE_{k}=TRUE" for k in ("VARLEN", "LOCAL", "APPENDKV", "CLUSTER", "SOFTCAP")]
    figures = {}
    for name, env in (("plain", []), ("four", lite[:4]), ("lite", lite)):
        _, doc = rendered(tmp_path, "flash-attn-3", *cell, *[a for e in env for a in ("--env", e)])
        figures[name] = (doc["memory_per_thread_gb"], doc["memory_per_thread_gb_max"])
    assert figures == {"plain": (6.0, 6.0), "four": (6.0, 6.0), "lite": (3.3, 3.3)}


def test_env_reaches_bake_and_the_windows_scripts(tmp_path, monkeypatch):
    from imagegen.render import bakefiles
    from tests.unit import bake_print_stand_in

    monkeypatch.setattr(bakefiles, "print_bake", bake_print_stand_in.print_bake)
    monkeypatch.chdir(tmp_path)
    code, _, err = run("bake", "sage", *CELL, "--env", "SAGE_DEBUG=1", "-f", "docker-bake.json")
    assert code == 0, err
    (doc,) = (tmp_path / "dockerfiles").glob("*/cell.json")
    assert json.loads(doc.read_text())["env"]["SAGE_DEBUG"] == "1"
    code, out, err = run("render", "sage", "--arch", "9.0", "--shell", "powershell", "--env", "SAGE_DEBUG=a,b")
    assert code == 0 and "'SAGE_DEBUG' = 'a,b'" in out, err  # the cell's Env, set before pip wheel
    code, out, err = run("render", "sage", "--arch", "9.0", "--shell", "cmd", "--env", "SAGE_DEBUG=a,b")
    assert code == 0 and 'set "SAGE_DEBUG=a,b"' in out, err


def test_a_pulled_builder_image_gets_the_env_at_run_time():
    # The image was pushed without the user's variables: `docker run -e` hands them in.
    from imagegen.model.recipes import with_env

    recipe = load_catalogue().get("sage")
    version = with_env(recipe, recipe.version(None), {"SAGE_DEBUG": "1"})
    cell = make_cell(recipe, version, "2.9", "12.8", "3.12", parse_arch_list("9.0"), "runpod")
    args = env_args(cell)
    assert args[args.index("SAGE_DEBUG=1") - 1] == "-e"


@pytest.mark.parametrize("value, says", [
    ("TORCH_CUDA_ARCH_LIST=8.0", "use --arch"),
    ("FLASH_ATTN_CUDA_ARCHS=80", "use --arch"),  # the recipe's own arch knob
    ("MAX_JOBS=2", "imagegen build sets it (--max-jobs)"),
    ("NVCC_THREADS=2", "imagegen build sets it (--nvcc-threads)"),
    ("FLASH_ATTENTION_FORCE_BUILD=FALSE", "compile from source"),
    ("CUDA_HOME=/opt/cuda", "give a package's own variables only"),
    ("IMAGEGEN_CELL=/x", "give a package's own variables only"),
    ("PIP_INDEX_URL=http://x", "give a package's own variables only"),
    ("NOEQUALS", "expected NAME=VALUE"),
    ("=1", "expected NAME=VALUE"),
    ("1X=1", "expected NAME=VALUE"),
    ("X=$(id)", "bad value"),
    ("X=`id`", "bad value"),
    ("X=a\nRUN id", "bad value"),
    ("X=" + "a" * 600, "bad value"),
])
def test_refused_env_is_one_line_and_says_why(value, says):
    code, out, err = run("plan", "fa2", *CELL, "--env", value)
    assert code == 2 and not out, err
    assert err.count("\n") == 1 and err.startswith("imagegen: error: --env ") and says in err, err


def test_the_same_variable_twice_must_agree():
    assert run("plan", "fa2", *CELL, "--env", "A=1", "--env", "A=1")[0] == 0
    code, _, err = run("plan", "fa2", *CELL, "--env", "A=1", "--env", "A=2")
    assert code == 2 and "given twice" in err
