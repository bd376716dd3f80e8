"""Tests for imagegen.model.build_cost: a cell's compile CPU-hours from its recipe's measured build."""

from __future__ import annotations

import dataclasses

from imagegen.model.build_cost import cell_cost, hosted_hours, sizing_lines
from imagegen.model.catalogue import load_catalogue
from imagegen.model.recipes import CpuHours


def test_the_estimate_scales_the_measured_build_by_gencode_outputs():
    fa2 = load_catalogue().recipes["flash-attn"]
    assert fa2.cpu_hours is not None and fa2.cpu_hours.gencode_targets == 1
    one, three = cell_cost(fa2, 1), cell_cost(fa2, 3)
    assert one is not None and three is not None
    assert one.cpu_hours == fa2.cpu_hours.hours and three.cpu_hours == round(3 * fa2.cpu_hours.hours, 2)
    assert three.describe().startswith(f"~{three.cpu_hours:.2f} CPU-h (scaled from {fa2.cpu_hours.hours:g} CPU-h measured: ")
    xformers = dataclasses.replace(fa2, cpu_hours=CpuHours(0.17, 4, "four outputs"))
    assert cell_cost(xformers, 2).cpu_hours == 0.09 and cell_cost(xformers, 8).cpu_hours == 0.34


def test_no_measurement_no_estimate():
    natten = load_catalogue().recipes["natten"]  # its measured build was a reduced one (1-D only): not a basis
    assert natten.cpu_hours is None and cell_cost(natten, 2) is None
    fa2 = load_catalogue().recipes["flash-attn"]
    assert cell_cost(fa2, 0) is None


def test_hosted_hours_are_cpu_hours_over_the_runners_cpus():
    assert hosted_hours(13.89) == 13.89 / 4 and hosted_hours(8, cpus=16) == 0.5 and hosted_hours(1, 4, None) == 0.25


def test_sizing_lines_group_the_jobs_by_estimate_and_name_those_that_outlast_a_budget():
    jobs = [("fa2-a", 13.89, 0.35), ("fa2-b", 13.89, 0.35), ("sage-a", 0.41, 0.08), ("ccd-a", 0.14, 0.12),
            ("natten-a", None, None)]
    lines = sizing_lines(jobs, budget_s=270 * 60)
    assert lines[0].startswith("imagegen: estimated compile CPU-hours per job")
    assert lines[1] == "     13.89 CPU-h (~3.5 h)  x   2 jobs  e.g. fa2-a"
    assert lines[2] == "      0.41 CPU-h (~0.1 h)  x   1 job   e.g. sage-a"
    # 0.14 CPU-h is 2 minutes over 4 cores, but one file's compile took 0.12 h on 16: at least that
    assert lines[3] == "      0.14 CPU-h (~0.1 h)  x   1 job   e.g. ccd-a"
    assert lines[4] == "  total 28.3 CPU-h over 4 of 5 jobs; 1 without an estimate (no measured build of their recipe)"
    assert len(lines) == 5  # 3.5 h fits the 270-minute budget
    tight = sizing_lines(jobs, budget_s=60 * 60)
    assert tight[-1].startswith("  2 jobs outlast a job's 60-minute compile budget on 4 vCPUs") and "(up to 4 runs)" in tight[-1]
    assert sizing_lines(jobs, budget_s=None)[-1].startswith("  total")  # no budget (a short --timeout): nothing said
    assert sizing_lines([("x", None, None)], 3600) == ["imagegen: no CPU-hours estimate for these 1 jobs: their recipes"
                                                       " have no measured build (build.cpu_hours)"]
    assert sizing_lines([], 3600) == []
    many = sizing_lines([(f"j{i}", float(i + 1), None) for i in range(15)], None)
    assert many[-2] == "  ... 3 lighter jobs" and len(many) == 1 + 12 + 1 + 1


def test_the_wall_time_on_a_runner_is_never_under_the_measured_builds_own():
    assert hosted_hours(0.14, 4, 0.12) == 0.12 and hosted_hours(13.89, 4, 0.35) == 13.89 / 4
    ccd = load_catalogue().recipes["causal-conv1d"]
    cost = cell_cost(ccd, 3)
    assert cost is not None and cost.wall_hours == ccd.cpu_hours.wall_hours == 0.12  # not scaled by outputs
