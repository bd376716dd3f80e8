"""Tests for imagegen.render.workflow_targets: the Linux matrix of `imagegen ci github` read from what `docker
buildx bake --print` prints, a target's base-image fallbacks (the bake file's <target>-fallback targets,
issue 34) among them. The rest of the matrix's reading is tested with the workflow in test_workflow.py."""

from __future__ import annotations

import pytest

from imagegen.errors import UnsafeValueError, UsageError
from imagegen.render.workflow_targets import fallback_targets, targets_from_print, validate_text, BAKE_NAME

PRIMARY = {"output": ["type=local,dest=wh/fa/torch2.8/cu128"],
           "labels": {"io.imagegen.cell": "t", "io.imagegen.base-image": "pytorch/b:cuda12.8",
                      "io.imagegen.fallbacks": "t-fallback"}}
FALLBACK = {"output": ["type=local,dest=wh/fa/torch2.8/cu128"],
            "labels": {"io.imagegen.cell": "t", "io.imagegen.base-image": "sameli/m:12.8"}}


def test_a_targets_fallbacks_are_its_base_images_in_order():
    printed = {"target": {"t": PRIMARY, "u": {"output": ["type=local,dest=wh/u/torch2.8/cu128"]}}}
    assert fallback_targets(printed) == ["t-fallback"]
    t, u = targets_from_print(printed, {"target": {"t-fallback": FALLBACK}})
    assert t.bases == "pytorch/b:cuda12.8 t\nsameli/m:12.8 t-fallback" and u.bases == ""


@pytest.mark.parametrize("fallbacks, says", [
    ({}, "names its fallback target t-fallback, which the bake file lacks"),
    ({"t-fallback": {**FALLBACK, "output": ["type=local,dest=elsewhere"]}}, "writes to another folder than t"),
])
def test_a_fallback_the_bake_file_does_not_hold_as_its_target_is_refused(fallbacks, says):
    with pytest.raises(UsageError, match=says):
        targets_from_print({"target": {"t": PRIMARY}}, {"target": fallbacks})


def test_a_base_image_that_is_no_image_reference_is_refused():
    bad = {**FALLBACK, "labels": {"io.imagegen.base-image": "sameli/m:12.8\n  run: id"}}
    with pytest.raises(Exception, match="base image of bake target t-fallback"):
        targets_from_print({"target": {"t": PRIMARY}}, {"target": {"t-fallback": bad}})
    with pytest.raises(UnsafeValueError):
        validate_text("t$(id)", BAKE_NAME, "bake target name", "letters")
