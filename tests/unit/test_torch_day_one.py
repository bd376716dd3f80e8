"""scripts/torch_day_one.py, the release-to-wheels runbook: its plan step and summary on the real CLI
(the audit and build steps need an engine and hours; their runs are recorded in benchmarks/RESULTS.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "torch_day_one.py"


def day_one(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "IMAGEGEN_COMPAT_DIR": str(tmp_path / "compat")}
    return subprocess.run([sys.executable, str(SCRIPT), *argv], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)


def test_the_plan_step_is_recorded_and_every_planned_recipe_gets_a_row_with_its_estimates(tmp_path):
    proc = day_one(tmp_path, "2.11.0", "--recipes", "causal-conv1d,sageattention", "--steps", "plan",
                   "--record", "r.jsonl", "--", "--python", "3.12", "--flavor", "cuda")
    assert proc.returncode == 0, proc.stderr
    (row,) = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert row["step"] == "plan" and row["exit"] == 0 and row["torch"] == "2.11.0"
    assert row["argv"][3:] == ["plan", "causal-conv1d", "sageattention", "--torch", "2.11.0", "--arch", "9.0",
                               "--python", "3.12", "--flavor", "cuda", "--json"]
    assert {"wall_s", "cpu_s", "machine_cpu_s"} <= set(row)
    table = [line for line in proc.stdout.splitlines() if line.startswith("| ")]
    assert [line.split(" | ")[0] for line in table[1:]] == ["| causal-conv1d", "| sageattention"]
    for line in table[1:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[-1] == "plan ok" and float(cells[5]) > 0 and float(cells[6]) >= float(cells[5])
    assert "a farm with a runner per cell takes about its longest build" in proc.stdout


def test_a_recipe_the_plan_rejects_is_named_with_its_reason_and_the_run_fails(tmp_path):
    # torch 2.15 needs Python >= 3.11: the one cell is rejected, so nothing reaches the last step
    proc = day_one(tmp_path, "2.15.0", "--recipes", "causal-conv1d", "--steps", "plan", "--record", "r.jsonl",
                   "--", "--python", "3.10", "--flavor", "cuda")
    assert proc.returncode == 1
    (row,) = [line for line in proc.stdout.splitlines() if line.startswith("| causal-conv1d")]
    assert "failed at plan: torch 2.15 supports Python 3.11-3.15; Python 3.10 selected" in row


def test_bad_arguments_are_refused_before_anything_runs(tmp_path):
    for argv, says in ((["2.15.0", "--steps", "plan,deploy"], "unknown step(s) deploy"),
                       (["2.15.0", "--native", "--recipes", "sage"], "--native needs --python-exe"),
                       (["2.15.0", "--with", "sage"], "--with takes RECIPE=ARGS")):
        proc = day_one(tmp_path, *argv)
        assert proc.returncode == 2 and says in proc.stderr, proc.stderr
        assert not (tmp_path / "runbook.jsonl").exists()
