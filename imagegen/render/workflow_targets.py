"""The Linux matrix of ``imagegen ci github``'s workflow, as buildx reads the bake file (``docker buildx bake
--print``): one row per target with its local output folder(s), its runner's platform and, where its base
image has fallbacks (the bake file's ``<target>-fallback`` targets, imagegen.render.bake), the images to try
in order; and the wheelhouse the publish job merges the targets' outputs into."""

from __future__ import annotations

import csv
import posixpath
import re
from dataclasses import dataclass

from imagegen import safety
from imagegen.errors import NothingToDoError, UnsafeValueError, UsageError
from imagegen.plan.registry import IMAGE_NAME
from imagegen.render.bake import BUILDER_LABEL, CPU_HOURS_LABEL, WALL_HOURS_LABEL

MAX_MATRIX_JOBS = 256  # GitHub's limit for one matrix: more targets are several build jobs
# The most targets one workflow takes (four matrices: the largest prebuilt collections hold ~850 wheels);
# beyond it, one workflow per --group or --targets selection.
MAX_WORKFLOW_TARGETS = 4 * MAX_MATRIX_JOBS
# Bake target and group names (bake allows [A-Za-z0-9_-]); a target name is also the cache tag, so
# it must start like a tag and fit in one (128 characters).
BAKE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,127}")

# The wheelhouse layout below its top folder (imagegen.model.layout.DEFAULT_LAYOUT): the publish job's
# wheelhouse is the output folders' common folder above their last LAYOUT_DEPTH parts.
LAYOUT_DEPTH = 3
# A cell's inputs hash as imagegen.render.dockerfile.inputs_hash writes it (empty: not in the bake file).
INPUTS_HASH = re.compile(r"|[0-9a-f]{16,64}")
CPU_HOURS = re.compile(r"|[0-9]{1,5}(\.[0-9]{1,2})?")  # empty: no estimate for the target's recipe


def validate_text(value: object, pattern: re.Pattern[str], what: str, hint: str) -> str:
    if isinstance(value, str) and pattern.fullmatch(value):
        return value
    shown = repr(safety.redact(value) if isinstance(value, str) else value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    raise UnsafeValueError(f"{what} {shown} is not allowed: use {hint}")


@dataclass(frozen=True)
class WorkflowTarget:
    name: str
    wheels: str  # the local output folder(s) to upload, one per line
    arm64: bool = False  # `platforms = ["linux/arm64"]`: built on an arm64 runner (--arm64-runs-on), not under QEMU
    # Where its base image has fallbacks: "IMAGE TARGET" per line, the primary first, then each fallback
    # target (render/bake.py); the job bakes the first whose image can be pulled. Empty: no fallback.
    bases: str = ""
    # The cell's inputs hash (the bake target's label io.imagegen.inputs; empty in a bake file written before
    # it existed) and its wheelhouse folder (<pkg>-<ver>/torch<X.Y>/cu<XYZ>, the output folder's last
    # LAYOUT_DEPTH parts): where --skip-published looks for it.
    inputs: str = ""
    folder: str = ""
    # The estimated CPU-hours of its compile (the bake target's label io.imagegen.cpu-hours, from its
    # recipe's measured build: imagegen.model.build_cost); None where there is no measurement.
    cpu_hours: float | None = None
    wall_hours: float | None = None  # the least wall time of its compile (label io.imagegen.wall-hours)
    # Its builder image below a registry, imagegen-<recipe>:<tag> (label io.imagegen.builder; empty in a bake
    # file written before it existed): what --push-builders pushes its builder stage as.
    builder: str = ""


def fallback_targets(printed: dict) -> list[str]:
    """The fallback targets the printed targets name (label io.imagegen.fallbacks), to be printed too."""
    return [n for body in (printed.get("target") or {}).values()
            for n in str((body.get("labels") or {}).get("io.imagegen.fallbacks", "")).split(",") if n]


def _bases(name: str, body: dict, dests: list[str], fallbacks: dict) -> str:
    """``name``'s base images and the targets that build on each (WorkflowTarget.bases)."""
    labels = body.get("labels") or {}
    rows = [(labels.get("io.imagegen.base-image"), name)]
    for other in fallback_targets({"target": {name: body}}):
        got = fallbacks.get(other)
        if got is None:
            raise UsageError(f"bake target {name} names its fallback target {other}, which the bake file lacks:"
                             " write the file again with imagegen bake")
        if local_output_dests(got.get("output") or []) != dests:
            raise UsageError(f"bake target {other} (the fallback of {name}) writes to another folder than {name}")
        rows.append(((got.get("labels") or {}).get("io.imagegen.base-image"), other))
    for ref, target in rows:
        safety.validate(ref, safety.IMAGE_REF, f"base image of bake target {target}")
        validate_text(target, BAKE_NAME, "bake target name", "bake target names of letters, digits, '_' and '-'")
    return "\n".join(f"{ref} {target}" for ref, target in rows)


def targets_from_print(printed: dict, fallbacks: dict | None = None) -> list[WorkflowTarget]:
    """The targets of a ``docker buildx bake --print`` result, each with its local output folder and, where
    its base image has fallbacks, the base images to try (``fallbacks``: the print of its fallback targets)."""
    bodies = printed.get("target") or {}
    if not bodies:
        raise NothingToDoError("the bake file has no target to build for this selection")
    if len(bodies) > MAX_WORKFLOW_TARGETS:
        jobs = MAX_WORKFLOW_TARGETS // MAX_MATRIX_JOBS
        raise UsageError(f"{len(bodies)} targets: one workflow takes at most {MAX_WORKFLOW_TARGETS} ({jobs} build jobs"
                         f" of {MAX_MATRIX_JOBS}, GitHub's limit for one matrix); write one"
                         " workflow per --group or --targets selection (each with its own --output)")
    targets = []
    for name, body in bodies.items():
        validate_text(name, BAKE_NAME, "bake target name", "bake target names of letters, digits, '_' and '-'")
        dests = [safety.validate(d, safety.LOCAL_PATH, f"output folder of bake target {name}")
                 for d in local_output_dests(body.get("output") or [])]
        if not dests:
            raise UsageError(f"bake target {name} has no type=local output: the workflow uploads each target's local"
                             " output folder as an artifact (imagegen bake gives every target one)")
        platforms = sorted(str(p) for p in (body.get("platforms") or []))
        if platforms not in ([], ["linux/amd64"], ["linux/arm64"]):
            raise UsageError(f"bake target {name} builds for {', '.join(platforms)}: the workflow gives each target one"
                             " runner of its platform; make one target per platform (imagegen bake --platform does)")
        bases = _bases(name, body, dests, (fallbacks or {}).get("target") or {}) if fallback_targets(
            {"target": {name: body}}) else ""
        inputs = str((body.get("labels") or {}).get("io.imagegen.inputs", ""))
        validate_text(inputs, INPUTS_HASH, f"inputs hash of bake target {name}", "hex digits (imagegen bake writes it)")
        hours = str((body.get("labels") or {}).get(CPU_HOURS_LABEL, ""))
        validate_text(hours, CPU_HOURS, f"CPU-hours of bake target {name}",
                      "a number of hours (imagegen bake writes it)")
        wall = str((body.get("labels") or {}).get(WALL_HOURS_LABEL, ""))
        validate_text(wall, CPU_HOURS, f"wall hours of bake target {name}",
                      "a number of hours (imagegen bake writes it)")
        builder = str((body.get("labels") or {}).get(BUILDER_LABEL, ""))
        if builder:
            validate_text(builder, IMAGE_NAME, f"builder image of bake target {name}",
                          "imagegen-<recipe>:<tag> (imagegen bake writes it)")
        targets.append(WorkflowTarget(name=name, wheels="\n".join(dests), arm64=platforms == ["linux/arm64"],
                                      builder=builder,
                                      bases=bases, inputs=inputs, cpu_hours=float(hours) if hours else None,
                                      wall_hours=float(wall) if wall else None,
                                      folder="/".join(posixpath.normpath(dests[0]).split("/")[-LAYOUT_DEPTH:])))
    return targets


def local_output_dests(outputs: list) -> list[str]:
    """``dest`` of every local output, in either form buildx prints: CSV strings (0.13) or objects (newer)."""
    dests = []
    for entry in outputs:
        if isinstance(entry, dict):
            attrs = {str(k): str(v) for k, v in entry.items()}
        else:
            fields = next(csv.reader([str(entry)]), [])
            if len(fields) == 1 and "=" not in fields[0]:
                attrs = {"type": "local", "dest": fields[0]}  # `--output DIR` shorthand
            else:
                attrs = dict(f.split("=", 1) if "=" in f else (f, "") for f in fields)
        if attrs.get("type", "local") == "local" and attrs.get("dest") and attrs["dest"] != "-":
            dests.append(attrs["dest"])
    return dests


def wheelhouse_of(targets: list[WorkflowTarget]) -> tuple[str, dict[str, list[str]]]:
    """For the publish job: the wheelhouse's top folder (relative to the checkout, "." for the checkout
    itself) and each target's output folders relative to it.

    The top folder is the common folder of the output folders above their last LAYOUT_DEPTH parts
    (``<pkg>-<ver>/torch<X.Y>/cu<XYZ>``): a build job uploads its folders below it, so that the
    publish job's one merged download lays every target's out as the wheelhouse does. An output
    folder outside the checkout, or below the top folder with a name upload-artifact leaves out (one
    starting with '.'), is refused."""
    dests = {t.name: [posixpath.normpath(raw) for raw in t.wheels.split("\n")] for t in targets}
    for name, folders in dests.items():
        for dest in folders:
            if dest.startswith("/") or dest == "." or ".." in dest.split("/"):
                raise UsageError(f"--publish: the output folder {dest} of bake target {name} is outside the checkout:"
                                 " the publish job gathers every target's output from the build jobs' checkouts")
    common: list[str] = []
    for column in zip(*(d.split("/")[:-LAYOUT_DEPTH] for folders in dests.values() for d in folders)):
        if len(set(column)) != 1:
            break
        common.append(column[0])
    below = {name: ["/".join(d.split("/")[len(common):]) for d in folders] for name, folders in dests.items()}
    for name, folders in below.items():
        for rel in folders:
            if any(part.startswith(".") for part in rel.split("/")):
                raise UsageError(f"--publish: the output folder {rel} of bake target {name} has a name starting with"
                                 " '.', which upload-artifact leaves out")
    return "/".join(common) or ".", below
