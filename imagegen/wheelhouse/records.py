"""Build records: what a builder image says of each wheel it made, read back on the host.

A wheel that leaves a builder image without imagegen's own `build` around it (a plain ``docker buildx
bake`` in a clone of the repository, a ``docker run -v OUT:/out`` of a pulled builder image, the
build jobs of a generated CI workflow) carries a record beside it, ``<wheel>.imagegen.json``
(written by imagegen_records.py: cell, recipe, source, torch, CUDA, the archs it was asked for, its
sha256 and the smoke test's result). Such a wheel is not in the wheelhouse's manifest yet, so
``imagegen index`` and ``imagegen publish`` leave it out. ``imagegen collect`` reads each record
(bounded: the folder may come from anywhere), checks that the wheel is the one recorded and passed
its smoke test, verifies its SASS/PTX against the requested archs as the recipe compiles them, and
only then records it in the folder's manifest (imagegen.wheelhouse.collect.record_entry).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from imagegen import untrusted
from imagegen.errors import BuildRecordError, ImagegenError, Unreadable
from imagegen.model.arch import ArchList
from imagegen.model.arch_parse import parse_arch_list
from imagegen.wheelhouse.manifest import RECORD_SUFFIX, folders, sha256

MAX_RECORD_BYTES = 1 << 20
# A bake target / cell name (imagegen.model.cell.Cell.name): the manifest's key.
CELL_NAME = re.compile(r"[A-Za-z0-9_-]{1,200}")
_TEXT_FIELDS = ("recipe", "version", "torch", "cuda", "python", "requested_archs")


@dataclass(frozen=True)
class BuildRecord:
    path: Path  # the record file
    wheel: Path  # the wheel beside it
    doc: dict  # the record as written by the builder
    requested: ArchList  # the archs the build was asked for

    @property
    def cell(self) -> str:
        """The manifest key: the record's cell name, else one made of what the record says."""
        name = self.doc.get("cell")
        if isinstance(name, str) and CELL_NAME.fullmatch(name):
            return name
        made = "-".join(str(self.doc[k]) for k in ("recipe", "version", "torch", "cuda", "python"))
        return re.sub(r"[^A-Za-z0-9_-]", "_", made)[:200]


def find(out: Path) -> tuple[list[Path], list[Path]]:
    """The build records under ``out`` and the wheels that have none (sorted)."""
    records, bare = [], []
    for _, entries in folders(out):
        names = {e.name for e in entries}
        for entry in entries:
            if entry.is_symlink() or not entry.is_file():
                continue
            if entry.name.endswith(".whl" + RECORD_SUFFIX):
                records.append(entry)
            elif entry.name.endswith(".whl") and entry.name + RECORD_SUFFIX not in names:
                bare.append(entry)
    return sorted(records), sorted(bare)


def read(path: Path) -> BuildRecord:
    """The record at ``path``, checked: it names the wheel beside it, that wheel is there with the
    recorded sha256, and it passed its smoke test. BuildRecordError says what is wrong."""
    try:  # a regular file of at most 1 MiB, JSON nested at most untrusted.MAX_JSON_DEPTH levels
        doc = untrusted.read_json_file(path, limit=MAX_RECORD_BYTES)
    except Unreadable as exc:
        raise BuildRecordError(f"unreadable: {str(exc)[:200]}") from None
    if not isinstance(doc, dict) or doc.get("kind") != "imagegen-build-record":
        raise BuildRecordError("not an imagegen build record")
    for key in _TEXT_FIELDS + ("wheel", "sha256"):
        if not isinstance(doc.get(key), str) or len(doc[key]) > 400:
            raise BuildRecordError(f"no valid {key!r}")
    wheel = path.with_name(path.name[: -len(RECORD_SUFFIX)])
    if doc["wheel"] != wheel.name:
        raise BuildRecordError(f"it describes {doc['wheel'][:100]!r}, not the wheel beside it")
    if wheel.is_symlink() or not wheel.is_file():
        raise BuildRecordError("its wheel is missing")
    if sha256(wheel) != doc["sha256"]:
        raise BuildRecordError("the wheel is not the one the build recorded (sha256 differs): build it again")
    smoke = doc.get("smoke")
    if not isinstance(smoke, dict) or smoke.get("ok") is not True:
        raise BuildRecordError("no passed smoke test recorded (the builder's smoke stage did not run or failed)")
    try:
        requested = parse_arch_list(doc["requested_archs"])
    except ImagegenError as exc:  # ArchError
        raise BuildRecordError(f"requested archs {doc['requested_archs'][:100]!r}: {exc}") from None
    return BuildRecord(path=path, wheel=wheel, doc=doc, requested=requested)


def manifest_entry(record: BuildRecord, expected: ArchList, verify: dict) -> dict:
    """The manifest entry of a collected wheel: the schema imagegen.wheelhouse.collect.place writes, from the
    record, with the verification done here."""
    doc = record.doc
    source = doc.get("source") if isinstance(doc.get("source"), dict) else {}
    return {
        "inputs": doc.get("inputs") if isinstance(doc.get("inputs"), str) else "",
        "wheel": record.wheel.name,
        "sha256": doc["sha256"],
        "recipe": doc["recipe"],
        "version": doc["version"],
        "source": {k: source.get(k) for k in ("kind", "url", "ref", "commit", "sha256") if k in source},
        "patches": [p for p in doc["patches"] if isinstance(p, str)] if isinstance(doc.get("patches"), list) else [],
        "torch": doc["torch"],
        "cuda": doc["cuda"],
        "python": doc["python"],
        "archs": str(record.requested),
        "requested_archs": str(record.requested),
        "expected_archs": str(expected),
        "notes": ["built by a builder image outside `imagegen build`; verified and recorded by `imagegen collect`"],
        "flavor": doc.get("flavor") if isinstance(doc.get("flavor"), str) else None,
        "base_image": doc.get("base_image") if isinstance(doc.get("base_image"), str) else None,
        "built_at": doc.get("built_at") if isinstance(doc.get("built_at"), str) else None,
        "duration_s": doc.get("duration_s") if isinstance(doc.get("duration_s"), (int, float)) else None,
        "smoke": doc["smoke"],
        **({"gpu_check": doc["gpu_check"]} if isinstance(doc.get("gpu_check"), dict) else {}),
        "verify": verify,
        "collected_from": record.path.name,
    }
