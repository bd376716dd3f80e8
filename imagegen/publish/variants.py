"""Wheel variants for the static index (``imagegen index --variants``): each verified wheel's CUDA version
and GPU targets as variant properties (PEP 817 "Wheel Variants", its package format now split out as
PEP 825), in the format of WheelNext's reference implementation, ``variantlib`` (0.2.x, schema v0.2.0),
whose models build and check every file written here.

What a variant-aware installer does with it: on a project page it finds wheels whose file name ends in a
*variant label* (``...-linux_x86_64-cu130_1a2b3c4d.whl``) and the ``{name}-{version}-variants.json`` of
that version; the file maps each label to its properties and names the *provider plugin* that can tell
which properties this machine supports. It installs that plugin (``nvidia-variant-provider``), asks it
(the driver's CUDA version, the GPU's compute capability), keeps the variants of which every feature has
at least one supported value, orders them, and installs the best one's wheel; when none fits it takes the
plain wheel, as today. Plain pip (and any installer without variants) rejects a file name with a label
(the Python tag lands where a build number must start with a digit: "invalid wheel filename") and a
``.json`` link ("unsupported archive format"), so it installs the plain wheel from the same page.

The properties (the names the WheelNext NVIDIA provider plugin, ``nvidia_variant_provider.plugin``, reports
and validates; also what PyTorch's and XGBoost's variant wheels on the WheelNext index carry):

- ``nvidia :: cuda_version_lower_bound :: 13.0``: the CUDA the wheel was built with (the manifest's
  ``cuda``, ``cu130``), which the driver must support. The plugin also has ``cuda_version_upper_bound``;
  none is written: a newer driver runs binaries of an older toolkit (PyTorch's variant wheels carry no
  upper bound either).
- ``nvidia :: sm_arch :: 90_real`` for each SASS target and ``90_virtual`` for each PTX target of the
  manifest's ``expected_archs`` (what verification found in the wheel: ``8.0;9.0+PTX`` gives ``80_real``,
  ``90_real``, ``90_virtual``), the CMake notation (``90-real``) the plugin follows. A multi-value feature:
  one value the machine supports is enough. The plugin reports, for a GPU of capability X.Y, ``XY_real``
  down to ``X0_real`` and ``X0_virtual`` (SASS runs on later minors of one major).
  Arch-specific targets keep their letter, as CMake writes them: ``9.0a`` gives ``90a_real``, ``10.0f``
  ``100f_real``. That is what the wheel carries (sm_90a runs on 9.0 only, sm_100f on 10.x), but the
  plugin (0.0.2) lists no such value, so it finds no GPU for them: a wheel whose only SASS is
  arch-specific matches no machine through the plugin, and the installer falls back to the plain wheel.
  Writing ``90_real`` instead would claim sm_90a runs on every 9.x, and ``100_real`` that sm_100a runs on
  a 10.3 GPU (B300), which it does not.

The variant label: ``{cuda}_{hash}`` (``cu130_1a2b3c4d``): readable where it can be (the CUDA), then the
first 8 hex digits of variantlib's hash of the properties, so one set of properties always has the same
label (PEP 825: a label names one property set within a version) and a later build of other archs under
the same version gets another label instead of changing what a published one means; 14 characters, within
PEP 825's 16.

The variant wheel is the verified wheel plus ``*.dist-info/variant.json`` (PEP 825 requires the label in
the file name and the file in the wheel, so it cannot be the same file). It is not rebuilt: every member's
bytes (local header and compressed data) are copied as they are, RECORD is replaced by one that also lists
variant.json with its hash, and a new central directory points at the members; so it costs a copy of the
wheel on disk and one read and write, never a recompression. A zip this cannot copy that way (ZIP64,
bytes between its records) gets no variant, said as a warning. A later run leaves a variant wheel whose size
and end (the central directory, with every member's CRC-32, variant.json and RECORD) are what it would
write, and lists it with the sha256 it should have, computed from the verified wheel (one read of it): a
copy damaged since is refused by the installer's hash check rather than installed.

``provider`` names the plugin as PyTorch's variant index does (``requires`` and ``plugin-api``); the plugin
is not on PyPI (only a placeholder is), a variant-aware installer has to find it on the index it uses.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import stat
import struct
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterable

from packaging.utils import canonicalize_name
from packaging.version import Version
from variantlib.constants import VARIANT_DIST_INFO_FILENAME
from variantlib.errors import ValidationError
from variantlib.models.variant import VariantDescription, VariantProperty
from variantlib.models.variant_info import ProviderInfo, VariantInfo
from variantlib.variant_dist_info import VariantDistInfo
from variantlib.variants_json import VariantsJson

from imagegen.errors import ArchError, NoVariant, printable
from imagegen.model.arch_parse import parse_arch_list

NAMESPACE = "nvidia"
CUDA_LOWER_BOUND = "cuda_version_lower_bound"
SM_ARCH = "sm_arch"
# 0.0.2 is the plugin release with sm_arch as a multi-value feature (and the stateless plugin API).
PROVIDER_REQUIRES = "nvidia-variant-provider>=0.0.2,<1.0.0"
PROVIDER_PLUGIN_API = "nvidia_variant_provider.plugin:NvidiaVariantPlugin"

VARIANTS_JSON_SUFFIX = "-variants.json"
LABEL = re.compile(r"[0-9a-z_.]{1,16}")  # PEP 825's variant label
HASH_DIGITS = 8
CUDA_NAME = re.compile(r"cu([1-9][0-9]?)([0-9])")  # cu118, cu130: major, then one digit of minor

# Bounds on what is read from a wheel (the index reads the same central directory for its METADATA).
MAX_CENTRAL_DIRECTORY_BYTES = 8 << 20
MAX_RECORD_BYTES = 32 << 20
CHUNK = 1 << 20


# -------------------------------------------------------------------------------------------- properties


@dataclass(frozen=True)
class WheelVariant:
    """The variant of one wheel: its label and properties (variantlib's model, validated on creation)."""

    label: str
    description: VariantDescription

    @property
    def properties(self) -> list[str]:
        return [p.to_str() for p in self.description.properties]


def cuda_version(cuda: object) -> str:
    """``cu130`` (a manifest's ``cuda``) as the plugin's version value, ``13.0``."""
    match = CUDA_NAME.fullmatch(cuda) if isinstance(cuda, str) else None
    if match is None:
        raise NoVariant(f"its manifest entry's cuda {printable(repr(cuda))[:40]} is not cuXYZ")
    return f"{match[1]}.{match[2]}"


def sm_arch_values(expected_archs: object) -> list[str]:
    """The ``sm_arch`` values of a manifest's ``expected_archs`` (``8.0;9.0a+PTX``): ``XY_real`` per SASS
    target and ``XY_virtual`` per PTX target, arch-specific letters kept (``90a_real``)."""
    if not isinstance(expected_archs, str):
        raise NoVariant("its manifest entry has no expected_archs (the GPU targets verification found)")
    try:
        archs = parse_arch_list(expected_archs)
    except ArchError as exc:
        raise NoVariant(f"its manifest entry's expected_archs: {exc}") from None
    values = []
    for arch in archs.entries:
        if arch.sass:
            values.append(f"{arch.code}_real")
        if arch.ptx:
            values.append(f"{arch.code}_virtual")
    return values


def describe(entry: dict) -> WheelVariant:
    """The variant of the wheel a manifest ``entry`` describes (its ``cuda`` and ``expected_archs``).
    NoVariant says why there is none."""
    cuda = entry.get("cuda")
    properties = [VariantProperty(NAMESPACE, CUDA_LOWER_BOUND, cuda_version(cuda))]
    properties += [VariantProperty(NAMESPACE, SM_ARCH, value) for value in sm_arch_values(entry.get("expected_archs"))]
    try:
        hashed = VariantDescription(properties)
        label = f"{cuda}_{hashed.hexdigest[:HASH_DIGITS]}"
        if not LABEL.fullmatch(label):
            raise NoVariant(f"its label {label!r} is not 1-16 of 0-9 a-z _ .")
        return WheelVariant(label, VariantDescription(properties, label=label))
    except ValidationError as exc:
        raise NoVariant(printable(str(exc))[:200]) from None


def variant_info() -> VariantInfo:
    """What every variant.json here shares: the namespace's priority and the provider plugin."""
    return VariantInfo(namespace_priorities=[NAMESPACE],
                       providers={NAMESPACE: ProviderInfo(requires=[PROVIDER_REQUIRES], plugin_api=PROVIDER_PLUGIN_API)})


def dist_info_json(variant: WheelVariant) -> bytes:
    """The wheel's ``*.dist-info/variant.json``: the shared info and its one variant."""
    document = VariantDistInfo(variant_info())
    document.variant_desc = variant.description
    return document.to_str().encode()


def variants_json(variants: Iterable[WheelVariant]) -> bytes:
    """The index's ``{name}-{version}-variants.json``: the shared info and every label of that version.
    Two property sets under one label are a NoVariant (PEP 825: a label names one set)."""
    document = VariantsJson(variant_info())
    for variant in sorted(variants, key=lambda v: v.label):
        known = document.variants.get(variant.label)
        if known is not None and known != variant.description:
            raise NoVariant(f"label {variant.label} names two property sets")
        document.variants[variant.label] = variant.description
    return document.to_str().encode()


def variant_wheel_name(wheel_name: str, label: str) -> str:
    """PEP 825: the label is one more dash-separated part before ``.whl``."""
    return f"{wheel_name[:-len('.whl')]}-{label}.whl"


def variants_json_name(project: str, version: Version) -> str:
    """``{name}-{version}-variants.json``, name and version normalized as in a wheel's file name."""
    return f"{canonicalize_name(project).replace('-', '_')}-{version}{VARIANTS_JSON_SUFFIX}"


# -------------------------------------------------------------------------------------------- the wheel

# The zip records this reads and writes (APPNOTE 4.3.7, 4.3.12, 4.3.16).
_LOCAL_SIGNATURE = b"PK\x03\x04"
_CENTRAL = struct.Struct("<4s6H3L5H2L")
_CENTRAL_SIGNATURE = b"PK\x01\x02"
_OFFSET_AT = 42  # of the local header's offset in a central directory record
_END = struct.Struct("<4s4H2LH")
_END_SIGNATURE = b"PK\x05\x06"
_ZIP64_MARK = 0xFFFFFFFF


@dataclass(frozen=True)
class _Member:
    name: str
    offset: int  # of its local header
    record: bytes  # its central directory record, as it is


@dataclass(frozen=True)
class VariantWheel:
    """How to write a variant wheel: the source wheel's bytes in the ``keep`` ranges as they are (every
    member but RECORD), then ``tail`` (variant.json, the new RECORD, the central directory, its end)."""

    source: Path
    source_sha256: str
    source_size: int
    keep: tuple[tuple[int, int], ...]  # [start, end) in the source, ascending
    tail: bytes

    @property
    def size(self) -> int:
        return sum(end - start for start, end in self.keep) + len(self.tail)

    def is_written_at(self, path: Path) -> bool:
        """Whether ``path`` already holds this wheel: a regular file of its size that ends in its tail (the
        central directory, with every member's CRC-32 and size, variant.json and RECORD)."""
        try:
            with _open_regular(path) as fh:
                if os.fstat(fh.fileno()).st_size != self.size:
                    return False
                fh.seek(self.size - len(self.tail))
                return fh.read(len(self.tail)) == self.tail
        except (OSError, NoVariant):
            return False

    def sha256(self) -> str:
        """The sha256 of this wheel, from the source (one read of it, checked against its verified sha256)."""
        return self.write_to(None)

    def write_to(self, out: BinaryIO | None) -> str:
        """Write the wheel to ``out`` (None: nowhere); its sha256. The whole source is read (its kept bytes
        copied) and hashed on the way: a source that is no longer the verified wheel is a NoVariant."""
        written = hashlib.sha256()
        read = hashlib.sha256()
        with _open_regular(self.source) as src:
            position = 0
            for start, end in (*self.keep, (self.source_size, self.source_size)):
                _pump(src, start - position, read, None, None)  # what is left out, hashed all the same
                _pump(src, end - start, read, out, written)
                position = end
            if src.read(1) or read.hexdigest() != self.source_sha256:
                raise NoVariant("it changed while it was being indexed")
        if out is not None:
            out.write(self.tail)
        written.update(self.tail)
        return written.hexdigest()


def splice(source: Path, source_sha256: str, project: str, variant_json: bytes) -> VariantWheel:
    """Plan the variant wheel of ``source`` (a verified wheel of ``project``, normalized) holding
    ``variant_json`` as its ``*.dist-info/variant.json``. Reads the central directory and RECORD only.
    NoVariant says why it cannot be made this way."""
    try:
        with _open_regular(source) as fh:
            size = os.fstat(fh.fileno()).st_size
            directory_at, members = _read_directory(fh, size)
            dist_info = _dist_info(members, project)
            record_name = f"{dist_info}/RECORD"
            variant_name = f"{dist_info}/{VARIANT_DIST_INFO_FILENAME}"
            names = [m.name for m in members]
            if variant_name in names:
                raise NoVariant(f"it already holds {variant_name} (a variant wheel)")
            if names.count(record_name) != 1:
                raise NoVariant(f"{names.count(record_name)} {record_name} members, where a wheel has one")
            fh.seek(0)
            with zipfile.ZipFile(fh) as zf:
                record_info = zf.getinfo(record_name)
                if record_info.file_size > MAX_RECORD_BYTES:
                    raise NoVariant(f"a RECORD of {record_info.file_size} bytes; at most {MAX_RECORD_BYTES} are read")
                record = zf.read(record_info)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, struct.error, EOFError, NotImplementedError,
            RuntimeError, ValueError, OSError) as exc:  # a broken, encrypted or oddly compressed zip
        raise NoVariant(printable(str(exc))[:200] or exc.__class__.__name__) from None

    # Every member keeps its local entry (header and data) where it is, but RECORD's, which is left out:
    # the members after it move up by its length.
    by_offset = sorted(members, key=lambda m: m.offset)
    ends = [m.offset for m in by_offset[1:]] + [directory_at]
    (record_start, record_end), = [(m.offset, end) for m, end in zip(by_offset, ends) if m.name == record_name]
    keep = tuple((start, end) for start, end in ((0, record_start), (record_end, directory_at)) if end > start)
    removed = record_end - record_start
    kept = [m for m in members if m.name != record_name]
    records = [_moved(m.record, m.offset - (removed if m.offset > record_start else 0)) for m in kept]

    # variant.json, then RECORD listing it, written by zipfile into a zip of their own; their local entries
    # and central directory records (moved to where they land) are the tail.
    if not record.endswith(b"\n"):
        record += b"\n"
    digest = base64.urlsafe_b64encode(hashlib.sha256(variant_json).digest()).rstrip(b"=").decode()
    record += f"{variant_name},sha256={digest},{len(variant_json)}\n".encode()
    added = io.BytesIO()
    with zipfile.ZipFile(added, "w") as zf:
        for name, data in ((variant_name, variant_json), (record_name, record)):
            info = zipfile.ZipInfo(name, date_time=record_info.date_time)  # the same bytes on every run
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = (stat.S_IFREG | 0o644) << 16
            zf.writestr(info, data)
    added_bytes = added.getvalue()
    added_at, added_members = _read_directory(io.BytesIO(added_bytes), len(added_bytes))
    base = sum(end - start for start, end in keep)
    records += [_moved(m.record, base + m.offset) for m in added_members]
    directory = b"".join(records)
    directory_offset = base + added_at
    if len(records) > 0xFFFF or directory_offset + len(directory) >= _ZIP64_MARK:
        raise NoVariant("its variant would need ZIP64 (over 65535 members or 4 GiB)")
    end = _END.pack(_END_SIGNATURE, 0, 0, len(records), len(records), len(directory), directory_offset, 0)
    return VariantWheel(source=source, source_sha256=source_sha256, source_size=size, keep=keep,
                        tail=added_bytes[:added_at] + directory + end)


def _read_directory(fh: BinaryIO, size: int) -> tuple[int, list[_Member]]:
    """Where the central directory of the zip in ``fh`` starts, and its members; NoVariant for a zip whose
    members are not laid out one after another from its first byte to its central directory (prepended
    data, ZIP64, a zip split over disks)."""
    tail_size = min(size, _END.size + 0xFFFF)
    fh.seek(size - tail_size)
    tail = fh.read(tail_size)
    at = tail.rfind(_END_SIGNATURE)
    if at < 0 or at + _END.size > len(tail):
        raise NoVariant("not a zip file")
    _, disk, directory_disk, entries_here, entries, directory_size, directory_at, _ = _END.unpack_from(tail, at)
    end_at = size - tail_size + at
    if disk or directory_disk or entries_here != entries or 0xFFFF in (entries, entries_here) \
            or _ZIP64_MARK in (directory_size, directory_at) or directory_at + directory_size != end_at:
        raise NoVariant("a ZIP64 zip, or one with bytes between its central directory and its end")
    if directory_size > MAX_CENTRAL_DIRECTORY_BYTES:
        raise NoVariant(f"a zip directory of {directory_size} bytes; at most {MAX_CENTRAL_DIRECTORY_BYTES} are read")
    fh.seek(directory_at)
    directory = fh.read(directory_size)
    members: list[_Member] = []
    position = 0
    while position < len(directory):
        if position + _CENTRAL.size > len(directory):
            raise NoVariant("a central directory cut short")
        fields = _CENTRAL.unpack_from(directory, position)
        signature, flags, compressed, uncompressed = fields[0], fields[3], fields[8], fields[9]
        name_length, extra_length, comment_length, offset = fields[10], fields[11], fields[12], fields[16]
        if signature != _CENTRAL_SIGNATURE:
            raise NoVariant("a central directory record without its signature")
        if _ZIP64_MARK in (compressed, uncompressed, offset):
            raise NoVariant("a ZIP64 member")
        record_end = position + _CENTRAL.size + name_length + extra_length + comment_length
        raw_name = directory[position + _CENTRAL.size:position + _CENTRAL.size + name_length]
        name = raw_name.decode("utf-8" if flags & 0x800 else "cp437")
        members.append(_Member(name=name, offset=offset, record=directory[position:record_end]))
        position = record_end
    if len(members) != entries or position != len(directory):
        raise NoVariant("a central directory that does not hold the members its end counts")
    offsets = sorted(m.offset for m in members)
    if not offsets or offsets[0] != 0 or len(set(offsets)) != len(offsets) or offsets[-1] >= directory_at:
        raise NoVariant("members not laid out from the zip's first byte to its central directory")
    for offset in offsets:
        fh.seek(offset)
        if fh.read(len(_LOCAL_SIGNATURE)) != _LOCAL_SIGNATURE:
            raise NoVariant("a member without its local header")
    return directory_at, members


def _dist_info(members: list[_Member], project: str) -> str:
    """The wheel's one top-level ``*.dist-info`` folder, named after ``project`` (as the index reads it)."""
    folders = {m.name.split("/", 1)[0] for m in members if m.name.split("/", 1)[0].endswith(".dist-info")}
    if len(folders) != 1:
        raise NoVariant(f"{len(folders)} top-level .dist-info folders, where a wheel has one")
    (folder,) = folders
    if not canonicalize_name(folder).startswith(project):
        raise NoVariant(f"its .dist-info folder {printable(folder[:80])!r} is not named after {project}")
    return folder


def _moved(record: bytes, offset: int) -> bytes:
    """A central directory record pointing at its local header's new ``offset``."""
    if offset >= _ZIP64_MARK:
        raise NoVariant("its variant would need ZIP64 (over 4 GiB)")
    return record[:_OFFSET_AT] + struct.pack("<L", offset) + record[_OFFSET_AT + 4:]


def _open_regular(path: Path) -> BinaryIO:
    """``path`` opened for reading, not through a symlink, and only if it is a regular file."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | os.O_NONBLOCK
    fh = os.fdopen(os.open(path, flags), "rb")
    if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
        fh.close()
        raise NoVariant("not a regular file")
    return fh


def _pump(src: BinaryIO, count: int, read, out: BinaryIO | None, written) -> None:
    """Read ``count`` bytes of ``src`` into the ``read`` hash, and when ``written`` (the copy's hash) is given,
    into it and ``out`` (when given) too. A source shorter than planned is a NoVariant."""
    while count > 0:
        chunk = src.read(min(CHUNK, count))
        if not chunk:
            raise NoVariant("it changed while it was being indexed")
        read.update(chunk)
        if written is not None:
            written.update(chunk)
            if out is not None:
                out.write(chunk)
        count -= len(chunk)
