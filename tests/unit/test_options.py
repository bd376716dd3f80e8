"""imagegen.plan.options: flags first, then the project config, then imagegen's defaults, for every value
a command runs with (resolved in one place)."""

from __future__ import annotations

import os

from pathlib import Path

import pytest

from imagegen.errors import UsageError
from imagegen.plan import options
from imagegen.plan.config import Config, Matrix, load_config
from imagegen.plan.matrix import defaults


def ns(**kw) -> options.Flags:
    return options.Flags(**kw)


def test_defaults_when_neither_flags_nor_config_say():
    o = options.resolve(ns(), Config())
    d = defaults()
    assert o.flavor == d["flavor"] and not o.flavor_given and o.base_image is None and o.registry is None
    # No axis named: each is left to the default policy (plan.choose_cell), one value per cell.
    assert o.torch == () and o.cuda == () and o.python == () and o.archs == (d["arch"],)
    assert o.out == Path("wheelhouse") and o.out_written == "wheelhouse" and o.recipes == ()
    assert (o.torch_one, o.cuda_one, o.python_one, o.arch_configured) == (None, None, None, None)


def test_the_config_file_beats_the_defaults(tmp_path):
    (tmp_path / "imagegen.toml").write_text(
        'flavor = "pypi"\nregistry = "127.0.0.1:5000/ml"\nout = "wh"\nbase-image = "python:3.12-slim"\n'
        '[matrix]\nrecipes = ["sage"]\ntorch = ["2.9", "2.11"]\ncuda = "13.0"\npython = ["3.11", "3.12"]\narch = "9.0"\n')
    config = load_config(search_from=tmp_path)
    o = options.resolve(ns(), config)
    assert (o.flavor, o.registry, o.base_image) == ("pypi", "127.0.0.1:5000/ml", "python:3.12-slim")
    assert o.flavor_given  # the config named it: no fallback flavor
    assert o.out == tmp_path / "wh" and o.recipes == ("sage",)
    assert o.out_written == os.path.relpath(tmp_path / "wh")  # generated files name it from the current folder
    assert options.resolve(ns(out="elsewhere/wh"), config).out_written == "elsewhere/wh"  # --out as given
    assert o.torch == ("2.9", "2.11") and o.cuda == ("13.0",) and o.archs == ("9.0",)
    # one cell (render): the config matrix's last entry, the newest listed
    assert (o.torch_one, o.cuda_one, o.python_one, o.arch_configured) == ("2.11", "13.0", "3.12", "9.0")


def test_flags_beat_the_config_file():
    config = Config(flavor="pypi", registry="a:1/x", out=Path("cfg"), matrix=Matrix(torch=("2.9",), arch="9.0"),
                    path=Path("imagegen.toml"))
    o = options.resolve(ns(flavor="cuda", registry="b:2/y", out="flag", torch=["2.11", "2.11"], arch=["8.0", "12.0"],
                           recipes=["flash-attn"], base_image="img:1"), config)
    assert (o.flavor, o.registry, o.out, o.base_image) == ("cuda", "b:2/y", Path("flag"), "img:1")
    assert o.torch == ("2.11",) and o.archs == ("8.0", "12.0") and o.recipes == ("flash-attn",)
    assert (o.torch_one, o.arch_configured) == ("2.11", "8.0")
    # render's single-valued flags
    o = options.resolve(ns(torch="2.10", arch="12.0+PTX"), config)
    assert (o.torch_one, o.arch_configured) == ("2.10", "12.0+PTX")


def test_lists_inside_one_flag_and_the_python_notations_users_type():
    # A matrix flag (repeatable): lists inside one value, spaces or commas, beside repeated flags.
    o = options.resolve(ns(torch=["2.8,2.9", "2.11"], cuda=["12.8 13.0"], python=["cp312", "311, py3.10"]), Config())
    assert o.torch == ("2.8", "2.9", "2.11") and o.cuda == ("12.8", "13.0")
    assert o.python == ("3.12", "3.11", "3.10")
    assert options.resolve(ns(python=["3.12.4", "3.12"]), Config()).python == ("3.12",)
    # A one-cell flag (render's, a plain value) refuses a list in one line instead of taking part of it.
    import pytest


    with pytest.raises(UsageError, match="--torch takes one value here"):
        options.resolve(ns(torch="2.8,2.9"), Config())
    assert options.resolve(ns(torch="2.8", python="cp312"), Config()).python_one == "3.12"
    with pytest.raises(UsageError, match="not a CPython version"):
        options.resolve(ns(python=["cp2"]), Config())
    # The arch flag keeps its own notation: one value is one arch list, spaces and all.
    assert options.resolve(ns(arch=["8.0 9.0", "12.0+PTX"]), Config()).archs == ("8.0 9.0", "12.0+PTX")


def test_the_seed_notations_reach_a_plan_through_the_command_line():
    from tests.unit.test_cli import run

    code, out, err = run("plan", "sage", "--torch", "2.8,2.9", "--cuda", "12.8", "--python", "cp312", "--arch", "9.0",
                         "--json")
    assert code == 0, err
    import json

    cells = json.loads(out)["cells"]
    assert sorted((c["torch"][:3], c["python"]) for c in cells) == [("2.8", "3.12"), ("2.9", "3.12")], cells
    code, _, err = run("render", "sage", "--torch", "2.8 2.9", "--arch", "9.0")
    assert code == 2 and err.count("\n") == 1 and "--torch takes one value here" in err


def test_a_named_torch_gets_its_own_pypi_cuda_python_312_and_a_flavor_that_can_build_it():
    from tests.unit.test_cli import run

    # torch 2.15 publishes cu132 only: runpod has no CUDA 13.2 image, so with no --flavor the cell
    # goes to the pypi flavor and says why; --flavor runpod keeps runpod and its refusal.
    import json

    code, out, _ = run("plan", "sage", "--torch", "2.15", "--arch", "9.0", "--json")
    (cell,) = json.loads(out)["cells"]
    assert code == 0 and (cell["torch"], cell["cuda"], cell["python"], cell["flavor"]) == ("2.15.0", "cu132", "3.12", "manylinux")
    assert any(n.startswith("flavor manylinux (no --flavor given): runpod cannot build it (runpod/pytorch has no CUDA 13.2")
               for n in cell["notes"]), cell["notes"]
    code, out, _ = run("plan", "sage", "--torch", "2.15", "--arch", "9.0", "--flavor", "runpod", "--json")
    (cell,) = json.loads(out)["cells"]
    assert code == 3 and cell["status"] == "rejected" and cell["flavor"] == "runpod"
    code, out, _ = run("plan", "sage", "--torch", "2.8", "--arch", "9.0", "--json")
    (cell,) = json.loads(out)["cells"]
    assert (cell["torch"], cell["cuda"], cell["python"], cell["flavor"]) == ("2.8.0", "cu128", "3.12", "runpod")


def test_base_image_per_cuda_version(tmp_path, capsys):
    import json

    from imagegen.cli import main
    from imagegen.plan.config import load_config
    from imagegen.errors import ConfigError, UsageError

    assert options.base_images(None) is None and options.base_images(["img:1"]) == "img:1"
    assert options.base_images(["12.8=a/b:1", "cu130=c/d:2", "e/f:3"]) == {"cu128": "a/b:1", "cu130": "c/d:2", "*": "e/f:3"}
    assert options.base_images("127.0.0.1:5000/x=y:1") == "127.0.0.1:5000/x=y:1"  # "=" after the host: the image's
    with pytest.raises(UsageError, match="two images for CUDA 12.8"):
        options.base_images(["12.8=a:1", "cu128=b:1"])
    with pytest.raises(UsageError, match="is not a CUDA version"):
        options.base_images(["twelve=a:1"])
    argv = ["plan", "sage", "--torch", "2.11", "--cuda", "12.8 13.0", "--python", "3.11", "--arch", "9.0",
            "--flavor", "pypi", "--base-image", "12.8=imagegen-test/python:3.11-bookworm", "--base-image",
            "python:3.11-slim", "--json"]
    assert main(argv) == 0
    cells = {c["cuda"]: c["base_image"] for c in json.loads(capsys.readouterr().out)["cells"]}
    assert cells == {"cu128": "imagegen-test/python:3.11-bookworm", "cu130": "python:3.11-slim"}
    cfg = tmp_path / "imagegen.toml"
    cfg.write_text('[tool.imagegen.base-image]\n"12.8" = "a/b:1"\n"13.0" = "c/d:2"\n')
    assert load_config(cfg).base_image == {"cu128": "a/b:1", "cu130": "c/d:2"}
    cfg.write_text('[tool.imagegen.base-image]\n"12.8" = "a b"\n')
    with pytest.raises(ConfigError, match="base-image"):
        load_config(cfg)
    # A list is the primary and its fallbacks, tried in order when the primary cannot be pulled.
    cfg.write_text('[tool.imagegen.base-image]\n"12.8" = ["a/b:1", "c/d:2"]\n')
    assert load_config(cfg).base_image == {"cu128": "a/b:1,c/d:2"}
    cfg.write_text('[tool.imagegen]\nbase-image = ["a/b:1", "c/d:2"]\n')
    assert load_config(cfg).base_image == "a/b:1,c/d:2"
    cfg.write_text('[tool.imagegen]\nbase-image = ["a/b:1", "$(id)"]\n')
    with pytest.raises(ConfigError, match="base-image"):
        load_config(cfg)
    assert options.base_images(["13.0=127.0.0.1:9/x/y:1,a/b:2"]) == {"cu130": "127.0.0.1:9/x/y:1,a/b:2"}


# ---------------------------------------------------------------------------------------- --env


def test_user_env_keeps_the_value_after_the_first_equals_sign_and_allows_empty_values():
    assert options.user_env(None) == {}  # a command without --env
    assert options.user_env(["A=b=c", "B=", "A=b=c"]) == {"A": "b=c", "B": ""}


@pytest.mark.parametrize("item, says", [
    ("lower-case-dash=1", "expected NAME=VALUE"),
    ("A" * 129 + "=1", "expected NAME=VALUE"),
    ("A='x'", "bad value"),
    ('A="x"', "bad value"),
])
def test_user_env_refuses_names_and_values_it_cannot_pass_on(item, says):
    with pytest.raises(UsageError, match=says) as info:
        options.user_env([item])
    assert "\n" not in str(info.value) and len(str(info.value)) < 250


# ---------------------------------------------------------------------------------------- resolve
