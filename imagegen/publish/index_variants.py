"""The wheel variants of the static index (``imagegen index --variants``; the files are made by
imagegen.publish.variants): each verified wheel's variant wheel and metadata file beside its project page,
each version's variants.json, what of them is stale, and how a file of theirs is told from the others.

They cost a copy of every wheel, so they are written only when asked (``variants=True``), and kept up to date
by every later run until ``variants=False`` removes them (``variants=None``, the default: as the index has
them now, which ``has_variants`` tells). A variant-aware installer reads them from the project page; plain
pip skips both kinds of link."""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import replace as dataclasses_replace
from pathlib import Path
from types import ModuleType

from packaging.version import Version

from imagegen.errors import PublishError
from imagegen.outputs import shown
from imagegen.publish import index_files as disk
from imagegen.publish.index_pages import METADATA_SUFFIX, IndexedFile, IndexedWheel
from imagegen.publish.index_wheels import WHEEL_FILE_NAME, is_wheel_name, url_path

SIMPLE = "simple"
VARIANTS_JSON_SUFFIX = "-variants.json"  # PEP 817/825: {name}-{version}-variants.json
# A variant label (PEP 825): the last dash-separated part of a variant wheel's file name.
VARIANT_LABEL = re.compile(r"[0-9a-z_.]{1,16}")


def variant_support() -> ModuleType:
    """imagegen.publish.variants, which needs variantlib (imported only when variants are written)."""
    try:
        from imagegen.publish import variants
    except ModuleNotFoundError as exc:
        if exc.name != "variantlib" and not (exc.name or "").startswith("variantlib."):
            raise
        raise PublishError("wheel variants need variantlib, which is not installed: pip install"
                           " 'imagegen-wheels[publish]' (or imagegen index --no-variants)") from None
    return variants


def has_variants(simple: Path) -> bool:
    """Whether the index has wheel variants now (a variants.json in a project folder): kept until asked off."""
    try:
        folders = [e for e in os.scandir(simple) if e.is_dir(follow_symlinks=False)]
        return any(e.name.endswith(VARIANTS_JSON_SUFFIX) and e.is_file(follow_symlinks=False)
                   for folder in folders for e in os.scandir(folder.path))
    except OSError:  # no index yet
        return False


def write_variants(out: Path, wheels: list[IndexedWheel], entries: dict[Path, dict], written: list[Path],
                    problems: list[str]) -> tuple[list[IndexedWheel], list[IndexedFile]]:
    """Write each wheel's variant (a copy with its label and variant.json) and its metadata file into its
    project's folder, then each version's variants.json; what the pages are to list. A wheel that gets
    no variant is said in ``problems`` and stays listed as it is."""
    support = variant_support()
    simple = out / SIMPLE
    variant_wheels: list[IndexedWheel] = []
    by_version: dict[tuple[str, Version], dict[str, object]] = {}  # label -> its variant, per version
    for wheel in sorted(wheels, key=lambda w: (w.project, w.version, w.path.name)):
        labels = by_version.setdefault((wheel.project, wheel.version), {})
        try:
            variant = support.describe(entries[wheel.path])
            if labels.get(variant.label, variant).description != variant.description:
                raise support.NoVariant(f"its label {variant.label} names other properties in this version")
            name = support.variant_wheel_name(wheel.path.name, variant.label)
            if not WHEEL_FILE_NAME.fullmatch(name):
                raise support.NoVariant(f"its variant's file name would be too long ({len(name)} characters)")
            spliced = support.splice(wheel.path, wheel.sha256, wheel.project, support.dist_info_json(variant))
            path = simple / wheel.project / name
            sha256, size = _write_variant_wheel(path, spliced, written)
        except support.NoVariant as exc:
            problems.append(f"{shown(wheel.path)}: no wheel variant ({exc}); listed without one")
            continue
        labels[variant.label] = variant
        variant_wheel = dataclasses_replace(wheel, path=path, url_path=url_path(out, path), sha256=sha256, size=size)
        disk.write(variant_wheel.metadata_path, variant_wheel.metadata, written)
        variant_wheels.append(variant_wheel)
    variant_files: list[IndexedFile] = []
    for (project, version), labels in sorted(by_version.items()):
        if not labels:
            continue
        data = support.variants_json(labels.values())
        path = simple / project / support.variants_json_name(project, version)
        disk.write(path, data, written)
        variant_files.append(IndexedFile(path=path, url_path=url_path(out, path), project=project, version=version,
                                         sha256=hashlib.sha256(data).hexdigest(), size=len(data)))
    return variant_wheels, variant_files


def _write_variant_wheel(path: Path, spliced, written: list[Path]) -> tuple[str, int]:
    """``path`` holds the variant wheel ``spliced`` plans afterwards (written as _replace writes, unless it
    is there already); its sha256 and size."""
    if spliced.is_written_at(path):
        return spliced.sha256(), spliced.size  # what it should be: a copy damaged since fails pip's hash check
    return disk.replace_file(path, spliced.write_to, written), spliced.size


def is_variant_file(name: str) -> bool:
    """Whether ``name`` is a file of the index's wheel variants: a variants.json, a wheel whose name has a
    variant label (with it, not a valid wheel name; without it, one), or such a wheel's metadata file."""
    if name.endswith(VARIANTS_JSON_SUFFIX):
        return True
    if name.endswith(".whl" + METADATA_SUFFIX):
        name = name[:-len(METADATA_SUFFIX)]
    if not name.endswith(".whl"):
        return False
    plain, _, label = name[:-len(".whl")].rpartition("-")
    return bool(VARIANT_LABEL.fullmatch(label)) and not is_wheel_name(name) and is_wheel_name(plain + ".whl")


def is_variant_partial(name: str) -> bool:
    """Whether ``name`` is a temporary file _replace made for a variant file."""
    if not (name.startswith(".") and name.endswith(".partial")):
        return False
    target = name[1:-len(".partial")].rpartition(".")[0]  # mkstemp's random part has no dot
    return is_variant_file(target)


def remove_stale_variants(simple: Path, projects: set[str], current: set[Path]) -> list[Path]:
    """Remove the variant files of listed projects that no page lists any more (variants asked off, a
    wheel gone or changed); temporary ones a killed run left are gone already (_sweep_partials)."""
    removed = []
    for project in sorted(projects):
        for entry in sorted(os.scandir(simple / project), key=lambda e: e.name):
            path = Path(entry.path)
            if is_variant_file(entry.name) and path not in current and not entry.is_dir(follow_symlinks=False):
                os.unlink(path)
                removed.append(path)
    return removed

