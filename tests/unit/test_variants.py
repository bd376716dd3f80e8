"""Tests for wheel variants in the static index (imagegen.publish.variants, imagegen index --variants).

The property mapping (CUDA version, SASS and PTX targets, arch-specific ones) and labels; every file checked
by WheelNext's variantlib rather than by our own code: variants.json and each wheel's variant.json parsed
by its strict models, the variants.json compared with the one variantlib's own generate-index-json makes
from our variant wheels, and variantlib's resolver choosing among them as the NVIDIA plugin's supported
properties say. The variant wheel itself: a zip that Python's zipfile tests clean, whose RECORD hashes
every member, whose members are the verified wheel's own bytes. The index: pages that link what exists
with the right hashes, a second run that rewrites nothing, variants kept until asked off, stale ones
removed, a wheel without a variant said and still listed, and one-line errors."""

from __future__ import annotations

import base64
import csv
import dataclasses
import hashlib
import io
import json
import os
import subprocess
import sys
import zipfile
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from variantlib.commands.generate_index_json import generate_index_json
from variantlib.constants import VALIDATION_WHEEL_NAME_REGEX
from variantlib.errors import ValidationError
from variantlib.models.variant import VariantDescription, VariantProperty
from variantlib.resolver.lib import sort_and_filter_supported_variants
from variantlib.variant_dist_info import VariantDistInfo
from variantlib.variants_json import VariantsJson

import imagegen.publish
from imagegen import cli
from imagegen.wheelhouse import manifest as wheelhouse
from imagegen.wheelhouse import collect
from imagegen.commands import indexing
from imagegen.errors import PublishError
from imagegen.outputs import shown
from imagegen.publish import index, variants
from tests.unit.command_helpers import call
from tests.unit.executor_fixtures import WHEEL, pure_wheel, tiny_cell

TINY = "tiny-kernel"
VERSION = "0.1.0+cu130torch2.11"
VARIANTS_JSON = f"tiny_kernel-{VERSION}-variants.json"


def _quiet(message: str) -> None:
    pass


def house(tmp_path: Path, **record) -> tuple[Path, Path]:
    """A wheelhouse holding the fixture's wheel as a build leaves it (``record`` overrides manifest fields)."""
    out = tmp_path / "house"
    return out, collect.place(out, tiny_cell(), WHEEL, inputs="inputs", record=record)


def place(out: Path, wheel: Path, folder: str, **record) -> Path:
    return collect.place(out, dataclasses.replace(tiny_cell(), layout=folder), wheel, inputs="i", record=record)


def pure_tiny(tmp_path: Path) -> Path:
    """A py3-none-any wheel of the same project and version as the fixture's (another file, another Python)."""
    return pure_wheel(tmp_path / "src" / f"tiny_kernel-{VERSION}-py3-none-any.whl", {"tiny_kernel/__init__.py": ""},
                      name="tiny_kernel", version=VERSION)


class _Anchors(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.anchors: list[tuple[str, str]] = []
        self._href: str | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self._href = dict(attrs)["href"]

    def handle_data(self, data):
        if self._href is not None:
            self.anchors.append((self._href, data))
            self._href = None


def links(page: Path) -> dict[str, tuple[Path, str]]:
    """A page's links: file name -> (the file the link names, the sha256 in its fragment)."""
    parser = _Anchors()
    parser.feed(page.read_text())
    found = {}
    for href, text in parser.anchors:
        url = urlsplit(href)
        found[text] = (Path(os.path.normpath(page.parent / unquote(url.path))), url.fragment.removeprefix("sha256="))
    return found


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def stamps(folder: Path) -> dict[Path, tuple[int, int]]:
    """Every file under ``folder`` with its inode and mtime (a rewrite changes both)."""
    return {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()}


def variant_files(out: Path) -> list[str]:
    return sorted(p.name for p in (out / "simple").glob("*/*") if p.name not in ("index.html", "index.json"))


# -------------------------------------------------------------------------------------------- properties


@pytest.mark.parametrize(("cuda", "archs", "expected"), [
    ("cu130", "8.0;9.0+PTX", ["13.0", "80_real", "90_real", "90_virtual"]),
    ("cu128", "7.5;8.0;8.6;12.0+PTX", ["12.8", "75_real", "80_real", "86_real", "120_real", "120_virtual"]),
    ("cu118", "8.0", ["11.8", "80_real"]),
    ("cu126", "9.0a", ["12.6", "90a_real"]),  # sm_90a runs on 9.0 only: not 90_real, which says every 9.x
    ("cu128", "9.0a+PTX;10.0a", ["12.8", "90a_real", "90a_virtual", "100a_real"]),
    ("cu129", "10.0f;12.0", ["12.9", "100f_real", "120_real"]),
    ("cu130", "compute_120", ["13.0", "120_virtual"]),  # PTX alone: no SASS value
])
def test_a_wheels_cuda_and_gpu_targets_are_its_properties(cuda, archs, expected):
    variant = variants.describe({"cuda": cuda, "expected_archs": archs})
    lower_bound, *sm_archs = expected
    assert sorted(variant.properties) == sorted([f"nvidia :: cuda_version_lower_bound :: {lower_bound}",
                                                 *(f"nvidia :: sm_arch :: {v}" for v in sm_archs)])
    # variantlib reads them back as the same properties of a valid variant
    parsed = [VariantProperty.from_str(p) for p in variant.properties]
    assert VariantDescription(parsed, label=variant.label) == variant.description


def test_the_label_is_the_cuda_and_the_hash_of_the_properties_so_one_set_has_one_label():
    variant = variants.describe({"cuda": "cu130", "expected_archs": "8.0;9.0+PTX"})
    assert variant.label == f"cu130_{VariantDescription(variant.description.properties).hexdigest[:8]}"
    assert len(variant.label) <= 16 and variant.label.startswith("cu130_")
    # the same archs written otherwise: the same label; other archs: another
    assert variants.describe({"cuda": "cu130", "expected_archs": "9.0+PTX 8.0"}).label == variant.label
    assert variants.describe({"cuda": "cu130", "expected_archs": "8.0;9.0"}).label != variant.label
    assert variants.describe({"cuda": "cu128", "expected_archs": "8.0;9.0+PTX"}).label.startswith("cu128_")


@pytest.mark.parametrize(("entry", "says"), [
    ({"expected_archs": "8.0"}, "cuda None is not cuXYZ"),
    ({"cuda": "cpu", "expected_archs": "8.0"}, "cuda 'cpu' is not cuXYZ"),
    ({"cuda": "cu1300", "expected_archs": "8.0"}, "is not cuXYZ"),
    ({"cuda": 130, "expected_archs": "8.0"}, "is not cuXYZ"),
    ({"cuda": "cu130"}, "no expected_archs"),
    ({"cuda": "cu130", "expected_archs": ["8.0"]}, "no expected_archs"),
    ({"cuda": "cu130", "expected_archs": "8.0;\x1b[31mevil"}, "expected_archs: unknown GPU architecture"),
])
def test_a_manifest_entry_without_a_cuda_or_targets_gets_no_variant_and_says_why_on_one_line(entry, says):
    with pytest.raises(variants.NoVariant) as caught:
        variants.describe(entry)
    assert says in str(caught.value) and "\n" not in str(caught.value) and "\x1b" not in str(caught.value)


# -------------------------------------------------------------------------------------------- variantlib


def test_variantlib_reads_the_variants_json_and_the_wheels_variant_json():
    first = variants.describe({"cuda": "cu130", "expected_archs": "8.0;9.0+PTX"})
    second = variants.describe({"cuda": "cu130", "expected_archs": "12.0"})
    document = VariantsJson(json.loads(variants.variants_json([second, first, first])))
    assert document.namespace_priorities == ["nvidia"]
    assert document.providers["nvidia"].requires == ["nvidia-variant-provider>=0.0.2,<1.0.0"]
    assert document.providers["nvidia"].plugin_api == "nvidia_variant_provider.plugin:NvidiaVariantPlugin"
    assert document.variants == {first.label: first.description, second.label: second.description}

    dist_info = VariantDistInfo(variants.dist_info_json(first), expected_label=first.label)
    assert dist_info.variant_desc == first.description and dist_info.providers == document.providers
    with pytest.raises(ValidationError):
        VariantDistInfo(variants.dist_info_json(first), expected_label=second.label)


def test_two_property_sets_under_one_label_are_refused():
    first = variants.describe({"cuda": "cu130", "expected_archs": "8.0"})
    other = variants.WheelVariant(first.label, VariantDescription([VariantProperty("nvidia", "sm_arch", "90_real")],
                                                                  label=first.label))
    with pytest.raises(variants.NoVariant, match="names two property sets"):
        variants.variants_json([first, other])


# What the WheelNext NVIDIA plugin (nvidia_variant_provider 0.0.2) reports as supported, by its rule: CUDA lower
# bounds from the driver's version down, and for a GPU of capability X.Y, XY_real down to X0_real and X0_virtual.
def plugin_says(driver: tuple[int, int], gpu: tuple[int, int]) -> list[VariantProperty]:
    lower = [f"{major}.{minor}" for major in range(driver[0], 10, -1)
             for minor in range(driver[1] if major == driver[0] else 20, -1, -1)]
    sm = [f"{gpu[0]}{minor}_real" for minor in range(gpu[1], -1, -1)] + [f"{gpu[0]}0_virtual"]
    return ([VariantProperty("nvidia", "cuda_version_lower_bound", v) for v in lower]
            + [VariantProperty("nvidia", "sm_arch", v) for v in sm])


@pytest.mark.parametrize(("driver", "gpu", "chosen"), [
    ((13, 0), (9, 0), "hopper"),  # H100 on a CUDA 13 driver
    ((13, 0), (8, 9), "ampere"),  # an L4: the sm_80 cubin of the 8.0;8.6 build runs on 8.9
    ((12, 8), (9, 0), None),  # a CUDA 12.8 driver runs no CUDA 13.0 build
    ((13, 0), (12, 0), "blackwell_ptx"),  # RTX 5090: SASS for 12.0 in one build only
    ((13, 0), (10, 0), None),  # B200: no 10.x SASS, and the plugin takes only PTX of 10.0
])
def test_variantlibs_resolver_picks_the_variant_the_machine_runs(driver, gpu, chosen):
    built = {"hopper": variants.describe({"cuda": "cu130", "expected_archs": "8.0;9.0"}),
             "ampere": variants.describe({"cuda": "cu130", "expected_archs": "8.0;8.6"}),
             "blackwell_ptx": variants.describe({"cuda": "cu130", "expected_archs": "12.0+PTX"}),
             "arch_specific": variants.describe({"cuda": "cu130", "expected_archs": "9.0a"})}
    document = VariantsJson(json.loads(variants.variants_json(built.values())))
    ranked = sort_and_filter_supported_variants(list(document.variants.values()), plugin_says(driver, gpu),
                                                namespace_priorities=document.namespace_priorities)
    labels = [v.label for v in ranked if not v.is_null_variant()]
    assert labels[:1] == ([built[chosen].label] if chosen else [])
    # 90a_real is what the wheel carries but no value the plugin reports: never chosen, the plain wheel is
    assert built["arch_specific"].label not in labels


# -------------------------------------------------------------------------------------------- the wheel


def record_rows(zf: zipfile.ZipFile) -> dict[str, tuple[str, str]]:
    (record,) = [n for n in zf.namelist() if n.endswith(".dist-info/RECORD")]
    return {row[0]: (row[1], row[2]) for row in csv.reader(io.StringIO(zf.read(record).decode()))}


def check_variant_wheel(variant: Path, plain: Path, label: str) -> None:
    """``variant`` is ``plain`` with variant.json added: zipfile tests it clean, RECORD lists every member
    with its hash, every member of ``plain`` is there with the same bytes (compressed ones too), and
    variantlib reads its variant.json under the label in its file name."""
    assert variant.name == f"{plain.name[:-4]}-{label}.whl"
    assert VALIDATION_WHEEL_NAME_REGEX.fullmatch(variant.name).group("variant_label") == label
    tested = subprocess.run([sys.executable, "-m", "zipfile", "-t", str(variant)], capture_output=True, text=True)
    assert tested.returncode == 0 and "Done testing" in tested.stdout, tested.stdout + tested.stderr
    with zipfile.ZipFile(variant) as zf, zipfile.ZipFile(plain) as original:
        assert zf.testzip() is None
        rows = record_rows(zf)
        assert set(rows) == set(zf.namelist())
        for name, (digest, size) in rows.items():
            if name.endswith("/RECORD"):
                assert (digest, size) == ("", "")
                continue
            data = zf.read(name)
            expected = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert (digest, size) == (expected, str(len(data))), name
        old_rows = record_rows(original)
        for info in original.infolist():
            assert rows[info.filename] == old_rows[info.filename]
            if info.filename.endswith("/RECORD"):
                continue
            copied = zf.getinfo(info.filename)
            assert (copied.CRC, copied.compress_size, copied.compress_type) == (info.CRC, info.compress_size,
                                                                                info.compress_type)
            assert zf.read(info.filename) == original.read(info.filename)
            # the member's local entry (header and compressed bytes) is the original's, byte for byte
            assert _local_entry(variant, copied) == _local_entry(plain, info)
        (dist_info,) = {n.split("/")[0] for n in zf.namelist() if ".dist-info/" in n}
        added = set(zf.namelist()) - set(original.namelist())
        assert added == {f"{dist_info}/variant.json"}
        VariantDistInfo(zf.read(f"{dist_info}/variant.json"), expected_label=label)


def _local_entry(path: Path, info: zipfile.ZipInfo) -> bytes:
    header = 30 + len(info.orig_filename.encode()) + len(info.extra)
    with path.open("rb") as fh:
        fh.seek(info.header_offset)
        return fh.read(header + info.compress_size)


def test_the_variant_wheel_is_the_verified_wheel_with_its_variant_json(tmp_path):
    variant = variants.describe({"cuda": "cu130", "expected_archs": "8.0;9.0+PTX"})
    spliced = variants.splice(WHEEL, wheelhouse.sha256(WHEEL), TINY, variants.dist_info_json(variant))
    path = tmp_path / variants.variant_wheel_name(WHEEL.name, variant.label)
    with path.open("wb") as fh:
        digest = spliced.write_to(fh)
    assert digest == sha256(path) and path.stat().st_size == spliced.size
    check_variant_wheel(path, WHEEL, variant.label)
    assert spliced.is_written_at(path)
    # the same plan again writes the same bytes (nothing from the clock or the order of a dict)
    again = variants.splice(WHEEL, wheelhouse.sha256(WHEEL), TINY, variants.dist_info_json(variant))
    assert again == spliced


def test_a_wheel_with_record_first_or_a_data_descriptor_still_gets_a_clean_variant(tmp_path):
    """RECORD anywhere (the members after it move up) and members written with data descriptors."""
    plain = tmp_path / "demo-1.0-py3-none-any.whl"
    members = {"demo/__init__.py": b"x = 1\n" * 100, "demo/data.bin": os.urandom(5000)}
    dist_info = "demo-1.0.dist-info"
    members[f"{dist_info}/METADATA"] = b"Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n"
    rows = [f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}"
            for n, d in members.items()]
    record = ("\n".join([*rows, f"{dist_info}/RECORD,,"])).encode()  # no final newline
    with open(plain, "wb") as raw:
        unseekable = _Unseekable(raw)  # zipfile writes data descriptors where it cannot seek back
        with zipfile.ZipFile(unseekable, "w", zipfile.ZIP_DEFLATED) as zf:
            zf.writestr(f"{dist_info}/RECORD", record)
            for name, data in members.items():
                zf.writestr(name, data)
    with zipfile.ZipFile(plain) as zf:
        assert all(i.flag_bits & 0x08 for i in zf.infolist())
    variant = variants.describe({"cuda": "cu128", "expected_archs": "12.0"})
    spliced = variants.splice(plain, sha256(plain), "demo", variants.dist_info_json(variant))
    path = tmp_path / variants.variant_wheel_name(plain.name, variant.label)
    with path.open("wb") as fh:
        spliced.write_to(fh)
    check_variant_wheel(path, plain, variant.label)


class _Unseekable(io.RawIOBase):
    def __init__(self, fh):
        self.fh = fh
        self.position = 0

    def writable(self):
        return True

    def write(self, data):
        self.position += len(data)
        return self.fh.write(data)

    def tell(self):
        return self.position

    def seekable(self):
        return False

    def flush(self):
        self.fh.flush()


def test_a_zip_it_cannot_copy_member_by_member_gets_no_variant_and_a_reason(tmp_path):
    variant = variants.describe({"cuda": "cu130", "expected_archs": "8.0"})
    prepended = tmp_path / WHEEL.name
    prepended.write_bytes(b"#!/bin/sh\n" + WHEEL.read_bytes())  # zipfile still reads it; its offsets are off
    with pytest.raises(variants.NoVariant, match="bytes between|first byte"):
        variants.splice(prepended, sha256(prepended), TINY, variants.dist_info_json(variant))
    with pytest.raises(variants.NoVariant, match="already holds"):
        already = tmp_path / "already" / WHEEL.name
        already.parent.mkdir()
        spliced = variants.splice(WHEEL, sha256(WHEEL), TINY, variants.dist_info_json(variant))
        with already.open("wb") as fh:
            spliced.write_to(fh)
        variants.splice(already, sha256(already), TINY, variants.dist_info_json(variant))
    broken = tmp_path / "broken" / WHEEL.name
    broken.parent.mkdir()
    broken.write_bytes(WHEEL.read_bytes()[:-30])
    with pytest.raises(variants.NoVariant):
        variants.splice(broken, sha256(broken), TINY, variants.dist_info_json(variant))


def test_a_source_that_is_not_the_verified_wheel_any_more_is_not_copied(tmp_path):
    variant = variants.describe({"cuda": "cu130", "expected_archs": "8.0"})
    spliced = variants.splice(WHEEL, "0" * 64, TINY, variants.dist_info_json(variant))  # another sha256
    with pytest.raises(variants.NoVariant, match="changed while"):
        spliced.write_to(io.BytesIO())


# -------------------------------------------------------------------------------------------- the index


def test_the_index_links_each_wheels_variant_and_the_versions_variants_json(tmp_path):
    out, tiny = house(tmp_path)
    pure = place(out, pure_tiny(tmp_path), "others/pure", expected_archs="12.0")
    result = index.write_index(out, variants=True, say=_quiet)
    assert result.problems == []
    cuda_hopper = variants.describe({"cuda": "cu130", "expected_archs": "8.0;9.0+PTX"})
    blackwell = variants.describe({"cuda": "cu130", "expected_archs": "12.0"})
    folder = out / "simple" / TINY
    tiny_variant = folder / variants.variant_wheel_name(tiny.name, cuda_hopper.label)
    pure_variant = folder / variants.variant_wheel_name(pure.name, blackwell.label)
    assert result.variants == {TINY: sorted([tiny_variant.name, pure_variant.name, VARIANTS_JSON])}
    assert result.projects == {TINY: sorted([tiny.name, pure.name])}  # the plain wheels, as ever

    check_variant_wheel(tiny_variant, tiny, cuda_hopper.label)
    check_variant_wheel(pure_variant, pure, blackwell.label)
    for variant_wheel, plain in ((tiny_variant, tiny), (pure_variant, pure)):
        metadata = variant_wheel.with_name(variant_wheel.name + ".metadata")
        assert metadata.read_bytes() == plain.with_name(plain.name + ".metadata").read_bytes()

    # variantlib's own index generator, run on the variant wheels, makes the same variants.json
    generated = tmp_path / "generated"
    generated.mkdir()
    for variant_wheel in (tiny_variant, pure_variant):
        (generated / variant_wheel.name).write_bytes(variant_wheel.read_bytes())
    generate_index_json(["-d", str(generated)])
    ours = json.loads((folder / VARIANTS_JSON).read_text())
    assert json.loads((generated / VARIANTS_JSON).read_text()) == ours
    assert VariantsJson(ours).variants == {cuda_hopper.label: cuda_hopper.description,
                                           blackwell.label: blackwell.description}

    # each page links every file with its hash; plain wheels where they are, the rest beside the page
    for page in (folder / "index.html", out / "index.html"):
        linked = links(page)
        assert set(linked) == {tiny.name, pure.name, tiny_variant.name, pure_variant.name, VARIANTS_JSON}
        for name, (path, digest) in linked.items():
            assert path.is_file() and digest == sha256(path), name
        assert linked[tiny.name][0] == tiny and linked[VARIANTS_JSON][0] == folder / VARIANTS_JSON
    document = json.loads((folder / "index.json").read_text())
    assert document["versions"] == [VERSION]
    for file in document["files"]:
        path = Path(os.path.normpath(folder / unquote(file["url"])))
        assert file["hashes"] == {"sha256": sha256(path)} and file["size"] == path.stat().st_size
        assert ("core-metadata" in file) == file["filename"].endswith(".whl")


def test_a_second_run_rewrites_nothing_and_keeps_the_variants_until_asked_off(tmp_path):
    out, tiny = house(tmp_path)
    plain_pages = {}
    index.write_index(out, say=_quiet)
    for page in (out / "index.html", out / "simple" / TINY / "index.html", out / "simple" / TINY / "index.json"):
        plain_pages[page] = page.read_bytes()
    first = index.write_index(out, variants=True, say=_quiet)
    assert len(first.written) == 6 and first.removed == []  # the variant wheel, its metadata, variants.json, 3 pages
    before = stamps(out)

    again = index.write_index(out, say=_quiet)  # as build --index runs it: variants are kept
    assert again.written == [] and again.removed == [] and again.variants == first.variants
    assert stamps(out) == before
    assert index.write_index(out, variants=True, say=_quiet).written == []
    assert stamps(out) == before

    # another wheel: its variant and the pages are written, the first variant wheel is left as it is
    place(out, pure_tiny(tmp_path), "others/pure", expected_archs="12.0")
    third = index.write_index(out, say=_quiet)
    (variant_wheel,) = [p for p in (out / "simple" / TINY).glob("*-cu130_*.whl") if "py3-none-any" not in p.name]
    assert variant_wheel not in third.written and stamps(out)[variant_wheel] == before[variant_wheel]
    assert len(third.variants[TINY]) == 3

    off = index.write_index(out, variants=False, say=_quiet)
    assert off.variants == {} and variant_files(out) == []
    assert len(off.removed) == 5  # two variant wheels, their metadata files, variants.json
    assert index.write_index(out, say=_quiet).variants == {}  # and they stay off
    (out / "others").joinpath("pure", f"tiny_kernel-{VERSION}-py3-none-any.whl").unlink()
    index.write_index(out, say=_quiet)
    for page, text in plain_pages.items():  # the pages of a plain index again
        assert page.read_bytes() == text


def test_a_rebuilt_wheel_gets_a_new_variant_and_the_old_one_goes(tmp_path):
    out, tiny = house(tmp_path)
    first = index.write_index(out, variants=True, say=_quiet)
    (old,) = [n for n in first.variants[TINY] if n.endswith(".whl")]
    # the same cell built again for other archs (--force): a new manifest entry, so a new label
    collect.place(out, tiny_cell(), WHEEL, inputs="again", record={"expected_archs": "9.0a"})
    second = index.write_index(out, say=_quiet)
    hopper = variants.describe({"cuda": "cu130", "expected_archs": "9.0a"})
    new = variants.variant_wheel_name(tiny.name, hopper.label)
    assert second.variants == {TINY: sorted([new, VARIANTS_JSON])}
    assert out / "simple" / TINY / old in second.removed and not (out / "simple" / TINY / old).exists()
    assert set(links(out / "simple" / TINY / "index.html")) == {tiny.name, new, VARIANTS_JSON}
    assert list(VariantsJson(json.loads((out / "simple" / TINY / VARIANTS_JSON).read_text())).variants) == [
        hopper.label]


def test_a_variant_wheel_changed_on_disk_is_written_again_or_refused_on_its_hash(tmp_path):
    out, _ = house(tmp_path)
    first = index.write_index(out, variants=True, say=_quiet)
    (variant_wheel,) = [out / "simple" / TINY / n for n in first.variants[TINY] if n.endswith(".whl")]
    good = variant_wheel.read_bytes()
    variant_wheel.write_bytes(good[:-10] + b"0123456789")  # its central directory's end: not what it should be
    again = index.write_index(out, say=_quiet)
    assert variant_wheel in again.written and variant_wheel.read_bytes() == good
    assert links(out / "simple" / TINY / "index.html")[variant_wheel.name][1] == sha256(variant_wheel)
    # damaged in the middle, where a member's bytes are: listed with the hash it should have, which pip checks
    variant_wheel.write_bytes(good[:100] + b"garbage" + good[107:])
    assert index.write_index(out, say=_quiet).written == []
    assert links(out / "simple" / TINY / "index.html")[variant_wheel.name][1] == hashlib.sha256(good).hexdigest()


def test_a_wheel_without_a_variant_is_said_and_listed_as_it_is(tmp_path):
    out, tiny = house(tmp_path, expected_archs=None)
    said: list[str] = []
    result = index.write_index(out, variants=True, say=said.append)
    assert said == [f"warning: {shown(tiny)}: no wheel variant (its manifest entry has no expected_archs (the GPU targets"
                    " verification found)); listed without one"]
    assert result.projects == {TINY: [tiny.name]} and result.variants == {} and variant_files(out) == []
    assert set(links(out / "simple" / TINY / "index.html")) == {tiny.name}


def test_variant_links_are_absolute_under_a_base_url(tmp_path):
    out, _ = house(tmp_path)
    result = index.write_index(out, base_url="https://wheels.example.com/house", variants=True, say=_quiet)
    parser = _Anchors()
    parser.feed((out / "simple" / TINY / "index.html").read_text())
    hrefs = {text: href for href, text in parser.anchors}
    for name in result.variants[TINY]:
        assert hrefs[name].startswith(f"https://wheels.example.com/house/simple/{TINY}/")


def test_what_a_killed_run_left_and_a_stale_projects_variants_are_removed(tmp_path):
    out, _ = house(tmp_path)
    other = place(out, pure_wheel(tmp_path / "src" / "other-1.0-py3-none-any.whl", {"other/__init__.py": ""},
                                  name="other"), "others/a")
    index.write_index(out, variants=True, say=_quiet)
    assert any(p.name.endswith(".whl") for p in (out / "simple" / "other").iterdir())
    partial = out / "simple" / TINY / f".{VARIANTS_JSON}.abc123.partial"
    partial.write_bytes(b"half")
    partial_wheel = out / "simple" / TINY / f".{variants.variant_wheel_name(WHEEL.name, 'cu130_00000000')}.x1.partial"
    partial_wheel.write_bytes(b"half")
    kept = out / "simple" / TINY / "notes.txt"  # not the index's: left alone
    kept.write_text("mine")
    other.unlink()
    result = index.write_index(out, say=_quiet)
    assert not partial.exists() and not partial_wheel.exists() and kept.exists()
    assert not (out / "simple" / "other").exists() and out / "simple" / "other" in result.removed


# -------------------------------------------------------------------------------------------- the command


def test_the_command_says_what_variants_it_wrote_and_no_variants_removes_them(tmp_path, capsys):
    out, _ = house(tmp_path)
    assert call(indexing.cmd_index, "index", out, "--variants") == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert captured.out.splitlines()[:2] == [
        f"indexed 1 wheel of 1 project ({TINY}) in {out} (13 files written, 0 removed)",
        "  wheel variants (PEP 817/825): 1 variant wheel and 1 variants.json beside the project pages, for a"
        " variant-aware installer; plain pip skips them"]
    assert call(indexing.cmd_index, "index", out, "--no-variants", "--json") == 0
    report = json.loads(capsys.readouterr().out)
    assert report["variants"] == {} and len(report["removed"]) == 3 and variant_files(out) == []


def test_variants_without_variantlib_are_one_line_and_write_nothing(tmp_path, capsys, monkeypatch):
    out, _ = house(tmp_path)
    for name in [n for n in sys.modules if n == "variantlib" or n.startswith("variantlib.")]:
        monkeypatch.setitem(sys.modules, name, None)  # importing it fails as if it were not installed
    monkeypatch.delitem(sys.modules, "imagegen.publish.variants")
    monkeypatch.delattr(imagegen.publish, "variants")
    with pytest.raises(PublishError, match="pip install 'imagegen-wheels\\[publish\\]'"):
        index.write_index(out, variants=True, say=_quiet)
    assert not (out / "simple").exists()
    assert cli.main(["index", str(out), "--variants"]) == 9
    assert capsys.readouterr().err == ("imagegen: error: wheel variants need variantlib, which is not installed: pip"
                                       " install 'imagegen-wheels[publish]' (or imagegen index --no-variants)\n")
    assert cli.main(["index", str(out)]) == 0  # the plain index needs no variantlib
