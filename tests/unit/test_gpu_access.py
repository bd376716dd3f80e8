"""imagegen.executors.gpu_access: the three ways a container can be given this host's GPUs, and doctor's
report of them.

A host is made under tmp_path: real character device nodes (mknod, as root: the NVIDIA nodes' names
over /dev/null's numbers), a driver folder with versioned libraries and their SONAME links, CDI spec
files, and stand-in toolkit executables on PATH; only the GPU itself is missing. What is checked is
the docker run command line each way gives; tests/integration/test_gpu_access_engine.py runs it."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from imagegen.commands import doctor
from imagegen.errors import EngineError
from imagegen.executors import gpu_access, prebuilt

DRIVER = "580.159.04"


def node(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))


def gpu_host(root: Path, *, gpus: int = 1, uvm: bool = True, driver_tree: bool = True) -> Path:
    """Device nodes and a driver under ``root``; the driver in its own tree (/usr/local/nvidia, the
    NVIDIA runtime's layout) or among the system's libraries (/usr/lib/x86_64-linux-gnu)."""
    node(root / "dev" / "nvidiactl")
    if uvm:
        node(root / "dev" / "nvidia-uvm")
        node(root / "dev" / "nvidia-uvm-tools")
    for i in range(gpus):
        node(root / "dev" / f"nvidia{i}")
    (root / "dev" / "nvidia-caps").mkdir()  # a folder named like a node is no node
    libs = root / ("usr/local/nvidia/lib64" if driver_tree else "usr/lib/x86_64-linux-gnu")
    libs.mkdir(parents=True)
    for name, soname in [("libcuda", "libcuda.so.1"), ("libnvidia-ml", "libnvidia-ml.so.1"),
                         ("libnvidia-ptxjitcompiler", "libnvidia-ptxjitcompiler.so.1"), ("libEGL_nvidia", "libEGL_nvidia.so.0")]:
        (libs / f"{name}.so.{DRIVER}").write_text(f"{name}\n")
        (libs / soname).symlink_to(f"{name}.so.{DRIVER}")
        (libs / f"{name}.so").symlink_to(soname)
    (libs / "libcuda.so.470.1").write_text("an older driver's leftover\n")
    if not driver_tree:
        (libs / "libc.so.6").write_text("the system's libc\n")
    bin_dir = libs.parent.parent / "bin" if not driver_tree else libs.parent / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\n")
    return libs / "libcuda.so.1"


def ldconfig_for(libcuda: Path, root: Path):
    return lambda: f"\tlibcuda.so.1 (libc6,x86-64) => /{libcuda.relative_to(root)}\n\tlibc.so.6 (libc6,x86-64) => /lib/libc.so.6\n"


def test_devices_mode_passes_every_node_and_mounts_a_driver_tree_file_by_file(tmp_path):
    libcuda = gpu_host(tmp_path, gpus=2)
    access = gpu_access.devices(tmp_path, ldconfig_for(libcuda, tmp_path), "")
    d = tmp_path / "dev"
    libs = tmp_path / "usr/local/nvidia/lib64"
    assert access.mode == "devices"
    # Even the driver's own tree is never mounted whole (issue 32: nothing beside the driver's files).
    assert list(access.flags) == [
        "--device", f"{d}/nvidiactl:/dev/nvidiactl", "--device", f"{d}/nvidia-uvm:/dev/nvidia-uvm",
        "--device", f"{d}/nvidia-uvm-tools:/dev/nvidia-uvm-tools",
        "--device", f"{d}/nvidia0:/dev/nvidia0", "--device", f"{d}/nvidia1:/dev/nvidia1",
        "-v", f"{libs}/libcuda.so.{DRIVER}:/usr/local/nvidia/lib64/libcuda.so.1:ro",
        "-v", f"{libs}/libcuda.so.{DRIVER}:/usr/local/nvidia/lib64/libcuda.so.{DRIVER}:ro",
        "-v", f"{libs}/libnvidia-ml.so.{DRIVER}:/usr/local/nvidia/lib64/libnvidia-ml.so.1:ro",
        "-v", f"{libs}/libnvidia-ml.so.{DRIVER}:/usr/local/nvidia/lib64/libnvidia-ml.so.{DRIVER}:ro",
        "-v", f"{libs}/libnvidia-ptxjitcompiler.so.{DRIVER}:/usr/local/nvidia/lib64/libnvidia-ptxjitcompiler.so.1:ro",
        "-v", f"{libs}/libnvidia-ptxjitcompiler.so.{DRIVER}:/usr/local/nvidia/lib64/libnvidia-ptxjitcompiler.so.{DRIVER}:ro",
        "-v", f"{tmp_path}/usr/local/nvidia/bin/nvidia-smi:/usr/local/nvidia/bin/nvidia-smi:ro",
        "-e", "LD_LIBRARY_PATH=/usr/local/nvidia/lib64"]
    assert "5 device nodes" in access.detail


def test_the_cdi_spec_declares_the_same_nodes_mounts_and_environment_as_the_devices_flags(tmp_path):
    libcuda = gpu_host(tmp_path, gpus=2, driver_tree=False)
    edits = gpu_access.driver_edits(tmp_path, ldconfig_for(libcuda, tmp_path), "")
    spec = gpu_access.cdi_spec(edits)
    flags = gpu_access.devices(tmp_path, ldconfig_for(libcuda, tmp_path), "").flags
    assert spec["cdiVersion"] == "0.6.0" and spec["kind"] == "nvidia.com/gpu"
    # BuildKit hands a device to `RUN --device` without the `device` entitlement only with this annotation
    assert spec["annotations"] == {"org.mobyproject.buildkit.device.autoallow": "true"}
    [device] = spec["devices"]
    assert device["name"] == "all"
    nodes = [(n["hostPath"], n["path"]) for n in device["containerEdits"]["deviceNodes"]]
    assert [f"{h}:{c}" for h, c in nodes] == [flags[i + 1] for i, f in enumerate(flags) if f == "--device"]
    assert ("{}/dev/nvidia1".format(tmp_path), "/dev/nvidia1") in nodes
    mounts = spec["containerEdits"]["mounts"]
    assert [f"{m['hostPath']}:{m['containerPath']}:ro" for m in mounts] == [flags[i + 1] for i, f in enumerate(flags) if f == "-v"]
    assert all(m["options"][0] == "ro" for m in mounts)
    assert spec["containerEdits"]["env"] == ["LD_LIBRARY_PATH=/usr/local/nvidia/lib64"]


def test_a_written_cdi_spec_is_found_by_the_cdi_mode(tmp_path):
    libcuda = gpu_host(tmp_path)
    spec = gpu_access.cdi_spec(gpu_access.driver_edits(tmp_path, ldconfig_for(libcuda, tmp_path), ""))
    cdi_spec(tmp_path, "imagegen-nvidia.json", json.dumps(spec))
    access = gpu_access.cdi(tmp_path, engine_dirs=["/etc/cdi"])
    assert access.flags == ("--device", "nvidia.com/gpu=all")


def test_no_cdi_spec_without_the_driver(tmp_path):
    gpu_host(tmp_path)
    assert not isinstance(gpu_access.driver_edits(tmp_path, lambda: "", ""), gpu_access.DriverEdits)
    assert gpu_access.driver_edits(tmp_path / "nothing", lambda: "", "") is None


def test_a_driver_among_system_libraries_is_mounted_file_by_file_under_its_sonames(tmp_path):
    libcuda = gpu_host(tmp_path, driver_tree=False)
    access = gpu_access.devices(tmp_path, ldconfig_for(libcuda, tmp_path), "")
    libs = tmp_path / "usr/lib/x86_64-linux-gnu"
    mounts = [access.flags[i + 1] for i, f in enumerate(access.flags) if f == "-v"]
    # Compute libraries of the running driver only: no GL library, no older driver's file, no libc.
    # Each under its versioned name and its SONAME (what a program loads).
    assert mounts == [
        f"{libs}/libcuda.so.1:/usr/local/nvidia/lib64/libcuda.so.1:ro".replace("so.1:", f"so.{DRIVER}:", 1),
        f"{libs}/libcuda.so.{DRIVER}:/usr/local/nvidia/lib64/libcuda.so.{DRIVER}:ro",
        f"{libs}/libnvidia-ml.so.{DRIVER}:/usr/local/nvidia/lib64/libnvidia-ml.so.1:ro",
        f"{libs}/libnvidia-ml.so.{DRIVER}:/usr/local/nvidia/lib64/libnvidia-ml.so.{DRIVER}:ro",
        f"{libs}/libnvidia-ptxjitcompiler.so.{DRIVER}:/usr/local/nvidia/lib64/libnvidia-ptxjitcompiler.so.1:ro",
        f"{libs}/libnvidia-ptxjitcompiler.so.{DRIVER}:/usr/local/nvidia/lib64/libnvidia-ptxjitcompiler.so.{DRIVER}:ro",
        f"{tmp_path}/usr/bin/nvidia-smi:/usr/local/nvidia/bin/nvidia-smi:ro"]
    assert f"3 driver {DRIVER} libraries" in access.detail


def test_libcuda_is_found_through_ld_library_path_when_the_cache_lacks_it(tmp_path):
    libcuda = gpu_host(tmp_path)
    found = gpu_access.find_libcuda(tmp_path, lambda: "", "relative/ignored:/usr/local/nvidia/lib64")
    assert found == libcuda


@pytest.mark.parametrize("what", ["no uvm node", "no gpu node", "plain files"])
def test_no_devices_mode_without_the_nodes_a_cuda_program_opens(tmp_path, what):
    if what == "plain files":
        (tmp_path / "dev").mkdir()
        for name in ("nvidiactl", "nvidia-uvm", "nvidia0"):
            (tmp_path / "dev" / name).write_text("")
    else:
        gpu_host(tmp_path, uvm=what != "no uvm node", gpus=0 if what == "no gpu node" else 1)
    assert gpu_access.devices(tmp_path, lambda: "", "") is None


def test_nodes_without_the_driver_libraries_say_what_to_fix(tmp_path):
    gpu_host(tmp_path)
    access = gpu_access.devices(tmp_path, lambda: "", "")
    assert access.flags == () and "no libcuda.so.1" in access.detail and "LD_LIBRARY_PATH" in access.fix


def cdi_spec(root: Path, name: str, text: str) -> None:
    (root / "etc" / "cdi").mkdir(parents=True, exist_ok=True)
    (root / "etc" / "cdi" / name).write_text(text)


def test_cdi_needs_a_spec_for_all_gpus_and_an_engine_with_cdi_on(tmp_path):
    assert gpu_access.cdi(tmp_path) is None
    cdi_spec(tmp_path, "other.yaml", "cdiVersion: 0.5.0\nkind: vendor.com/fpga\ndevices: [{name: all}]\n")
    cdi_spec(tmp_path, "broken.yaml", "kind: [unclosed\n")
    cdi_spec(tmp_path, "big.json", "{" + " " * (2 << 20) + "}")
    assert gpu_access.cdi(tmp_path) is None
    cdi_spec(tmp_path, "nvidia.yaml", "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: '0'\n- name: all\n")
    access = gpu_access.cdi(tmp_path, ["/etc/cdi", "/var/run/cdi"])
    assert access.flags == ("--device", "nvidia.com/gpu=all") and "nvidia.yaml" in access.detail
    off = gpu_access.cdi(tmp_path, [])
    assert off.flags == () and "CDI off" in off.detail and '"cdi": true' in off.fix


def test_the_engine_is_asked_which_cdi_folders_it_reads(tmp_path):
    answer = lambda out, rc=0: (lambda *a: subprocess.CompletedProcess(a, rc, out, ""))  # noqa: E731
    assert gpu_access.engine_cdi_dirs(answer('["/etc/cdi","/var/run/cdi"]\n')) == ["/etc/cdi", "/var/run/cdi"]
    assert gpu_access.engine_cdi_dirs(answer("[]\n")) == []
    assert gpu_access.engine_cdi_dirs(answer("null\n")) == []
    assert gpu_access.engine_cdi_dirs(answer("", 1)) is None
    assert gpu_access.engine_cdi_dirs(lambda *a: None) is None


def toolkit_on_path(tmp_path: Path, monkeypatch, *names: str) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in names:
        (bin_dir / name).write_text("#!/bin/sh\nexit 0\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")


def test_auto_prefers_the_toolkit_then_cdi_then_devices(tmp_path, monkeypatch):
    root = tmp_path / "root"
    libcuda = gpu_host(root)
    probe = dict(root=root, ldconfig=ldconfig_for(libcuda, root), library_path="")
    toolkit_on_path(tmp_path, monkeypatch)
    assert gpu_access.choose("auto", driver_works=lambda: True, **probe).mode == "devices"
    cdi_spec(root, "nvidia.json", '{"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": [{"name": "all"}]}')
    assert gpu_access.choose("auto", driver_works=lambda: True, **probe).flags == ("--device", "nvidia.com/gpu=all")
    toolkit_on_path(tmp_path, monkeypatch, "nvidia-ctk")
    assert gpu_access.choose("auto", driver_works=lambda: True, **probe).flags == ("--gpus", "all")
    # A named way is that way, whatever else the host has; none is none.
    assert gpu_access.choose("devices", driver_works=lambda: True, **probe).mode == "devices"
    assert gpu_access.choose("none", driver_works=lambda: True, **probe).flags == ()
    # No working driver: auto gives nothing.
    assert gpu_access.choose("auto", driver_works=lambda: False, **probe).flags == ()


def test_auto_says_once_why_a_gpu_host_builds_without_its_gpus(tmp_path, monkeypatch):
    toolkit_on_path(tmp_path, monkeypatch)
    said = []
    access = gpu_access.choose("auto", driver_works=lambda: True, say=said.append, root=tmp_path,
                               ldconfig=lambda: "", library_path="")
    assert access.flags == () and len(said) == 1 and "builds for --arch" in said[0]


def test_a_remote_engine_is_not_given_this_hosts_gpus(tmp_path, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "ssh://builder.example")
    said = []
    assert gpu_access.choose("auto", driver_works=lambda: True, say=said.append).flags == ()
    assert "ssh://builder.example" in said[0]


def test_pull_with_a_named_way_this_host_lacks_is_one_engine_error(tmp_path, monkeypatch):
    toolkit_on_path(tmp_path, monkeypatch)
    monkeypatch.setattr(gpu_access, "devices", lambda *a, **k: None)
    with pytest.raises(EngineError, match=r"--gpus devices: this host has no devices way .*needs /dev/nvidiactl"):
        prebuilt.gpu_flags("devices")
    with pytest.raises(EngineError, match=r"--gpus cdi: .*nvidia-ctk cdi generate"):
        prebuilt.gpu_flags("cdi")


def test_doctor_reports_each_way_this_host_has(tmp_path, monkeypatch):
    root = tmp_path / "root"
    libcuda = gpu_host(root)
    cdi_spec(root, "nvidia.yaml", "kind: nvidia.com/gpu\ndevices: [{name: all}]\n")
    toolkit_on_path(tmp_path, monkeypatch)
    report = doctor.Report()
    doctor.diagnose_container_gpus(report, driver_works=True, root=root, ldconfig=ldconfig_for(libcuda, root),
                                   library_path="", docker=lambda *a: subprocess.CompletedProcess(a, 0, "[]\n", ""))
    lines = report.text().splitlines()
    assert [c.name for c in report.diagnoses] == ["gpus in containers: cdi", "gpus in containers: devices", "gpus in containers"]
    assert [c.status for c in report.diagnoses] == [doctor.WARN, doctor.OK, doctor.OK]
    assert any("but the engine has CDI off" in line for line in lines)
    assert any("--device" in line and "/usr/local/nvidia/lib64/libcuda.so.1:ro" in line for line in lines)
    assert report.diagnoses[-1].detail == "imagegen pull --gpus auto uses devices"


def test_doctor_on_a_host_with_no_way_says_so_with_the_fix(tmp_path, monkeypatch):
    toolkit_on_path(tmp_path, monkeypatch)
    report = doctor.Report()
    doctor.diagnose_container_gpus(report, driver_works=True, root=tmp_path, ldconfig=lambda: "", library_path="",
                                   docker=lambda *a: None)
    assert [c.status for c in report.diagnoses] == [doctor.WARN]
    assert "cannot see the GPUs" in report.diagnoses[0].detail and "NVIDIA Container Toolkit" in report.diagnoses[0].fix
    report = doctor.Report()
    doctor.diagnose_container_gpus(report, driver_works=False)
    assert report.diagnoses[0].status == doctor.OK and "no working NVIDIA driver" in report.diagnoses[0].detail


# `docker buildx inspect` as buildx 0.29.1 (Debian sid) printed it: on the H100 device with the spec
# `imagegen cdi-spec` wrote (docs/records/gpu-results/2026-11-25d), and on the CPU machine with a stand-in
# device and no annotation.
INSPECT_DEVICE = """Name:   default
Driver: docker

Nodes:
Name:             default
Endpoint:         default
Status:           running
BuildKit version: v0.0.0+unknown
Platforms:        linux/amd64, linux/amd64/v2, linux/amd64/v3, linux/386
Devices:
 Name:                  nvidia.com/gpu=all
 Automatically allowed: true
 Annotations:
  org.mobyproject.buildkit.device.autoallow: true
GC Policy rule#0:
 All:            false
"""
INSPECT_STANDIN = INSPECT_DEVICE.replace("nvidia.com/gpu=all", "imagegen.test/device=probe").replace(
    " Automatically allowed: true\n Annotations:\n  org.mobyproject.buildkit.device.autoallow: true\n",
    " Automatically allowed: false\n")


def test_build_devices_are_read_from_buildx_inspect():
    assert gpu_access.build_devices(INSPECT_DEVICE) == [gpu_access.BuildDevice("nvidia.com/gpu=all", True)]
    assert gpu_access.build_devices(INSPECT_STANDIN) == [gpu_access.BuildDevice("imagegen.test/device=probe", False)]
    # buildx before 0.22 has no Devices section; a Name line elsewhere is a node's, not a device's
    assert gpu_access.build_devices(INSPECT_DEVICE.split("Devices:")[0]) == []


@pytest.mark.parametrize("text, want", [("28.5.2+dfsg4", (28, 5, 2)), ("v0.29.1", (0, 29, 1)), ("0.13.1+ds1", (0, 13, 1)),
                                        ("27.0", (27, 0)), ("dev", ())])
def test_version_tuple(text, want):
    assert gpu_access.version_tuple(text) == want


def docker_answering(server: str, buildx: str, inspect: str):
    def docker(*args, **kw):
        out = {("version", "--format", "{{.Server.Version}}"): server + "\n",
               ("buildx", "version"): f"github.com/docker/buildx {buildx} {buildx}-1\n",
               ("buildx", "inspect"): inspect}[args]
        return subprocess.CompletedProcess(list(args), 0, out, "")
    return docker


@pytest.mark.parametrize("server, buildx, inspect, driver, level, words", [
    ("26.1.5+dfsg1", "0.13.1+ds1", "", True, "warn", "needs Docker 27.0+ and buildx 0.22+"),
    ("28.5.2+dfsg4", "0.13.1", "", True, "warn", "needs Docker 27.0+ and buildx 0.22+"),
    ("28.5.2+dfsg4", "0.29.1+ds1", INSPECT_DEVICE, True, "ok", "--gpu-check-device nvidia.com/gpu=all"),
    ("28.5.2+dfsg4", "0.29.1+ds1", INSPECT_STANDIN, True, "warn", "imagegen cdi-spec"),
    ("28.5.2+dfsg4", "0.29.1+ds1", INSPECT_STANDIN, False, "ok", "no working NVIDIA driver"),
    ("28.5.2+dfsg4", "0.29.1+ds1", INSPECT_DEVICE.replace("allowed: true", "allowed: false"), True, "warn",
     "not automatically allowed"),
])
def test_doctor_says_whether_a_build_step_can_be_given_the_gpu(server, buildx, inspect, driver, level, words):
    report = doctor.Report()
    doctor.diagnose_build_gpus(report, driver_works=driver, docker=docker_answering(server, buildx, inspect))
    [check] = [c for c in report.diagnoses if c.name == "gpu check in builds"]
    assert check.status == level and words in check.detail + " " + check.fix
