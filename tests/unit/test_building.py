"""Tests for imagegen.commands.building: `imagegen build` up to the engine, container and native.

The flags a container build refuses, the checks made before buildx runs (builders, jobs, CA bundle, cache
specs, one target per cell, nothing to do), and the native path with a stand-in host Python: --print-env
and the refusal to replace a wheel built for other archs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from imagegen.commands import building
from imagegen.errors import NothingToDoError, RecipeError, RefusedError, UsageError
from imagegen.executors import buildx, native
from imagegen.model.catalogue import load_catalogue
from tests.unit.command_helpers import CELL, TINY, call, fake_host, native_cell, never, parse


@pytest.fixture(autouse=True)
def _no_engine(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(buildx, "build", never("buildx bake"))
    monkeypatch.setattr(native, "build_native", never("the native compile"))


def build(*argv) -> int:
    return call(building.cmd_build, "build", *argv)


# ------------------------------------------------------------------------------- container build


@pytest.mark.parametrize("flag", [["--print-env"], ["--verbose-build"], ["--flat"], ["--src-dir", "src"],
                                  ["--python-exe", "python3"]])
def test_a_container_build_refuses_the_native_only_flags(flag):
    with pytest.raises(UsageError, match=f"^{flag[0]} goes with --native"):
        build("sage", *CELL, *flag)


@pytest.mark.parametrize("argv, says", [
    (["--builder", "good", "--builder", "bad name"], "--builder 'bad name': not a buildx builder name"),
    (["--max-jobs", "0"], "--max-jobs must be between 1 and 1024"),
    (["--max-jobs", "1025"], "--max-jobs must be between 1 and 1024"),
    (["--nvcc-threads", "-1"], "--nvcc-threads must be between 1 and 1024"),
    (["--ca-bundle", "missing.pem"], "--ca-bundle missing.pem: no such file"),
    (["--cache-from", "type=local,src=a b"], "cache spec 'type=local,src=a b'"),
    (["--cache-to", "not a spec"], "cache spec 'not a spec'"),
])
def test_a_container_build_checks_its_values_before_buildx_runs(argv, says):
    with pytest.raises(UsageError) as info:
        build("sage", *CELL, *argv)
    assert str(info.value).startswith(says) and "\n" not in str(info.value)


def test_bad_job_limits_are_refused_before_planning_and_then_the_plan_speaks(capsys):
    with pytest.raises(UsageError, match="--max-jobs must be between 1 and 1024"):
        build("sage", *CELL[:6], "--arch", "7.0", "--max-jobs", "0")
    # With good flags, nothing buildable is said, with each rejected cell's reason.
    with pytest.raises(NothingToDoError, match="no cell of this matrix can build"):
        build("sage", *CELL[:6], "--arch", "7.0", "--max-jobs", "2")
    err = capsys.readouterr().err
    assert err == ("[sage-2_2_0-torch2_8-cu128-py312] rejected: sageattention 2.2.0 does not support sm_70"
                   " (it supports 8.0, 8.6, 8.9, 9.0, 12.0)\n")


def test_a_container_build_makes_one_target_per_cell():
    with pytest.raises(UsageError, match="asked for two arch lists \\(8.0 and 9.0\\)"):
        build("sage", *CELL[:6], "--arch", "8.0", "--arch", "9.0")


def test_a_variable_imagegen_sets_is_refused_before_anything_runs():
    with pytest.raises(RecipeError, match="--env MAX_JOBS: imagegen sets MAX_JOBS .*use --max-jobs"):
        build("sage", *CELL, "--env", "MAX_JOBS=3")


# ---------------------------------------------------------------------------------- native build


def test_print_env_of_a_native_build_shows_the_variables_and_builds_nothing(tmp_path, capsys):
    py = fake_host(tmp_path)
    work = tmp_path / "work"
    assert build("--native", "--source", TINY, "--arch", "8.0;9.0", "--python-exe", py, "--print-env",
                 "--no-audit", "--max-jobs", "3", "--nvcc-threads", "2", "--work", work) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    env = json.loads(out)
    assert env["TORCH_CUDA_ARCH_LIST"] == "8.0;9.0" and env["MAX_JOBS"] == "3" and env["NVCC_THREADS"] == "2"
    assert env["CUDA_HOME"] == str(tmp_path / "host-cuda")
    # The cell file and the in-build script are prepared; no wheelhouse, no wheel.
    cell = json.loads((work / "cell.json").read_text())
    assert cell["src_dir"] == str(TINY) and cell["base_python"] == py and (work / "imagegen_build.py").is_file()
    assert not (tmp_path / "wheelhouse").exists() and not list(tmp_path.rglob("*.whl"))


def test_print_env_gives_the_recipes_own_arch_knob_and_the_src_dir(tmp_path, capsys):
    py = fake_host(tmp_path)
    assert build("--native", "fa2", "--arch", "9.0", "--python-exe", py, "--print-env", "--no-audit",
                 "--src-dir", tmp_path / "flash-attention", "--work", tmp_path / "w") == 0
    env = json.loads(capsys.readouterr().out)
    assert env["FLASH_ATTN_CUDA_ARCHS"] == "90" and env["TORCH_CUDA_ARCH_LIST"] == "9.0"
    assert json.loads((tmp_path / "w" / "cell.json").read_text())["src_dir"] == str(tmp_path / "flash-attention")
    assert not (tmp_path / "flash-attention").exists()  # nothing fetched without the audit


def _earlier_wheel(tmp_path: Path, py: str, out: Path) -> Path:
    """A wheelhouse entry for sage's native cell, built for archs 8.0."""
    args = parse("build", "--native", "sage", "--arch", "9.0", "--python-exe", py)
    cell, _ = native_cell(args, load_catalogue())
    folder = out / cell.wheel_dir
    folder.mkdir(parents=True)
    wheel = folder / "sageattention-2.2.0+cu128torch2.8-cp312-cp312-linux_x86_64.whl"
    wheel.write_bytes(b"PK")
    (folder / "manifest.json").write_text(json.dumps({"schema": 1, "cells": {cell.name: {"wheel": wheel.name,
                                                                                          "archs": "8.0"}}}))
    return wheel


def test_a_native_build_refuses_to_replace_a_wheel_built_for_other_archs(tmp_path):
    py = fake_host(tmp_path)
    out = tmp_path / "wh"
    wheel = _earlier_wheel(tmp_path, py, out)
    with pytest.raises(RefusedError) as info:  # exit 10: a refusal, like a container build's
        build("--native", "sage", "--arch", "9.0", "--python-exe", py, "--out", out, "--no-audit")
    assert str(info.value) == (f"{wheel} (built for archs 8.0) would be replaced by the wheel for archs 9.0 (same file"
                               " name): build into another --out to keep both, or --force to replace it")
    assert wheel.read_bytes() == b"PK"


def test_force_and_flat_let_a_native_build_go_on_to_the_compile(tmp_path, monkeypatch, capsys):
    py = fake_host(tmp_path)
    out = tmp_path / "wh"
    _earlier_wheel(tmp_path, py, out)
    handed: list[dict] = []

    def compile_step(cell, host, **kw):  # where the real compile would start
        handed.append(kw)
        return kw["out"] / "new.whl"

    monkeypatch.setattr(native, "build_native", compile_step)
    assert build("--native", "sage", "--arch", "9.0", "--python-exe", py, "--out", out, "--force", "--no-audit") == 0
    captured = capsys.readouterr()
    assert "--force: the new wheel replaces" in captured.err and captured.out == f"{out / 'new.whl'}\n"
    # --flat puts the wheel straight into --out (the config's here): no wheelhouse layout to protect.
    (tmp_path / "imagegen.toml").write_text('out = "wh"\n')
    assert build("--native", "sage", "--arch", "9.0", "--python-exe", py, "--flat", "--verbose-build") == 0
    assert [(k["out"], k["flat"], k["audit"]) for k in handed] == [(out, False, False), (out, True, True)]
    assert handed[1]["verbose_build"] is True


def _wheel_of_these_inputs(tmp_path: Path, py: str, out: Path, work: Path) -> Path:
    """The wheelhouse entry an earlier native build of sage for 9.0 on the stand-in host would have
    left in ``out`` (collect.place: the wheel, its sha256 and the inputs hash the build computes)."""
    from imagegen.render.dockerfile import inputs_hash
    from imagegen.wheelhouse import collect
    from tests.unit.command_helpers import WHEEL

    args = parse("build", "--native", "sage", "--arch", "9.0", "--python-exe", py, "--work", work)
    cell, host = native_cell(args, load_catalogue())
    inputs = inputs_hash(cell, native._document(cell, host, work.resolve(), None))
    return collect.place(out, cell, WHEEL, inputs=inputs, record={})


def test_a_native_rerun_of_the_same_request_reuses_its_wheel_and_compiles_nothing(tmp_path, capsys):
    py = fake_host(tmp_path)
    out, work = tmp_path / "wh", tmp_path / "w"
    wheel = _wheel_of_these_inputs(tmp_path, py, out, work)
    before = wheel.stat()
    # build_native is `never` here: a compile would fail the test; no work folder is made.
    assert build("--native", "sage", "--arch", "9.0", "--python-exe", py, "--out", out, "--work", work) == 0
    captured = capsys.readouterr()
    assert captured.out == f"{wheel}\n"
    (line,) = captured.err.splitlines()
    assert line.startswith(f"up to date: {wheel}: built from the same inputs (") and line.endswith("(--force rebuilds it)")
    assert not work.exists() and wheel.stat().st_mtime_ns == before.st_mtime_ns


def test_a_native_rerun_builds_again_with_force_flat_or_a_changed_wheel(tmp_path, monkeypatch, capsys):
    py = fake_host(tmp_path)
    out, work = tmp_path / "wh", tmp_path / "w"
    wheel = _wheel_of_these_inputs(tmp_path, py, out, work)
    handed: list[dict] = []
    monkeypatch.setattr(native, "build_native", lambda cell, host, **kw: handed.append(kw) or kw["out"] / "new.whl")
    argv = ["--native", "sage", "--arch", "9.0", "--python-exe", py, "--work", work]
    assert build(*argv, "--out", out, "--force") == 0  # --force: built again, as a container build does
    assert build(*argv, "--out", out, "--flat") == 0  # --flat keeps no manifest to tell what a wheel was built from
    wheel.write_bytes(wheel.read_bytes()[:-1])  # truncated since its build: the sha256 differs
    assert build(*argv, "--out", out) == 0
    assert [(k["out"], k["flat"]) for k in handed] == [(out, False), (out, True), (out, False)]
    assert "up to date" not in capsys.readouterr().err


@pytest.mark.parametrize("flag, value", [("--max-jobs", "0"), ("--max-jobs", "5000"), ("--nvcc-threads", "0")])
def test_a_native_build_checks_the_job_limits_like_a_container_build(tmp_path, flag, value):
    py = fake_host(tmp_path)
    with pytest.raises(UsageError, match=f"{flag} must be between 1 and 1024"):
        build("--native", "sage", "--arch", "9.0", "--python-exe", py, "--print-env", "--no-audit", flag, value,
              "--work", tmp_path / "w")


# ------------------------------------------------------------------------------- the last mile


def _built_into(out: Path):
    """A stand-in for the bake executor that publishes the fixture wheel into ``out`` for each cell, as
    a build does (collect.place writes the wheel and its manifest entry)."""
    from imagegen.wheelhouse import collect
    from imagegen.model.cell import CellResult
    from tests.unit.executor_fixtures import WHEEL

    def fake_build(plan, **kw):
        return [CellResult(c, "built", wheel=collect.place(kw["out"], c, WHEEL, inputs="h", record={}))
                for c in plan.buildable]
    return fake_build


def test_build_index_brings_the_wheelhouses_pip_index_up_to_date(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(buildx, "build", _built_into(tmp_path / "wh"))
    assert build("sage", *CELL, "--out", tmp_path / "wh", "--index") == 0
    page = (tmp_path / "wh" / "simple" / "tiny-kernel" / "index.html").read_text()
    wheel = next((tmp_path / "wh").rglob("*.whl"))
    assert wheel.name.replace("+", "%2B") in page and "#sha256=" in page
    assert "index: 1 project(s), 1 wheel(s)" in capsys.readouterr().err


def test_build_repair_repairs_each_new_wheel_before_the_index_lists_it(tmp_path, monkeypatch, capsys):
    from imagegen.publish import repair

    monkeypatch.setattr(buildx, "build", _built_into(tmp_path / "wh"))
    calls: list[Path] = []

    class Repaired:
        def __init__(self, wheel: Path):
            self.wheel = wheel

        def lines(self):
            return [f"repaired {self.wheel.name}"]

    def fake_repair(wheel, **kw):  # the real one runs auditwheel: tests/unit/test_repair.py
        calls.append(wheel)
        return Repaired(wheel)

    monkeypatch.setattr(repair, "repair_in_wheelhouse", fake_repair)
    assert build("sage", *CELL, "--out", tmp_path / "wh", "--repair", "--index") == 0
    assert [w.name for w in calls] == [next((tmp_path / "wh").rglob("*.whl")).name]
    err = capsys.readouterr().err
    assert err.index("repaired ") < err.index("index: 1 project(s)")


def test_a_flat_native_build_has_no_wheelhouse_to_repair_or_index(tmp_path):
    py = fake_host(tmp_path)
    for flag in ("--repair", "--index"):
        with pytest.raises(UsageError, match="--repair and --index work on a wheelhouse: drop --flat"):
            build("--native", "sage", "--arch", "9.0", "--python-exe", py, "--flat", flag, "--no-audit")


def test_a_native_build_hands_the_compile_cache_to_the_compile_and_needs_ccache(tmp_path, monkeypatch):
    py = fake_host(tmp_path)
    handed: list[dict] = []
    monkeypatch.setattr(native, "build_native", lambda cell, host, **kw: handed.append(kw) or kw["out"] / "x.whl")
    url = "redis://s3cret@127.0.0.1:6379"
    monkeypatch.setattr(building.shutil, "which", lambda name: None)  # no ccache on this host
    with pytest.raises(UsageError) as info:
        build("--native", "sage", "--arch", "9.0", "--python-exe", py, "--no-audit", "--flat", "--compile-cache", url)
    assert str(info.value).startswith("--compile-cache needs ccache on PATH") and "s3cret" not in str(info.value)
    monkeypatch.setattr(building.shutil, "which", lambda name: "/usr/bin/ccache")
    with pytest.raises(UsageError, match=r"^--compile-cache redis://\*\*\*@127.0.0.1:6379/x y: a space, quote, '\|' or"
                                         r" other character ccache cannot take after the host; give redis://HOST:PORT"
                                         r"\[/DB\] \(a password before HOST, ending in '@'\) or http://HOST:PORT/PATH"):
        build("--native", "sage", "--arch", "9.0", "--python-exe", py, "--flat", "--compile-cache",
              "redis://s3cret@127.0.0.1:6379/x y")
    assert build("--native", "sage", "--arch", "9.0", "--python-exe", py, "--no-audit", "--flat",
                 "--out", tmp_path / "d", "--compile-cache", url) == 0
    assert handed[-1]["compile_cache"] == url


def test_the_options_are_resolved_once_per_build(monkeypatch, tmp_path):
    # Issue 33: flags > config > defaults is worked out once and handed down (the plan, the matrix and the
    # output folder), not again by each of them.
    from imagegen.plan import options

    calls: list[int] = []
    real = options.resolve
    monkeypatch.setattr(options, "resolve", lambda args, config: calls.append(1) or real(args, config))
    handed: list[dict] = []
    monkeypatch.setattr(buildx, "build", lambda plan, **kw: handed.append(kw) or [])
    assert build("sage", *CELL, "--out", tmp_path / "wh") == 0
    assert len(calls) == 1 and handed[0]["out"] == tmp_path / "wh"
