"""The GPU-access command lines of imagegen.executors.gpu_access, run by the real Docker engine.

There is no GPU here, so the host is made under tmp_path as in tests/unit/test_gpu_access.py: real
character device nodes with the NVIDIA names (over /dev/null's numbers) and the driver's library
folder. What the engine must do with the flags is what it does on a GPU host: create the device
nodes in the container, mount the driver read-only where CUDA images look, set the library path.
The same flags gave PyTorch the H100 on the device (docs/records/verification.md, "GPU in containers")."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from imagegen.executors import gpu_access
from tests.unit.test_gpu_access import gpu_host, ldconfig_for

BASE_IMAGE = os.environ.get("IMAGEGEN_TEST_BASE_IMAGE", "imagegen-test/python:3.11-bookworm")

pytestmark = pytest.mark.integration

INSIDE = ("set -e; for n in nvidiactl nvidia-uvm nvidia-uvm-tools nvidia0 nvidia1; do test -c /dev/$n; done;"
          " echo nodes-ok; echo \"LD=$LD_LIBRARY_PATH\"; cat /usr/local/nvidia/lib64/libcuda.so.1;"
          " test -x /usr/local/nvidia/bin/nvidia-smi && echo smi-ok;"
          " if (echo x >> /usr/local/nvidia/lib64/libcuda.so.1) 2>/dev/null; then echo writable; else echo read-only; fi")


def run(flags) -> subprocess.CompletedProcess:
    if shutil.which("docker") is None or subprocess.run(["docker", "image", "inspect", BASE_IMAGE],
                                                        capture_output=True).returncode != 0:
        pytest.fail(f"the Docker engine and {BASE_IMAGE} are required: run scripts/test.sh as root")
    return subprocess.run(["docker", "run", "--rm", "--network", "none", *flags, BASE_IMAGE, "bash", "-c", INSIDE],
                          capture_output=True, text=True, timeout=300)


def test_devices_mode_flags_give_a_container_the_nodes_and_the_driver_tree(tmp_path):
    libcuda = gpu_host(tmp_path, gpus=2)
    (tmp_path / "usr/local/nvidia/bin/nvidia-smi").chmod(0o755)
    access = gpu_access.devices(tmp_path, ldconfig_for(libcuda, tmp_path), "")
    proc = run(access.flags)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n") == ["nodes-ok", "LD=/usr/local/nvidia/lib64", "libcuda", "smi-ok", "read-only", ""]


def test_devices_mode_flags_for_a_driver_among_system_libraries(tmp_path):
    libcuda = gpu_host(tmp_path, gpus=2, driver_tree=False)
    (tmp_path / "usr/bin/nvidia-smi").chmod(0o755)
    access = gpu_access.devices(tmp_path, ldconfig_for(libcuda, tmp_path), "")
    proc = run(access.flags)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n") == ["nodes-ok", "LD=/usr/local/nvidia/lib64", "libcuda", "smi-ok", "read-only", ""]


def test_doctor_reads_the_real_engine_and_buildx_for_the_gpu_check_in_builds():
    """The engine scripts/install-engine.sh installs (Debian trixie: dockerd 26.1.5, buildx 0.13.1) is
    older than BuildKit's CDI devices need: doctor says so with the versions it read from them."""
    from imagegen.commands import doctor
    server = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True, text=True)
    bx = subprocess.run(["docker", "buildx", "version"], capture_output=True, text=True)
    assert server.returncode == 0 and bx.returncode == 0, "the Docker engine and buildx are required"
    report = doctor.Report()
    doctor.diagnose_build_gpus(report, driver_works=False)
    [check] = [c for c in report.diagnoses if c.name == "gpu check in builds"]
    new_enough = (gpu_access.version_tuple(server.stdout) >= gpu_access.BUILD_DEVICE_ENGINE
                  and gpu_access.version_tuple(bx.stdout.split()[1]) >= gpu_access.BUILD_DEVICE_BUILDX)
    if new_enough:
        assert check.status == "ok" and "no nvidia.com/gpu CDI device" in check.detail
    else:
        assert check.status == "warn" and server.stdout.strip() in check.detail and "needs Docker 27.0+" in check.detail
