"""Tests for imagegen.commands.common: config, catalogue, the flags as Options, and the checks of handed-on
values.

The lock file, the native cell, the flags a command's parser gives, and the checks of registry, builders,
cache specs, CA bundle, executables, the command line. (The matrix and plan: test_request.py.)"""

from __future__ import annotations

import os

import pytest

from imagegen.commands import common
from imagegen.plan.config import Config
from imagegen.errors import CompatError, LockFileError, RecipeError, RegistryError, UsageError
from imagegen.model.catalogue import load_catalogue
from imagegen.model.cell import BUILDABLE
from imagegen.plan.matrix import defaults
from tests.unit.command_helpers import FIXTURES, TINY, fake_host, native_cell, parse


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no project config of the checkout is found


@pytest.fixture(scope="module")
def cat():
    return load_catalogue()


# ------------------------------------------------------------------------------ config, catalogue


def test_config_is_searched_from_the_current_folder_or_read_from_config(tmp_path):
    assert common.config(parse("plan")).path is None  # nothing here: imagegen's defaults
    (tmp_path / "imagegen.toml").write_text('flavor = "pypi"\n')
    assert common.config(parse("plan")).flavor == "pypi"
    other = tmp_path / "elsewhere" / "ci.toml"
    other.parent.mkdir()
    other.write_text('flavor = "cuda"\nregistry = "127.0.0.1:5000/ml"\n')
    config = common.config(parse("plan", "--config", other))
    assert (config.flavor, config.registry, config.path) == ("cuda", "127.0.0.1:5000/ml", other)


def test_catalogue_adds_the_config_and_flag_recipe_dirs(tmp_path):
    assert "routed-kernels" not in load_catalogue().names()
    by_flag = common.catalogue(parse("plan", "--recipe-dir", FIXTURES / "routed_kernels"), Config())
    assert "routed-kernels" in by_flag.names() and "sageattention" in by_flag.names()
    (tmp_path / "imagegen.toml").write_text(f'recipe-dirs = ["{FIXTURES / "routed_kernels"}"]\n')
    args = parse("plan")
    assert "routed-kernels" in common.catalogue(args, common.config(args)).names()
    with pytest.raises(RecipeError, match="does not exist"):
        common.catalogue(parse("plan", "--recipe-dir", tmp_path / "missing"), Config())


# ------------------------------------------------------------------------------------------ lock


def test_lock_defaults_to_imagegen_lock_here_and_reads_it(tmp_path):
    assert common.lock(parse("plan")).path.name == "imagegen.lock"
    (tmp_path / "imagegen.lock").write_text('{"schema": 1, "base_images": {"a/b:1": "a/b:1@sha256:' + "0" * 64 + '"}}')
    assert common.lock(parse("plan")).base_images == {"a/b:1": "a/b:1@sha256:" + "0" * 64}


def test_a_named_lock_file_must_exist_except_for_the_commands_that_write_it(tmp_path):
    missing = tmp_path / "pins.lock"
    with pytest.raises(UsageError, match="no such file \\(imagegen lock writes it\\)"):
        common.lock(parse("plan", "--lock", missing))
    with pytest.raises(UsageError, match="give the lock file's path"):
        common.lock(parse("plan", "--lock", " "))
    for command in ("lock", "push"):  # they write it: an empty lock to fill
        lock = common.lock(parse(command, "sage", "--lock", missing))
        assert lock.path == missing and lock.base_images == {} and lock.builder_images == {}
    (tmp_path / "garbage.lock").write_text("[1, 2]")
    with pytest.raises(LockFileError):
        common.lock(parse("plan", "--lock", tmp_path / "garbage.lock"))


# ----------------------------------------------------------------------------------- matrix, plan


# ---------------------------------------------------------------------------------------- registry


def test_registry_comes_from_the_flag_or_the_config_and_is_checked():
    def registry(config: Config, *argv: str) -> str:  # push's registry, from its options resolved once
        return common.registry(common.resolved(parse("push", "sage", *argv), config))

    with pytest.raises(UsageError, match="no registry: pass --registry"):
        registry(Config())
    assert registry(Config(registry="127.0.0.1:5000/ml")) == "127.0.0.1:5000/ml"
    assert registry(Config(registry="a:1/b"), "--registry", "ghcr.io/me") == "ghcr.io/me"
    with pytest.raises(RegistryError, match="is not HOST\\[:PORT\\]/NAMESPACE"):
        registry(Config(), "--registry", "Upper/Case")
    with pytest.raises(RegistryError):
        registry(Config(), "--registry", "no-namespace")


# ---------------------------------------------------------------------- builders, caches, CA bundle


def test_validate_builders_takes_one_name_or_several():
    assert common.validate_builders(None) is None and common.validate_builders([]) is None
    common.validate_builders("node-1.lab+gpu_2")
    common.validate_builders(["a", "b"])
    for bad in ("-flag", "two words", "x" * 101, "semi;colon", ""):
        with pytest.raises(UsageError, match="not a buildx builder name"):
            common.validate_builders(["ok", bad])


def test_validate_cache_specs_takes_buildx_forms_and_refuses_others():
    good = ["type=registry,ref=ghcr.io/me/cache:tag,mode=max", "type=inline", "type=gha", "ghcr.io/me/cache:1",
            "127.0.0.1:5000/ml/cache@sha256:abc"]
    assert common.validate_cache_specs(good) == good and common.validate_cache_specs(()) == []
    for bad in ("type=local,src=/a b", "type=registry,ref=x\ny", "TYPE=inline", "just-a-word", "type=x,ref=$(id)"):
        with pytest.raises(UsageError, match="expected buildx's key=value"):
            common.validate_cache_specs(["type=inline", bad])


def test_ca_bundle_must_be_a_file(tmp_path):
    assert common.ca_bundle(None) is None
    pem = tmp_path / "ca.pem"
    pem.write_text("-----BEGIN CERTIFICATE-----\n")
    assert common.ca_bundle(str(pem)) == str(pem)
    for bad in (str(tmp_path / "missing.pem"), str(tmp_path), "x" * 5000):
        with pytest.raises(UsageError, match="--ca-bundle .*: no such file"):
            common.ca_bundle(bad)


# ----------------------------------------------------------------------------------- command line


def test_command_line_is_one_line_that_a_shell_reads_back_as_the_argv():
    line = common.command_line(["render", "sage", "a b", "it's", "x\ny", "\x1b[2J", "é"])
    assert "\n" not in line and "\x1b" not in line
    assert line == "imagegen render sage 'a b' 'it'\"'\"'s' $'x\\ny' $'\\x1b[2J' 'é'"
    assert common.quote_arg("a'\tb\\") == "$'a\\'\\tb\\\\'"
    assert common.command_line([]) == "imagegen "


# ------------------------------------------------------------------------------------- validate_exe


def test_validate_exe_accepts_an_executable_file_or_a_name_on_path(tmp_path, monkeypatch):
    assert common.validate_exe(None, "--python-exe") is None
    exe = tmp_path / "bin" / "mypython"
    exe.parent.mkdir()
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    assert common.validate_exe(str(exe), "--python-exe") == str(exe)
    monkeypatch.setenv("PATH", str(exe.parent))
    assert common.validate_exe("mypython", "--python-exe") == "mypython"


def test_validate_exe_says_why_an_interpreter_is_unusable(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    plain = tmp_path / "plain"
    plain.write_text("#!/bin/sh\n")
    plain.chmod(0o644)
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    cases = [("", "not a usable interpreter path"), ("a\nb", "not a usable interpreter path"),
             ("p" * 4097, "not a usable interpreter path"), ("nosuch-python", "no such interpreter on PATH"),
             (str(tmp_path / "gone"), "no such file"), (str(tmp_path), "not a file"),
             (str(plain), "not executable"), (str(loop), "a symlink loop")]
    for value, why in cases:
        with pytest.raises(UsageError, match="^--exe-flag .*: " + why) as info:
            common.validate_exe(value, "--exe-flag")
        assert "\n" not in str(info.value) and len(str(info.value)) < 200


# ---------------------------------------------------------------------------------------- native


def test_native_cell_is_the_hosts_build_of_one_recipe(tmp_path, cat):
    py = fake_host(tmp_path)
    cell, host = native_cell(parse("build", "--native", "sage", "--torch", "2.8", "--cuda", "cu128",
                                   "--python", "3.12", "--arch", "9.0", "--python-exe", py), cat)
    assert (cell.name, str(cell.archs), cell.status) == ("sage-2_2_0-torch2_8-cu128-py312", "9.0", BUILDABLE)
    assert cell.base.ref == "native" and host.python_exe == py and str(host.nvcc) == "12.8"
    cell, host = native_cell(parse("build", "--native", "--source", TINY, "--python-exe", py), cat)
    # No --arch: the host's GPUs, else the default list.
    assert str(cell.archs) == (";".join(host.ccs) or str(defaults()["arch"]))


@pytest.mark.parametrize("argv, says", [
    (["sage", "fa2"], "--native builds one recipe"),
    ([], "--native builds one recipe"),
    (["sage", "--source", str(TINY)], "is the project tiny-kernel, not sageattention: give the tree alone"),
    (["sage", "--source", str(TINY), "--source", str(TINY)], "--native builds one recipe"),
    (["sage", "--arch", "8.0", "--arch", "9.0"], "--native takes one --arch list"),
    (["sage", "--torch", "2.9"], "--torch 2.9 asked, but this host has 2.8.0"),
    (["sage", "--cuda", "13.0"], "--cuda 13.0 asked, but this host has 12.8"),
    (["sage", "--python", "3.11"], "--python 3.11 asked, but this host has 3.12"),
])
def test_native_cell_refuses_what_the_host_cannot_be(tmp_path, cat, argv, says):
    py = fake_host(tmp_path)
    with pytest.raises(UsageError, match=says.replace("+", "\\+")):
        native_cell(parse("build", "--native", *argv, "--python-exe", py), cat)


def test_native_cell_preflight_says_what_to_install(tmp_path, cat):
    no_torch = fake_host(tmp_path / "a", torch=None, torch_cuda=None)
    with pytest.raises(CompatError, match="torch is not importable"):
        native_cell(parse("build", "--native", "sage", "--python-exe", no_torch), cat)
    old_nvcc = fake_host(tmp_path / "b", nvcc="12.4")
    with pytest.raises(CompatError, match="sm_120 needs CUDA >= 12.8"):
        native_cell(parse("build", "--native", "sage", "--arch", "12.0", "--python-exe", old_nvcc), cat)
    assert not os.path.exists(tmp_path / ".imagegen")  # nothing prepared for a cell that cannot build


def test_a_native_build_with_no_gpu_and_no_arch_says_which_list_it_builds(tmp_path, cat, monkeypatch, capsys):
    from imagegen import engine
    py = fake_host(tmp_path)
    monkeypatch.setattr(engine, "gpus", lambda: ())  # a GPU-less runtime (Colab's CPU one)
    cell, _ = native_cell(parse("build", "--native", "--source", TINY, "--python-exe", py), cat)
    err = capsys.readouterr().err.strip().splitlines()
    assert str(cell.archs) == str(defaults()["arch"])
    assert len(err) == 1 and "no GPU seen" in err[0] and str(cell.archs) in err[0] and "--arch" in err[0]
    # --arch given, or a GPU seen: nothing to say.
    native_cell(parse("build", "--native", "--source", TINY, "--arch", "7.5", "--python-exe", py), cat)
    assert "no GPU" not in capsys.readouterr().err
    monkeypatch.setattr(engine, "gpus", lambda: ("Tesla T4 (7.5)",))
    cell, _ = native_cell(parse("build", "--native", "--source", TINY, "--python-exe", py), cat)
    assert str(cell.archs) == "7.5" and "no GPU" not in capsys.readouterr().err


def test_a_relative_interpreter_path_is_made_absolute_and_a_venv_link_is_kept(tmp_path, monkeypatch):
    # `plan --audit --native --python-exe .venv/bin/python` ran the audit from its work folder, where the
    # relative path led nowhere (FileNotFoundError); the link a venv's python is must stay the venv's.
    real = tmp_path / "python3.12"
    real.write_text("#!/bin/sh\n")
    real.chmod(0o755)
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "python").symlink_to(real)
    monkeypatch.chdir(tmp_path)
    assert common.validate_exe("venv/bin/python", "--python-exe") == str(tmp_path / "venv" / "bin" / "python")
    assert common.validate_exe(str(real), "--python-exe") == str(real)
