"""Tests for imagegen.commands.doctor: the Report (text and JSON), the toolchain checks (torch, nvcc vs torch's CUDA,
GPUs) against stand-in python / nvcc / nvidia-smi executables, the engine checks against a stand-in docker
(never a real engine), the machine checks, and run() without the engine."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from imagegen import cli
from imagegen.commands import doctor
from imagegen.engine import NO_DOCKER

SYSTEM_PATH = "/usr/bin:/bin"  # sh, mkdir and grep; no docker, nvcc or nvidia-smi live there


def _exe(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _python(tmp_path: Path, **info) -> str:
    """A stand-in interpreter answering the toolchain probe with ``info`` (python 3.12 unless given)."""
    answer = json.dumps({"python": "3.12", **info})
    return str(_exe(tmp_path / "py" / "python", f"echo 'some warning' >&2\necho '{answer}'\n"))


def _cuda(tmp_path: Path, release: str) -> str:
    home = tmp_path / "cuda"
    _exe(home / "bin" / "nvcc", f"echo 'nvcc: NVIDIA (R) Cuda compiler driver'\n"
                                f"echo 'Cuda compilation tools, release {release}, V{release}.41'\n")
    return str(home)


@pytest.fixture
def bare_path(tmp_path, monkeypatch) -> Path:
    """PATH = a folder of this test's stand-ins, then the system folders (none of the real tools)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}:{SYSTEM_PATH}")
    monkeypatch.delenv("CUDA_HOME", raising=False)
    return bin_dir


def _diagnoses(report: doctor.Report) -> dict[str, doctor.Diagnosis]:
    return {c.name: c for c in report.diagnoses}


# ------------------------------------------------------------------------------------------ report


def test_report_text_aligns_the_names_and_puts_each_fix_below_its_check():
    report = doctor.Report()
    report.add("python", doctor.OK, "imagegen runs on 3.12")
    report.add("nvcc vs torch", doctor.FAIL, "nvcc 12.8 but torch is a CUDA 13.0 build", "install CUDA 13.x")
    report.add("gpus", doctor.WARN, "none")
    assert report.text().splitlines() == [
        "ok    python         imagegen runs on 3.12",
        "FAIL  nvcc vs torch  nvcc 12.8 but torch is a CUDA 13.0 build",
        "                     fix: install CUDA 13.x",
        "warn  gpus           none",
    ]
    assert [c.name for c in report.failed] == ["nvcc vs torch"]
    assert json.loads(report.as_json()) == [
        {"name": "python", "status": "ok", "detail": "imagegen runs on 3.12", "fix": ""},
        {"name": "nvcc vs torch", "status": "FAIL", "detail": "nvcc 12.8 but torch is a CUDA 13.0 build",
         "fix": "install CUDA 13.x"},
        {"name": "gpus", "status": "warn", "detail": "none", "fix": ""},
    ]


# --------------------------------------------------------------------------------------- toolchain


def test_a_cuda_torch_with_a_matching_nvcc_is_all_ok(tmp_path, bare_path):
    python = _python(tmp_path, torch="2.8.0", torch_cuda="12.8", cuda_home=_cuda(tmp_path, "12.9"))
    report = doctor.Report()
    doctor.diagnose_toolchain(report, python)
    checks = _diagnoses(report)
    assert list(checks) == ["python", "torch", "nvcc", "nvcc vs torch", "gpus"]
    assert all(c.status == doctor.OK for c in report.diagnoses), report.text()
    assert checks["torch"].detail == f"2.8.0 (CUDA 12.8) in {python}"
    assert checks["nvcc"].detail == f"12.9 (CUDA_HOME {tmp_path / 'cuda'})"
    assert checks["nvcc vs torch"].detail == "nvcc 12.x matches torch's CUDA 12.8"
    assert checks["gpus"].detail.startswith("none visible")


def test_nvcc_and_torch_of_different_cuda_majors_is_the_failure_to_fix_first(tmp_path, bare_path):
    python = _python(tmp_path, torch="2.9.0", torch_cuda="13.0", cuda_home=_cuda(tmp_path, "12.8"))
    report = doctor.Report()
    doctor.diagnose_toolchain(report, python)
    [failed] = report.failed
    assert failed.name == "nvcc vs torch" and failed.detail == "nvcc 12.8 but torch is a CUDA 13.0 build"
    assert "install CUDA 13.x (or a torch built for CUDA 12.x)" in failed.fix


def test_a_cpu_torch_is_a_warning_and_nvcc_is_not_compared(tmp_path, bare_path):
    python = _python(tmp_path, torch="2.8.0", torch_cuda=None, cuda_home=_cuda(tmp_path, "12.8"))
    report = doctor.Report()
    doctor.diagnose_toolchain(report, python)
    checks = _diagnoses(report)
    assert checks["torch"].status == doctor.WARN and "none: a CPU build" in checks["torch"].detail
    assert "cuXXX index" in checks["torch"].fix
    assert "nvcc vs torch" not in checks and report.failed == []


def test_no_torch_and_no_nvcc_are_warnings_that_only_native_builds_care_about(tmp_path, bare_path):
    python = _python(tmp_path, torch_error="ModuleNotFoundError: No module named 'torch'")
    report = doctor.Report()
    doctor.diagnose_toolchain(report, python)
    checks = _diagnoses(report)
    assert checks["torch"].status == doctor.WARN and checks["torch"].detail == f"not importable by {python}"
    assert checks["nvcc"].status == doctor.WARN and checks["nvcc"].fix.startswith("only native builds need it")
    assert report.failed == []


def test_nvcc_is_found_on_path_when_cuda_home_is_unknown(tmp_path, bare_path):
    _cuda(tmp_path, "13.0")
    (bare_path / "nvcc").symlink_to(tmp_path / "cuda" / "bin" / "nvcc")
    python = _python(tmp_path, torch="2.9.0", torch_cuda="13.0")
    report = doctor.Report()
    doctor.diagnose_toolchain(report, python)
    checks = _diagnoses(report)
    assert checks["nvcc"].detail == "13.0 (CUDA_HOME None)" and checks["nvcc vs torch"].status == doctor.OK


def test_visible_gpus_give_the_arch_to_build_for(tmp_path, bare_path):
    _exe(bare_path / "nvidia-smi", 'echo "NVIDIA H100 80GB HBM3, 9.0"\necho "NVIDIA A100-SXM4-40GB, 8.0"\n'
                                   'echo "NVIDIA H100 80GB HBM3, 9.0"\n')
    report = doctor.Report()
    doctor.diagnose_toolchain(report, _python(tmp_path))
    gpus = _diagnoses(report)["gpus"]
    assert gpus.status == doctor.OK
    assert gpus.detail == "NVIDIA H100 80GB HBM3 (9.0); NVIDIA A100-SXM4-40GB (8.0); NVIDIA H100 80GB HBM3 (9.0)"
    assert gpus.fix == "build for them with --arch '8.0;9.0'"


def test_this_interpreter_is_the_default(bare_path):
    report = doctor.Report()
    doctor.diagnose_toolchain(report, None)
    checks = _diagnoses(report)
    assert checks["python"].status == doctor.OK
    assert checks["python"].detail == f"imagegen runs on {sys.version.split()[0]}"
    assert checks["torch"].detail.endswith(sys.executable)  # "... in EXE" or "not importable by EXE"


# ------------------------------------------------------------------------------------------ engine

HEALTHY_DOCKER = """\
echo "$*" >> "$DOCKER_CALLS"
case "$1 $2" in
  "version --format") echo "27.3.1" ;;
  "buildx version") echo "github.com/docker/buildx v0.17.1 d1d5b8a" ;;
  "buildx bake")
    echo "in $(pwd)" >> "$DOCKER_CALLS"
    grep -q '"matrix"' probe.json || { echo "no matrix in the probe" >&2; exit 1; }
    {export}
    ;;
  *) echo "unexpected call: $*" >&2; exit 2 ;;
esac
"""
BOTH = "mkdir -p out/a out/b && echo ok > out/a/ok && echo ok > out/b/ok"


def _docker(bare_path: Path, tmp_path: Path, monkeypatch, body: str) -> Path:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the probe bake's folder lands in tmp_path
    calls = tmp_path / "docker-calls"
    calls.write_text("")
    monkeypatch.setenv("DOCKER_CALLS", str(calls))
    _exe(bare_path / "docker", body)
    return calls


def test_a_working_engine_with_a_bake_matrix_and_local_export(tmp_path, bare_path, monkeypatch):
    calls = _docker(bare_path, tmp_path, monkeypatch, HEALTHY_DOCKER.replace("{export}", BOTH))
    report = doctor.Report()
    doctor.diagnose_engine(report)
    checks = _diagnoses(report)
    assert list(checks) == ["docker engine", "buildx", "bake matrix + local export"]
    assert report.failed == [] and checks["docker engine"].detail == "server 27.3.1"
    assert checks["buildx"].detail == "v0.17.1"
    bake, where = calls.read_text().splitlines()[-2:]
    assert bake == "buildx bake -f probe.json --progress plain probe"
    assert Path(where.removeprefix("in ")).parent == tmp_path.resolve()  # a temporary folder of its own...
    assert list(tmp_path.glob("imagegen-doctor-*")) == []  # ...removed afterwards


def test_the_probe_bake_is_said_before_it_runs_and_no_build_skips_it(tmp_path, bare_path, monkeypatch, capsys):
    calls = _docker(bare_path, tmp_path, monkeypatch, HEALTHY_DOCKER.replace("{export}", BOTH))
    said: list[tuple[str, bool]] = []
    doctor.diagnose_engine(doctor.Report(), say=lambda m: said.append((m, "buildx bake" in calls.read_text())))
    [(line, baked_already)] = said
    assert line.startswith("doctor: building a tiny probe image on the engine (") and line.endswith("--no-build skips it")
    assert not baked_already and "buildx bake" in calls.read_text()
    # The command: the line on stderr (stdout keeps the report); --no-build checks the engine, bakes nothing.
    calls.write_text("")
    assert cli.main(["doctor", "--no-build"]) in (0, 4)
    out, err = capsys.readouterr()
    assert "buildx bake" not in calls.read_text() and "buildx version" in calls.read_text()
    assert "probe image" not in err and doctor.PROBE_SKIPPED in out
    cli.main(["doctor"])
    out, err = capsys.readouterr()
    assert "doctor: building a tiny probe image on the engine" in err and "probe image" not in out
    assert "buildx bake" in calls.read_text()


def test_a_bake_that_does_not_export_both_targets_fails_with_what_to_do(tmp_path, bare_path, monkeypatch):
    one = "mkdir -p out/a && echo ok > out/a/ok\n    echo 'matrix: unknown field' >&2"
    _docker(bare_path, tmp_path, monkeypatch, HEALTHY_DOCKER.replace("{export}", one))
    report = doctor.Report()
    doctor.diagnose_engine(report)
    [failed] = report.failed
    assert failed.name == "bake matrix + local export"
    assert failed.detail == "did not work here: matrix: unknown field" and "buildx >= 0.11" in failed.fix


def test_a_stopped_daemon_fails_without_trying_a_bake(tmp_path, bare_path, monkeypatch):
    body = HEALTHY_DOCKER.replace('"version --format") echo "27.3.1" ;;',
                                  '"version --format") echo "Cannot connect to the Docker daemon at'
                                  ' unix:///var/run/docker.sock" >&2; exit 1 ;;')
    calls = _docker(bare_path, tmp_path, monkeypatch, body.replace("{export}", BOTH))
    report = doctor.Report()
    doctor.diagnose_engine(report)
    checks = _diagnoses(report)
    assert checks["docker engine"].status == doctor.FAIL
    assert checks["docker engine"].detail.startswith("not reachable: Cannot connect to the Docker daemon")
    assert checks["buildx"].status == doctor.OK and "bake matrix + local export" not in checks
    assert "buildx bake" not in calls.read_text()


def test_a_missing_buildx_plugin_is_its_own_failure(tmp_path, bare_path, monkeypatch):
    body = HEALTHY_DOCKER.replace('"buildx version") echo "github.com/docker/buildx v0.17.1 d1d5b8a" ;;',
                                  '"buildx version") echo "docker: \'buildx\' is not a docker command." >&2; exit 1 ;;')
    _docker(bare_path, tmp_path, monkeypatch, body.replace("{export}", BOTH))
    report = doctor.Report()
    doctor.diagnose_engine(report)
    assert [(c.name, c.status) for c in report.diagnoses] == [("docker engine", doctor.OK), ("buildx", doctor.FAIL)]
    assert "install docker-buildx" in report.failed[0].fix


def test_no_docker_cli_is_a_warning_with_the_engine_modules_words(bare_path):
    report = doctor.Report()
    doctor.diagnose_engine(report)
    [check] = report.diagnoses
    assert (check.name, check.status) == ("docker", doctor.WARN)
    assert f"{check.detail}: {check.fix}" == NO_DOCKER


# ----------------------------------------------------------------------------------------- machine


def test_machine_checks_name_the_disk_the_cores_and_the_job_settings(tmp_path):
    report = doctor.Report()
    doctor.diagnose_machine(report, tmp_path)
    names = [c.name for c in report.diagnoses]
    assert names[:2] == ["disk", "cpu / ram"] and len(names) == 4
    assert names[2].startswith("jobs (sageattention, ") and names[3].startswith("jobs (flash-attn, ")
    assert all("GB per nvcc thread, one arch)" in n for n in names[2:])
    assert report.diagnoses[0].detail.endswith(f" GB free in {tmp_path}")
    assert " cores, " in report.diagnoses[1].detail and "GB RAM for builds" in report.diagnoses[1].detail
    assert all(c.detail.startswith("MAX_JOBS=") for c in report.diagnoses[2:])
    assert report.failed == []  # the machine itself is never a FAIL, at most a warning


def test_run_without_the_engine_never_calls_docker(tmp_path, bare_path, monkeypatch):
    calls = _docker(bare_path, tmp_path, monkeypatch, HEALTHY_DOCKER.replace("{export}", BOTH))
    report = doctor.run(_python(tmp_path, torch="2.8.0", torch_cuda="12.8", cuda_home=_cuda(tmp_path, "12.8")),
                        root=tmp_path, engine=False)
    names = [c.name for c in report.diagnoses]
    assert names[:6] == ["python", "torch", "nvcc", "nvcc vs torch", "gpus", "cmake"] and names[6] == "disk"
    assert not {"docker", "docker engine", "buildx"} & set(names) and calls.read_text() == ""
    with_engine = doctor.run(_python(tmp_path), root=tmp_path)
    assert "bake matrix + local export" in [c.name for c in with_engine.diagnoses] and calls.read_text()


# ------------------------------------------------------------------------------------- build tools


def _cmake(folder: Path, version: str) -> Path:
    return _exe(folder / "cmake", f"echo 'cmake version {version}'\necho\necho 'CMake suite maintained by Kitware'\n")


def test_the_cmake_a_native_build_would_run_against_the_catalogues_cmake_builds(tmp_path, bare_path, monkeypatch):
    # natten's build requires cmake>=3.26 (CUDA as C++20 at torch >= 2.12; Debian bookworm has 3.25.1).
    monkeypatch.setenv("PATH", str(bare_path))  # no system cmake
    def row(python_exe):
        report = doctor.Report()
        doctor.diagnose_build_tools(report, python_exe)
        (d,) = report.diagnoses
        return d
    plain = str(tmp_path / "plain" / "python")
    d = row(plain)
    assert (d.name, d.status) == ("cmake", doctor.WARN) and d.detail == "none on PATH; natten (cmake>=3.26) build with CMake"
    assert "pip install 'cmake>=3.26' into the venv you build with" in d.fix
    system = _cmake(bare_path, "3.25.1")
    d = row(plain)
    assert (d.status, d.detail) == (doctor.WARN, f"3.25.1 ({system}): natten needs cmake>=3.26")
    # a venv holding a newer CMake: the one a native build with its python runs (its bin/ first on PATH)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    newer = _cmake(venv / "bin", "3.27.0")
    d = row(str(venv / "bin" / "python"))
    assert (d.status, d.detail) == (doctor.OK, f"3.27.0 ({newer}): enough for natten (cmake>=3.26)")
    _cmake(bare_path, "4.1.0")
    assert row(plain).status == doctor.OK
