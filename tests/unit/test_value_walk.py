"""Tests for benchmarks/value_walk.py and, through it, for how --arch travels: the user's arch list goes
from the request through plan to render without going back to an earlier step of the flow (issue 33's
walk, measured here on the commands that need no build; `imagegen build`'s own walks are in
benchmarks/RESULTS.md)."""

from __future__ import annotations

import pytest

from benchmarks.value_walk import Walk, flow_step, follow


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no project config of the checkout


def test_render_takes_the_arch_list_down_the_flow_without_a_climb(capsys):
    trip = follow(["render", "sage", "--arch", "12.0+PTX"])
    assert trip.exit == 0 and "TORCH_CUDA_ARCH_LIST" in capsys.readouterr().out
    files = trip.files
    # it was followed all the way: parsed, planned, mapped, rendered
    assert {"plan/options.py", "plan/request.py", "model/arch_parse.py", "plan/matrix.py", "model/cell_rules.py",
            "render/dockerfile.py"} <= set(files)
    assert trip.climbs == [] and len(files) <= 13
    # cli, cli_spec, the command, its flags, options, request, matrix, the Dockerfile: one file a step's part
    assert len(trip.flow_files) <= 8 and set(trip.flow_files) <= set(files)
    # and the model's rules: the list's parse and data, what each arch compiles, and the cell's smoke imports
    # (model/cell.py: a cell imports only the extensions its list builds)
    assert set(files) - set(trip.flow_files) == {"model/arch_data.py", "model/arch_parse.py", "model/arch_rules.py",
                                                  "model/cell.py", "model/cell_rules.py"}


def test_plan_goes_back_to_the_command_only_to_print_the_plan(capsys):
    trip = follow(["plan", "sage", "--arch", "8.0;9.0"])
    assert trip.exit == 0 and "8.0;9.0" in capsys.readouterr().out
    assert trip.climbs == [("plan/request.py", "commands/planning.py")]
    assert trip.stays[-1][0] == "commands/planning.py" and len(trip.files) <= 12


def test_a_text_is_the_value_only_by_identity_and_a_handlers_results_carry_it():
    text = "8.0;9.0"
    walk = Walk(text)
    assert walk.carries(text) and walk.carries((1, [text])) and walk.carries({"TORCH_CUDA_ARCH_LIST": text})
    assert not walk.carries("".join(["8.0;", "9.0"]))  # a recipe's own equal text is not the user's
    derived = "".join(["sm_", "80"])
    walk.take(derived)
    walk.take("".join(["no", "arch"]))
    assert walk.carries(derived) and len(walk.objects) == 2


@pytest.mark.parametrize("path, step", [("cli.py", 0), ("commands/building.py", 0), ("plan/matrix.py", 1),
                                        ("render/dockerfile.py", 2), ("executors/native.py", 3), ("finish/verify.py", 4),
                                        ("wheelhouse/collect.py", 5), ("publish/index.py", 6), ("model/arch.py", None),
                                        ("safety.py", None), ("shipped/builder/imagegen_rules.py", None)])
def test_the_flow_steps(path, step):
    assert flow_step(path) == step
