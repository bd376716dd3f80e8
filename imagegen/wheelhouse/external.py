"""Wheels imagegen did not build, taken into a wheelhouse by `imagegen collect WHEEL... --external --arch
LIST --out WHEELHOUSE`: an RTX 5090 user's SageAttention wheel built by hand on another machine, a
colleague's flash-attn wheel. There is no build record to check such a wheel against, so what can be
checked is checked and said: its file name and tags parse, every CUDA extension in it carries the SASS/PTX
the archs asked for need (imagegen.finish.verify, seen through the recipe of its distribution when the
catalogue has one), and its sha256 is recorded. Its manifest entry says ``external: true`` and lists what
was checked (``checked``) and what was not (no smoke test, no build inputs), so `imagegen index` and
`imagegen publish` take it and say it is external wherever they list wheels.

The wheel is copied into the wheelhouse folder (left where it is when it is there already) under its own
name; a different file of that name there is refused, never replaced (collect.place_external)."""

from __future__ import annotations

import re
import time
from pathlib import Path

from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from imagegen.errors import UsageError, VerifyError
from imagegen.model.arch import ArchList
from imagegen.outputs import shown

# What the manifest entry of an external wheel says was checked, and what could not be.
CHECKED = ("file name and tags", "SASS/PTX of every CUDA extension", "sha256 recorded")
NOT_CHECKED = ("smoke test (import)", "build inputs (no build record)")
NOTE = "built outside imagegen; verified and recorded by `imagegen collect --external`"


def cell_key(wheel: Path) -> str:
    """The manifest key of an external wheel: one per file name (what a wheelhouse folder holds once)."""
    return "external-" + re.sub(r"[^A-Za-z0-9_-]", "_", wheel.name[: -len(".whl")])[:190]


def refuse_unless_wheel(wheel: Path) -> None:
    """A path `collect --external` can verify: an existing file with a wheel's name; else one line, exit 2."""
    try:
        is_file = wheel.is_file()
    except OSError as exc:
        raise UsageError(f"{shown(wheel)}: {exc.strerror or 'not a usable path'}") from None
    if not is_file:
        raise UsageError(f"{shown(wheel)}: no such wheel file (collect --external takes wheel files, then --out"
                         " the wheelhouse)")
    try:
        parse_wheel_filename(wheel.name)
    except InvalidWheelFilename:
        raise UsageError(f"{shown(wheel)}: not a wheel (NAME-VERSION-PYTHON-ABI-PLATFORM.whl): collect --external"
                         " takes built wheels only") from None


def _local_facts(version: str) -> dict:
    """The CUDA and torch a local version label names, as builders write them (``+cu128torch2.8``,
    ``+cu128``); None where it names none."""
    local = version.partition("+")[2]
    cuda = re.search(r"(?<![a-z0-9])cu([0-9]{2,4})", local)
    torch = re.search(r"torch([0-9]+\.[0-9]+(?:\.[0-9]+)?)", local)
    return {"cuda": f"cu{cuda.group(1)}" if cuda else None, "torch": torch.group(1) if torch else None}


def _python(tags: list[str]) -> str | None:
    interpreter = re.match(r"cp([0-9])([0-9]+)-", tags[0]) if tags else None
    return f"{interpreter.group(1)}.{interpreter.group(2)}" if interpreter else None


def entry(wheel: Path, requested: ArchList, expected: ArchList, report) -> dict:
    """The manifest entry of a verified external wheel (``report``: imagegen.finish.verify.WheelReport, ok)."""
    if not report.ok:
        raise VerifyError(f"{wheel.name}: {report.problems[0]}")
    facts = _local_facts(report.version)
    return {
        "external": True,
        "inputs": "",
        "wheel": wheel.name,
        "recipe": report.distribution,
        "version": report.version,
        "tags": list(report.tags),
        "torch": facts["torch"],
        "cuda": facts["cuda"],
        "python": _python(list(report.tags)),
        "archs": str(requested),
        "requested_archs": str(requested),
        "expected_archs": str(expected),
        "checked": list(CHECKED),
        "not_checked": list(NOT_CHECKED),
        "notes": [NOTE],
        "verify": report.as_dict(),
        "collected_from": wheel.name,
        "collected_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def is_external(entry: dict | None) -> bool:
    return isinstance(entry, dict) and entry.get("external") is True
