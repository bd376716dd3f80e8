"""Tests for imagegen.plan.config: finding imagegen.toml / [tool.imagegen], reading every key (paths relative to
the file), and the one-line ConfigError (exit 2) for each kind of broken config file."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from imagegen.plan.config import MAX_CONFIG_BYTES, Config, Matrix, find_config, load_config
from imagegen.safety import read_toml
from imagegen.errors import ConfigError
from imagegen.model.base_images import container_flavors

FULL = """\
[tool.imagegen]
out = "dist/wheels"
registry = "127.0.0.1:5000/ml"
recipe-dirs = ["recipes", "more/recipes"]
flavor = "{flavor}"
base-image = "nvidia/cuda:12.8.1-devel-ubuntu24.04"
torch-index-url = "https://download.pytorch.org/whl/cu128"

[tool.imagegen.matrix]
recipes = ["sage", "flash-attn"]
torch = ["2.8", "2.9"]
cuda = "12.8"
python = [3.12]
arch = "8.0;9.0;12.0+PTX"
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_every_key_is_read_and_paths_are_relative_to_the_file(tmp_path):
    flavor = container_flavors()[0]
    path = write(tmp_path / "proj" / "pyproject.toml", FULL.format(flavor=flavor))
    config = load_config(path)
    proj = tmp_path / "proj"
    assert config == Config(
        path=path, out=proj / "dist" / "wheels", registry="127.0.0.1:5000/ml", flavor=flavor,
        base_image="nvidia/cuda:12.8.1-devel-ubuntu24.04", recipe_dirs=(proj / "recipes", proj / "more" / "recipes"),
        torch_index_url="https://download.pytorch.org/whl/cu128",
        matrix=Matrix(recipes=("sage", "flash-attn"), torch=("2.8", "2.9"), cuda=("12.8",), python=("3.12",),
                      arch="8.0;9.0;12.0+PTX"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.out = Path("elsewhere")  # type: ignore[misc]


def test_no_file_means_the_defaults(tmp_path):
    assert load_config() == Config() and Config().out == Path("wheelhouse") and Config().matrix == Matrix()
    write(tmp_path / "pyproject.toml", '[project]\nname = "x"\n')  # no [tool.imagegen]: not a config
    assert load_config(tmp_path / "pyproject.toml") == Config(path=tmp_path / "pyproject.toml")


def test_an_imagegen_toml_may_skip_the_tool_table(tmp_path):
    text = 'out = "o"\n[matrix]\ntorch = "2.9"\narch = ["8.0", "9.0"]\n'
    plain = load_config(write(tmp_path / "a" / "imagegen.toml", text))
    assert plain.out == tmp_path / "a" / "o" and plain.matrix.torch == ("2.9",) and plain.matrix.arch == "8.0;9.0"
    tabled = load_config(write(tmp_path / "b" / "imagegen.toml", '[tool.imagegen]\nout = "o"\n'))
    assert tabled.out == tmp_path / "b" / "o"


def test_the_nearest_config_wins_and_imagegen_toml_before_pyproject(tmp_path):
    root = tmp_path / "root"
    deep = root / "a" / "b" / "c"
    deep.mkdir(parents=True)
    write(root / "imagegen.toml", 'out = "top"\n')
    assert find_config(deep) == (root / "imagegen.toml").resolve()
    # a pyproject.toml without [tool.imagegen] on the way is passed over
    write(root / "a" / "b" / "pyproject.toml", '[project]\nname = "x"\n')
    assert find_config(deep) == (root / "imagegen.toml").resolve()
    write(root / "a" / "pyproject.toml", '[tool.imagegen]\nout = "mid"\n')
    assert find_config(deep) == (root / "a" / "pyproject.toml").resolve()
    write(root / "a" / "imagegen.toml", 'out = "mid2"\n')
    assert find_config(deep) == (root / "a" / "imagegen.toml").resolve()
    assert load_config(search_from=deep).out == (root / "a" / "mid2").resolve()
    # an explicit path is taken as given, whatever lies nearer
    assert load_config(root / "imagegen.toml", search_from=deep).out == root / "top"


def test_find_config_walks_up_from_a_relative_start(tmp_path, monkeypatch):
    write(tmp_path / "imagegen.toml", "")
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    assert find_config(Path(".")) == (tmp_path / "imagegen.toml").resolve()


def test_lists_accept_a_single_value_and_numbers(tmp_path):
    path = write(tmp_path / "imagegen.toml", 'recipe-dirs = "r"\n[matrix]\ntorch = 2.9\npython = [3.11, "3.12"]\n'
                                             'recipes = "sage"\n')
    config = load_config(path)
    assert config.recipe_dirs == (tmp_path / "r",)
    assert config.matrix.torch == ("2.9",) and config.matrix.python == ("3.11", "3.12")
    assert config.matrix.recipes == ("sage",) and config.matrix.cuda == () and config.matrix.arch is None


@pytest.mark.parametrize("body, needle", [
    ('colour = "red"\n', "tool.imagegen.colour: unknown key (known: base-image, flavor, layout, matrix, offline, out, recipe-dirs,"),
    ('offline = "yes"\n', "tool.imagegen.offline: expected true or false"),
    ('flavor = "nightly"\n', "tool.imagegen.flavor: 'nightly' is not one of"),
    ("flavor = 3\n", "tool.imagegen.flavor: 3 is not one of"),
    ('base-image = "FROM x\\nRUN id"\n', "tool.imagegen.base-image: "),
    ("base-image = 5\n", "tool.imagegen.base-image: 5 is not an image reference"),
    ('registry = "my registry"\n', "tool.imagegen.registry: 'my registry' is not a registry/namespace"),
    # the team's builder images: HOST[:PORT]/NAMESPACE in lower case, as image references need it
    ('registry = "GHCR.io/MyTeam"\n', "tool.imagegen.registry: 'GHCR.io/MyTeam' is not a registry/namespace like"),
    ('registry = "ghcr.io"\n', "tool.imagegen.registry: 'ghcr.io' is not a registry/namespace"),
    ('registry = "ghcr.io/team/img:1"\n', "(HOST[:PORT]/NAMESPACE, lower case)"),
    ('registry = "https://ghcr.io/team"\n', "tool.imagegen.registry: 'https://ghcr.io/team' is not"),
    ('registry = "ghcr.io/team\\n  evil: 1"\n', "tool.imagegen.registry: 'ghcr.io/team\\n"),
    ("registry = 5000\n", "tool.imagegen.registry: 5000 is not a registry/namespace"),
    ('torch-index-url = "ftp://x/y"\n', "tool.imagegen.torch-index-url: 'ftp://x/y' is not an http(s) URL"),
    ("out = 5\n", "tool.imagegen.out: expected a folder's path"),
    ("matrix = 5\n", "tool.imagegen.matrix: must be a table"),
    ("[matrix]\nflavor = \"cuda\"\n", "tool.imagegen.matrix.flavor: unknown key (known: arch, cuda, python, recipes,"),
    ("[matrix]\narch = 9.0\n", "tool.imagegen.matrix.arch: expected a string like"),
    ("[matrix]\ntorch = true\n", "tool.imagegen.matrix.torch: expected a string or a list of strings, got True"),
    ("[matrix]\ncuda = [\"12.8\", {a = 1}]\n", "tool.imagegen.matrix.cuda: expected a string or a list of strings"),
    ("recipe-dirs = [[\"a\"]]\n", "tool.imagegen.recipe-dirs: expected a string or a list of strings"),
])
def test_a_bad_value_is_one_line_naming_the_file_and_key(tmp_path, body, needle):
    path = write(tmp_path / "imagegen.toml", body)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and needle in message, message
    assert "\n" not in message and info.value.exit_code == 2


def test_a_pyproject_whose_tool_imagegen_is_not_a_table(tmp_path):
    path = write(tmp_path / "pyproject.toml", '[tool]\nimagegen = "yes"\n')
    with pytest.raises(ConfigError, match=r"\[tool.imagegen\] must be a table"):
        load_config(path)


def test_files_that_are_not_toml_configs(tmp_path):
    cases = {
        "missing.toml": (None, "no such config file"),
        "dir.toml": ("dir", "not a regular file"),
        "bad.toml": (b'out = "unterminated\n', "not valid TOML"),
        "binary.toml": (b"\xff\xfe\x00garbage", "not UTF-8 text (a binary file?)"),
        "deep.toml": (b"a = " + b"[" * 100_000 + b"]" * 100_000, "not valid TOML (nested too deeply)"),
        "big.toml": (b"# x\n" * (MAX_CONFIG_BYTES // 4 + 1), f"at most {MAX_CONFIG_BYTES} are read"),
    }
    for name, (content, needle) in cases.items():
        path = tmp_path / name
        if content == "dir":
            path.mkdir()
        elif content is not None:
            path.write_bytes(content)
        with pytest.raises(ConfigError) as info:
            load_config(path)
        assert needle in str(info.value) and str(info.value).startswith(str(path)), (name, str(info.value))
        assert "\n" not in str(info.value)


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    os.mkfifo(tmp_path / "imagegen.toml")
    with pytest.raises(ConfigError, match="not a regular file"):
        load_config(tmp_path / "imagegen.toml")
    with pytest.raises(ConfigError, match="cannot read: not a regular file"):
        read_toml(tmp_path / "imagegen.toml")


def test_an_unusable_path_name_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / ("n" * 5000 + ".toml"))


def test_read_toml_inside_a_tree_does_not_follow_links_out_of_it(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    write(tmp_path / "secret.toml", 'token = "s3cret"\n')
    (tree / "pyproject.toml").symlink_to(tmp_path / "secret.toml")
    with pytest.raises(ConfigError, match="leads outside its directory") as info:
        read_toml(tree / "pyproject.toml", inside=tree)
    assert "s3cret" not in str(info.value)
    write(tree / "own.toml", "[tool.imagegen]\nout = 'w'\n")
    assert read_toml(tree / "own.toml", inside=tree) == {"tool": {"imagegen": {"out": "w"}}}
    assert read_toml(tree / "pyproject.toml") == {"token": "s3cret"}  # without inside: the user's own choice


@pytest.mark.parametrize("value", ['"\\u0000"', '"out\\u0000x"', '""', '"a\\nb"', '"x\\u202ey"', "7"])
def test_an_out_that_is_no_folders_path_is_one_config_error(tmp_path, value):
    # out = "\u0000" reached os.path.realpath and ended as an internal error (exit 70), 2026-11-28
    path = write(tmp_path / "imagegen.toml", f"out = {value}\n")
    with pytest.raises(ConfigError, match=r"tool\.imagegen\.out: expected a folder's path"):
        load_config(path)


def test_a_nul_in_a_config_out_is_exit_2_from_the_cli(tmp_path, monkeypatch, capsys):
    from imagegen import cli
    write(tmp_path / "imagegen.toml", 'out = "w\\u0000h"\n')
    monkeypatch.chdir(tmp_path)
    assert cli.main(["render", "sage"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "internal error" not in err and "out: expected a folder's path" in err


def test_one_line_of_config_names_the_team_registry(tmp_path):
    # What a teammate's `imagegen pull sage --arch 12.0+PTX` reads instead of --registry (a flag still wins:
    # tests/unit/test_options.py); a credential in it is refused without being shown.
    path = write(tmp_path / "pyproject.toml", '[project]\nname = "x"\n\n[tool.imagegen]\nregistry = "ghcr.io/myteam"\n')
    assert load_config(search_from=tmp_path).registry == "ghcr.io/myteam"
    write(path, '[tool.imagegen]\nregistry = "me:ghp_abcdefghijklmnopqrstuvwxyz0123456789@ghcr.io/myteam"\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "ghp_abcdefghijklmnopqrstuvwxyz0123456789" not in str(info.value) and "\n" not in str(info.value)
