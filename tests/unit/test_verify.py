"""imagegen verify tells the truth: each arch once per extension however many translation units
carry it, and archs present but not requested said in one line (a warning, or a failure with
--strict). The shared objects are real ELF files with a .nv_fatbin section: nvcc's own fatbin
containers from the fixture wheel, repeated as a linker concatenates one per translation unit, or
containers written here for arbitrary archs."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.version import Version

from imagegen.model.cell_rules import expected_archs
from imagegen.finish.fatbin import FATBIN_MAGIC, KIND_ELF, KIND_PTX, FatbinEntry, elf_sections, read_so
from imagegen.model.arch_parse import parse_arch_list
from imagegen.model.catalogue import load_catalogue
from imagegen.finish.verify import SoReport, VerifyError, expected_for_wheel, verify_wheel

ROOT = Path(__file__).resolve().parents[2]
FIXTURE_WHEEL = next((ROOT / "tests" / "fixtures" / "wheels").glob("tiny_kernel-*.whl"))
SO_NAME = "demo_kernel/_C.cpython-311-x86_64-linux-gnu.so"


# ------------------------------------------------------------------------------ helpers (shared)


def elf_so(sections: dict[str, bytes]) -> bytes:
    """A 64-bit little-endian ELF shared object holding ``sections`` (plus .shstrtab)."""
    names = [""] + list(sections) + [".shstrtab"]
    shstrtab = b"".join(n.encode() + b"\0" for n in names)
    offsets = [sum(len(n) + 1 for n in names[:i]) for i in range(len(names))]
    body = bytearray(64)
    placed = []  # (offset, size) of each section's bytes
    for data in [*sections.values(), shstrtab]:
        body += b"\0" * (-len(body) % 16)
        placed.append((len(body), len(data)))
        body += data
    body += b"\0" * (-len(body) % 8)
    shoff = len(body)
    headers = bytearray(64)  # SHT_NULL
    for i, (off, size) in enumerate(placed, start=1):
        stype = 3 if i == len(placed) else 1  # SHT_STRTAB for .shstrtab, SHT_PROGBITS otherwise
        headers += struct.pack("<IIQQQQIIQQ", offsets[i], stype, 0, 0, off, size, 0, 0, 16 if stype == 1 else 1, 0)
    body += headers
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + b"\0" * 8
    header = ident + struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, shoff, 0, 64, 0, 0, 64, len(names), len(names) - 1)
    body[:64] = header
    return bytes(body)


def fatbin_container(*entries: str) -> bytes:
    """One fatbin container (what nvcc embeds per translation unit) with an entry per name:
    ``sm_80`` a cubin, ``compute_90a`` PTX whose ``.target`` carries the variant."""
    blob = b""
    for name in entries:
        kind, code = name.split("_")
        number = int(code.rstrip("af"))
        if kind == "sm":
            payload = b"\x7fELF" + b"\0" * 60  # stands in for the cubin; the reader does not parse it
        else:
            payload = f".version 8.8\n.target sm_{code}\n.address_size 64\n".encode()
        payload += b"\0" * (-len(payload) % 8)
        header = bytearray(64)
        struct.pack_into("<HHIQ", header, 0, KIND_ELF if kind == "sm" else KIND_PTX, 0x0101, 64, len(payload))
        struct.pack_into("<I", header, 28, number)
        struct.pack_into("<Q", header, 40, 0)
        blob += bytes(header) + payload
    return struct.pack("<IHHQ", FATBIN_MAGIC, 1, 16, len(blob)) + blob


def real_fatbin() -> bytes:
    """The .nv_fatbin section nvcc wrote into the fixture wheel's extension (sm_80, sm_90, compute_90)."""
    with zipfile.ZipFile(FIXTURE_WHEEL) as zf:
        so = next(n for n in zf.namelist() if n.endswith(".so"))
        return elf_sections(zf.read(so))[".nv_fatbin"]


def make_wheel(folder: Path, fatbins: dict[str, bytes], *, dist: str = "demo_kernel", extra: dict[str, str] | None = None) -> Path:
    """A wheel with one shared object per ``fatbins`` item (its path in the wheel -> .nv_fatbin bytes)."""
    wheel = folder / f"{dist}-1.0-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, fatbin in fatbins.items():
            zf.writestr(name, elf_so({".text": b"\x90" * 16, ".nv_fatbin": fatbin}))
        for name, text in (extra or {}).items():
            zf.writestr(name, text)
        zf.writestr(f"{dist}-1.0.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
        zf.writestr(f"{dist}-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: cp311-cp311-linux_x86_64\n")
    return wheel


def imagegen(*argv, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """`python -m imagegen ...` in a fresh process (this checkout first on the path)."""
    full = dict(os.environ, **(env or {}))
    full["PYTHONPATH"] = os.pathsep.join([str(ROOT), *([full["PYTHONPATH"]] if full.get("PYTHONPATH") else [])])
    return subprocess.run([sys.executable, "-m", "imagegen", *map(str, argv)], capture_output=True, text=True,
                          cwd=cwd or ROOT, env=full, timeout=300)


# The CLI reads cuobjdump's listing too when one is installed; the hand-written containers carry no
# real cubins for it, so the CLI cases here run with IMAGEGEN_CUOBJDUMP=none (the library cases pass None).
no_cuobjdump = pytest.mark.usefixtures("without_cuobjdump")


# ---------------------------------------------------------------------------------- the helpers


def test_the_helpers_write_what_the_reader_and_readelf_read():
    so = elf_so({".nv_fatbin": fatbin_container("sm_80", "compute_90a")})
    assert [(e.kind, e.arch, e.variant) for e in read_so(so)] == [("sass", 80, None), ("ptx", 90, "a")]
    readelf = shutil.which("readelf")
    if readelf:  # binutils agrees that it is an ELF shared object with that section
        path = Path(os.environ.get("TMPDIR", "/tmp")) / f"imagegen-test-{os.getpid()}.so"
        path.write_bytes(so)
        try:
            out = subprocess.run([readelf, "-h", "-S", str(path)], capture_output=True, text=True).stdout
        finally:
            path.unlink()
        assert "DYN (Shared object file)" in out and ".nv_fatbin" in out


# ---------------------------------------------------------------------------------- the library


def test_repeated_containers_list_each_arch_once(tmp_path):
    # Three translation units, each with nvcc's real sm_80 + sm_90 + compute_90 container.
    wheel = make_wheel(tmp_path, {SO_NAME: real_fatbin() * 3})
    report = verify_wheel(wheel, parse_arch_list("8.0;9.0+PTX"), cuobjdump=None)
    (so,) = report.extensions
    assert len(so.entries) == 9
    assert so.archs == ["sm_80", "sm_90", "compute_90"]
    assert so.summary() == "sm_80, sm_90, compute_90"  # equal counts say nothing: left out
    assert report.ok and not report.warnings and so.extra == [] and so.missing == []
    ext = report.as_dict()["extensions"][0]
    assert ext["archs"] == ["sm_80", "sm_90", "compute_90"]
    assert ext["entries"] == {"sm_80": 3, "sm_90": 3, "compute_90": 3}


def test_counts_are_shown_where_they_differ(tmp_path):
    # One file compiled for sm_90 only (a hard-coded -gencode in one source file) among others.
    fatbin = fatbin_container("sm_80", "sm_90") * 2 + fatbin_container("sm_90")
    so = verify_wheel(make_wheel(tmp_path, {SO_NAME: fatbin}), None, cuobjdump=None).extensions[0]
    assert so.summary() == "sm_80 x2, sm_90 x3"


def test_archs_not_requested_are_flagged_once_per_extension(tmp_path):
    fatbin = (fatbin_container("sm_80", "sm_86", "sm_90a", "compute_90a") * 2)
    wheel = make_wheel(tmp_path, {SO_NAME: fatbin, "demo_kernel/_fine.cpython-311-x86_64-linux-gnu.so":
                                  fatbin_container("sm_90a", "compute_90a")})
    report = verify_wheel(wheel, parse_arch_list("9.0a+PTX"), cuobjdump=None)
    flagged, fine = report.extensions
    assert flagged.archs == ["sm_80", "sm_86", "sm_90", "compute_90a"]  # SASS variants need cuobjdump
    assert flagged.extra == ["sm_80", "sm_86"] and flagged.missing == []
    assert fine.extra == [] and fine.missing == []
    line = (f"{SO_NAME} also carries sm_80, sm_86, not requested: the build ignored --arch or compiles a"
            " hard-coded list")
    assert report.warnings == [line]
    assert report.ok, "archs not requested are a warning by default"
    d = report.as_dict()
    assert d["ok"] and d["warnings"] == [line] and [e["extra"] for e in d["extensions"]] == [["sm_80", "sm_86"], []]
    strict = verify_wheel(wheel, parse_arch_list("9.0a+PTX"), cuobjdump=None, strict=True)
    assert not strict.ok and strict.problems == [line] and strict.warnings == []
    assert strict.as_dict()["ok"] is False


def test_missing_still_fails_and_variants_match_exactly(tmp_path):
    wheel = make_wheel(tmp_path, {SO_NAME: fatbin_container("sm_90", "compute_90a") * 2})
    # +PTX for plain 9.0: the PTX is compute_90a (its .target says so): missing, and not what was asked.
    report = verify_wheel(wheel, parse_arch_list("9.0+PTX"), cuobjdump=None)
    (so,) = report.extensions
    assert so.missing == ["compute_90"] and so.extra == ["compute_90a"] and not report.ok
    assert report.problems == [f"{SO_NAME} lacks compute_90 (has sm_90, compute_90a)"]
    # PTX of a requested arch without +PTX is not flagged (flash-attn & co. always embed the newest's).
    assert verify_wheel(wheel, parse_arch_list("9.0a"), cuobjdump=None).warnings == []
    # No coverage inside verify: a request for 8.6 is not met by sm_80 ...
    wheel80 = make_wheel(tmp_path, {SO_NAME: fatbin_container("sm_80")}, dist="other")
    report = verify_wheel(wheel80, parse_arch_list("8.6"), cuobjdump=None)
    assert report.extensions[0].missing == ["sm_86"] and report.extensions[0].extra == ["sm_80"]


def test_a_hard_coded_list_is_flagged_against_the_plans_expected_archs(tmp_path):
    # Block-Sparse-Attention 0.0.1 compiles a fixed list (sm_80, sm_90 from nvcc 11.8) whatever
    # TORCH_CUDA_ARCH_LIST says; the plan expects, for a request of 8.6, the fixed entry that runs there
    # (sm_80). Everything else is not requested.
    version = load_catalogue().get("block-sparse-attn").version("0.0.1")
    fixed = version.arch.fixed_for(Version("12.8"))
    expected = expected_archs(version, parse_arch_list("8.6"), Version("12.8"))
    assert [a.sm for a in expected] == ["sm_80"]
    fatbin = fatbin_container(*(a.sm for a in fixed)) * 4
    report = verify_wheel(make_wheel(tmp_path, {SO_NAME: fatbin}, dist="block_sparse_attn"), expected, cuobjdump=None)
    (so,) = report.extensions
    assert report.ok and so.missing == []
    assert so.extra == [a.sm for a in fixed if a.sm != "sm_80"] == ["sm_90"]
    assert report.warnings[0].startswith(f"{SO_NAME} also carries {', '.join(so.extra)}, not requested")


def test_so_report_without_expectations_flags_nothing(tmp_path):
    report = verify_wheel(make_wheel(tmp_path, {SO_NAME: fatbin_container("sm_80")}), None, cuobjdump=None)
    assert report.ok and report.extensions[0].extra == [] and report.warnings == []
    assert SoReport("x", []).summary() == ""


# -------------------------------------------------------------------------------------- the CLI


@no_cuobjdump
def test_cli_text_lists_archs_once_and_warns_with_exit_0(tmp_path):
    wheel = make_wheel(tmp_path, {SO_NAME: fatbin_container("sm_80", "sm_86", "sm_90a", "compute_90a") * 3})
    proc = imagegen("verify", wheel, "--arch", "9.0a+PTX")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"ok   {wheel.name}"
    assert lines[1] == f"     {SO_NAME}: sm_80, sm_86, sm_90, compute_90a"
    assert lines[2] == (f"     warning: {SO_NAME} also carries sm_80, sm_86, not requested: the build ignored"
                        " --arch or compiles a hard-coded list")
    assert len(lines) == 3 and "x3" not in proc.stdout
    assert proc.stderr.strip() == ("imagegen: warning: 1 of 1 wheels carry archs not requested"
                                   " (--strict makes that a failure)")


@no_cuobjdump
def test_cli_strict_makes_extra_archs_a_failure(tmp_path):
    wheel = make_wheel(tmp_path, {SO_NAME: fatbin_container("sm_80", "sm_86", "sm_90a", "compute_90a") * 2})
    proc = imagegen("verify", wheel, "--arch", "9.0a+PTX", "--strict")
    assert proc.returncode == 6
    assert proc.stdout.splitlines()[0] == f"FAIL {wheel.name}"
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("imagegen: error: 1 of 1 wheels failed verification: ")
    assert "also carries sm_80, sm_86, not requested" in err[0] and "Traceback" not in proc.stderr
    # The same wheel with what it carries requested passes --strict.
    assert imagegen("verify", wheel, "--arch", "8.0;8.6;9.0a+PTX", "--strict").returncode == 0


@no_cuobjdump
def test_cli_json_carries_archs_once_extra_and_warnings(tmp_path):
    wheel = make_wheel(tmp_path, {SO_NAME: fatbin_container("sm_80", "sm_86", "sm_90a", "compute_90a") * 2})
    proc = imagegen("verify", wheel, "--arch", "9.0a+PTX", "--json")
    assert proc.returncode == 0, proc.stderr
    (got,) = json.loads(proc.stdout)
    (ext,) = got["extensions"]
    assert got["ok"] is True and got["problems"] == [] and len(got["warnings"]) == 1
    assert ext["archs"] == ["sm_80", "sm_86", "sm_90", "compute_90a"] and ext["extra"] == ["sm_80", "sm_86"]
    assert ext["missing"] == [] and set(ext["entries"].values()) == {2}
    proc = imagegen("verify", wheel, "--arch", "9.0a+PTX", "--json", "--strict")
    (got,) = json.loads(proc.stdout)
    assert proc.returncode == 6 and got["ok"] is False and got["warnings"] == [] and len(got["problems"]) == 1


@no_cuobjdump
def test_cli_missing_arch_still_exits_6(tmp_path):
    wheel = make_wheel(tmp_path, {SO_NAME: real_fatbin() * 2})
    proc = imagegen("verify", wheel, "--arch", "12.0")
    assert proc.returncode == 6
    assert f"{SO_NAME} lacks sm_120 (has sm_80, sm_90, compute_90)" in proc.stderr


def test_cli_bad_input_is_one_line(tmp_path):
    proc = imagegen("verify", tmp_path / "nope.whl", "--arch", "9.0")
    assert proc.returncode == 2 and proc.stderr.strip() == f"imagegen: error: {tmp_path / 'nope.whl'}: no such wheel file"
    junk = tmp_path / "junk.whl"
    junk.write_bytes(b"x")
    proc = imagegen("verify", junk, "--arch", "9.0")
    assert proc.returncode == 6 and "not a valid wheel file name" in proc.stderr and "Traceback" not in proc.stderr


def test_an_extension_is_held_only_to_the_archs_its_kernels_target(tmp_path):
    # SageAttention's multi-arch wheel: _qattn_sm90 (wgmma) carries sm_90a alone, and that is right
    # when the recipe says its kernels target 9.0a only; without that knowledge it is a missing arch.
    wheel = make_wheel(tmp_path, {"demo_kernel/_all.cpython-311-x86_64-linux-gnu.so": fatbin_container("sm_80", "sm_90a"),
                                  "demo_kernel/_hopper.cpython-311-x86_64-linux-gnu.so": fatbin_container("sm_90a")})
    expected = parse_arch_list("8.0;9.0a")
    plain = verify_wheel(wheel, expected, cuobjdump=None)
    assert not plain.ok and any("_hopper" in p and "sm_80" in p for p in plain.problems)
    knowledge = {"demo_kernel._hopper": parse_arch_list("9.0a")}
    routed = verify_wheel(wheel, expected, cuobjdump=None, extension_archs=knowledge)
    assert routed.ok, routed.problems
    # The knowledge narrows what is required, not what counts: the routed extension must still carry
    # the requested archs its kernels do target.
    other = tmp_path / "other"
    other.mkdir()
    lacking = make_wheel(other, {"demo_kernel/_all.cpython-311-x86_64-linux-gnu.so": fatbin_container("sm_80", "sm_90a"),
                                 "demo_kernel/_hopper.cpython-311-x86_64-linux-gnu.so": fatbin_container("sm_80")})
    bad = verify_wheel(lacking, expected, cuobjdump=None, extension_archs=knowledge)
    assert not bad.ok and any("_hopper" in p and "sm_90a" in p for p in bad.problems)


def test_cli_verify_reads_the_request_the_way_the_recipe_builds_it(tmp_path):
    # Seed 004's request on the wheel imagegen built on the H100 (docs/records/gpu-results/2026-11-24):
    # SageAttention compiles 9.0 as sm_90a, and its routed extensions carry only their archs.
    full = fatbin_container("sm_80", "sm_86", "sm_90a", "sm_120", "compute_120")
    wheel = make_wheel(tmp_path, {
        "sageattention/_fused.cpython-311-x86_64-linux-gnu.so": full,
        "sageattention/_qattn_sm80.cpython-311-x86_64-linux-gnu.so": full,
        "sageattention/_qattn_sm89.cpython-311-x86_64-linux-gnu.so": fatbin_container("sm_90a", "sm_120", "compute_120"),
        "sageattention/_qattn_sm90.cpython-311-x86_64-linux-gnu.so": fatbin_container("sm_90a"),
    }, dist="sageattention")
    proc = imagegen("verify", str(wheel), "--arch", "8.0 8.6 9.0 12.0+PTX", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (got,) = json.loads(proc.stdout)
    assert got["ok"] and not got["problems"] and not got["warnings"]
    # A wheel whose _qattn_sm89 lost sm_120 still fails: the knowledge never excuses a missing arch.
    broken = tmp_path / "broken"
    broken.mkdir()
    bad = make_wheel(broken, {
        "sageattention/_qattn_sm80.cpython-311-x86_64-linux-gnu.so": full,
        "sageattention/_qattn_sm89.cpython-311-x86_64-linux-gnu.so": fatbin_container("sm_90a"),
    }, dist="sageattention")
    proc = imagegen("verify", str(bad), "--arch", "8.0 8.6 9.0 12.0+PTX", cwd=tmp_path)
    assert proc.returncode == 6 and "_qattn_sm89" in proc.stderr and "sm_120" in proc.stderr


# ------------------------------------------------------- the fixture wheel, bad wheels

MOVED_WHEEL = next((Path(__file__).parent.parent / "fixtures" / "wheels").glob("tiny_kernel-*.whl"))


def test_missing_arch_fails_verification():
    report = verify_wheel(MOVED_WHEEL, parse_arch_list("8.6;9.0;12.0+PTX"), cuobjdump=None)
    assert not report.ok
    assert "lacks sm_86, sm_120, compute_120" in report.problems[0]


def test_bad_wheel_names_and_files(tmp_path):
    bad = tmp_path / "not-a-wheel.whl"
    bad.write_bytes(b"x")
    with pytest.raises(VerifyError):
        verify_wheel(bad, None)
    junk = tmp_path / "pkg-1.0-cp311-cp311-linux_x86_64.whl"
    junk.write_bytes(b"not a zip")
    with pytest.raises(VerifyError, match="not a readable wheel"):
        verify_wheel(junk, None)


def test_so_summary_lists_repeated_entries_once():
    # More in tests/unit/test_verify.py (counts where they differ, archs not requested).
    so = verify_wheel(MOVED_WHEEL, parse_arch_list("8.0")).extensions[0]
    doubled = SoReport(so.name, so.entries + so.entries)
    assert doubled.summary() == so.summary() == "sm_80, sm_90, compute_90"
    assert doubled.counts() == {"sm_80": 2, "sm_90": 2, "compute_90": 2}
    assert isinstance(so.entries[0], FatbinEntry)



# ------------------------------------------------------------------------------ the processor of the code


def retagged(folder: Path, wheel: Path, platform: str, *, elf_machine: int | None = None) -> Path:
    """``wheel`` copied under another platform tag, each extension's ELF e_machine set to ``elf_machine``."""
    name = wheel.name.rsplit("-", 1)[0] + f"-{platform}.whl"
    out = folder / name
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            if elf_machine is not None and info.filename.endswith(".so"):
                data = data[:0x12] + struct.pack("<H", elf_machine) + data[0x14:]
            dst.writestr(info, data)
    return out


def test_the_real_wheels_code_is_the_processor_its_tag_names():
    report = verify_wheel(FIXTURE_WHEEL, parse_arch_list("8.0"), cuobjdump=None)
    assert not [p for p in report.problems if "code, but" in p]


def test_x86_64_code_in_a_wheel_tagged_aarch64_is_a_problem(tmp_path):
    wheel = retagged(tmp_path, FIXTURE_WHEEL, "linux_aarch64")
    report = verify_wheel(wheel, parse_arch_list("8.0"), cuobjdump=None)
    assert not report.ok
    assert any(p.endswith(".so is x86_64 code, but the wheel's platform tag says aarch64") for p in report.problems)


def test_aarch64_code_passes_under_an_aarch64_tag_and_fails_under_x86_64(tmp_path):
    # EM_AARCH64 (183): what the arm64 build under QEMU produced (docs/records/verification.md, linux/arm64)
    arm = retagged(tmp_path, FIXTURE_WHEEL, "manylinux_2_28_aarch64", elf_machine=183)
    assert not [p for p in verify_wheel(arm, parse_arch_list("8.0"), cuobjdump=None).problems if "code, but" in p]
    wrong = retagged(tmp_path / "x", FIXTURE_WHEEL, "linux_x86_64", elf_machine=183) if (tmp_path / "x").mkdir() is None else None
    problems = verify_wheel(wrong, parse_arch_list("8.0"), cuobjdump=None).problems
    assert any("is aarch64 code, but the wheel's platform tag says x86_64" in p for p in problems)


def test_an_unknown_processor_is_named_by_its_number(tmp_path):
    odd = retagged(tmp_path, FIXTURE_WHEEL, "linux_x86_64", elf_machine=243)  # EM_RISCV
    problems = verify_wheel(odd, None, cuobjdump=None).problems
    assert any("is ELF machine 243 code" in p for p in problems)


def test_expected_for_wheel_maps_the_request_the_way_the_package_compiles_it():
    cat = load_catalogue()
    archs = parse_arch_list

    def view(name, request):
        expected, knowledge = expected_for_wheel(cat, Path(name), archs(request))
        return str(expected), {k: str(v) for k, v in knowledge.items()}

    # flash-attn's numeric knob builds 8.6 as the sm_80 cubin.
    assert view("flash_attn-2.8.3-cp312-cp312-linux_x86_64.whl", "8.6;9.0") == ("8.0;9.0", {})
    # SageAttention emits 9.0 as sm_90a, and its extensions have their own arch lists.
    expected, knowledge = view("sageattention-2.2.0+cu128torch2.8-cp312-cp312-linux_x86_64.whl", "8.0;9.0")
    assert expected == "8.0;9.0a" and knowledge["sageattention._qattn_sm90"] == "9.0a"
    # A version no recipe labels: the default version's view.
    assert view("sageattention-9.9-cp312-cp312-linux_x86_64.whl", "9.0")[0] == "9.0a"
    # Unknown distribution, a name that is no wheel name, no catalogue: the request as written.
    assert view("tiny_kernel-0.1.0-cp311-cp311-linux_x86_64.whl", "8.6") == ("8.6", {})
    assert view("flash_attn-main-x.whl", "8.6") == ("8.6", {})
    assert expected_for_wheel(None, Path("flash_attn-2.8.3-cp312-cp312-linux_x86_64.whl"), archs("8.6")) \
        == (archs("8.6"), {})
