"""Tests for imagegen.model.build_cost: a cell's compile CPU-hours from its recipe's measured build."""

from __future__ import annotations

import dataclasses

from imagegen.model.build_cost import cell_cost, hosted_hours
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
    assert hosted_hours(13.89) == 13.89 / 4 and hosted_hours(8, cpus=16) == 0.5
