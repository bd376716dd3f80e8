"""imagegen verify on a real Windows wheel: NVIDIA's nvjpeg 12.4 for win_amd64 from PyPI (4 MB), whose
nvjpeg64_12.dll carries its kernels in the PE section `.nv_fatb`. The reader's listing is checked
against the real cuobjdump's listing of that section's bytes written out as a .fatbin file (Linux's
cuobjdump finds no device code in the PE image itself)."""

from __future__ import annotations

import io
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from imagegen.finish import fatbin
from imagegen.model.arch_parse import parse_arch_list
from imagegen.shipped.builder.imagegen_wheeltools import find_cuobjdump
from imagegen.finish.verify import verify_wheel

pytestmark = pytest.mark.integration

WHEEL = "nvidia-nvjpeg-cu12==12.4.0.76"
DLL = "nvidia/nvjpeg/bin/nvjpeg64_12.dll"


@pytest.fixture(scope="module")
def windows_wheel(tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("win")
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                           "--platform", "win_amd64", WHEEL, "-d", str(dest)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = dest.glob("*.whl")
    return wheel


def test_a_real_windows_dll_is_read_like_cuobjdump_reads_its_fat_binary(windows_wheel, tmp_path):
    data = zipfile.ZipFile(windows_wheel).read(DLL)
    where = fatbin.fatbin_section(fatbin.pe_section_table(io.BytesIO(data), len(data)))
    assert where is not None
    raw = tmp_path / "nvjpeg.fatbin"
    raw.write_bytes(data[where[0]:where[0] + where[1]])
    exe = find_cuobjdump()
    assert exe, "the test extra installs nvidia-cuda-cuobjdump"
    listed = fatbin.cuobjdump_entries(raw, exe)
    ours = fatbin.read_so(data)
    assert len(listed) > 100 and sorted((e.kind, e.arch) for e in ours) == sorted((e.kind, e.arch) for e in listed)

    report = verify_wheel(windows_wheel, parse_arch_list("8.0;9.0;12.0"))
    assert report.ok, report.problems
    (dll,) = report.extensions
    assert dll.name == DLL and {"sm_80", "sm_90", "sm_120", "compute_121"} <= set(dll.archs)
    report = verify_wheel(windows_wheel, parse_arch_list("12.0+PTX"))
    assert report.problems == [f"{DLL} lacks compute_120 (has {', '.join(dll.archs)})"]
