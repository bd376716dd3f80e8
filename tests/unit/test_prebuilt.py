"""Tests for imagegen.executors.prebuilt: what decides a builder image (builder_inputs), the ccache
volume's name, the container's name and environment, the bake file that builds (and pushes) builder
images and how its failures read, and `pull` cell by cell: up to date, refused, pulled (pinned by the
lock) or built locally, audited and run, with the `docker run` command lines it builds. The engine's
own calls (bake, pull, run) are stand-ins here: the engine module has its own tests."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
from pathlib import Path

import pytest

from imagegen import __version__, engine
from imagegen.plan import registry
from imagegen.wheelhouse import manifest as wheelhouse
from imagegen.wheelhouse import collect
from imagegen.errors import BuildError, EngineError, ImageMissing, RegistryError, UsageError
from imagegen.executors import prebuilt
from imagegen.executors.bake_run import bake_variables
from imagegen.finish.finisher import finish
from imagegen.model import jobs
from imagegen.model.recipes import with_env
from imagegen.model.cell import Plan
from imagegen.plan.registry import Lock, image_ref
from imagegen.render.dockerfile import cell_document, inputs_hash
from tests.unit.executor_fixtures import WHEEL, audit_report, temp_files_under, tiny_cell

REG = "registry.example:5000/ml"
DIGEST = "sha256:" + "ab" * 32
CELL = tiny_cell()


@pytest.fixture(autouse=True)
def _temp_files(tmp_path, monkeypatch):
    """Temporary files (the import test's folder, verify's extracted .so files) under tmp_path."""
    temp_files_under(tmp_path, monkeypatch)


def test_builder_inputs_ignore_the_archs_but_not_the_rest_of_the_cell():
    one = prebuilt.builder_inputs(tiny_cell("8.0"))
    assert re.fullmatch(r"[0-9a-f]{16}", one)
    assert prebuilt.builder_inputs(tiny_cell("9.0;12.0+PTX")) == one  # one image builds every arch
    assert prebuilt.builder_inputs(tiny_cell("8.0", python="3.12")) != one
    assert prebuilt.builder_inputs(tiny_cell("8.0", flavor="cuda")) != one  # another base image


def test_the_ccache_volume_is_imagegens_unless_overridden(monkeypatch):
    monkeypatch.delenv("IMAGEGEN_CCACHE_VOLUME", raising=False)
    assert prebuilt.ccache_volume() == "imagegen-ccache"
    monkeypatch.setenv("IMAGEGEN_CCACHE_VOLUME", "")
    assert prebuilt.ccache_volume() == "imagegen-ccache"
    monkeypatch.setenv("IMAGEGEN_CCACHE_VOLUME", "ci_job-42.cache")
    assert prebuilt.ccache_volume() == "ci_job-42.cache"


@pytest.mark.parametrize("bad", ["-v", "/host/path", "a b", "x;rm -rf /", "../up", "é", "x" * 129])
def test_a_ccache_volume_that_is_no_volume_name_is_a_usage_error(monkeypatch, bad):
    monkeypatch.setenv("IMAGEGEN_CCACHE_VOLUME", bad)
    with pytest.raises(UsageError) as info:
        prebuilt.ccache_volume()
    assert info.value.exit_code == 2
    assert str(info.value).startswith("IMAGEGEN_CCACHE_VOLUME must be a Docker volume name")


def test_each_container_gets_an_init_and_a_name_of_its_own():
    first, second = prebuilt.container_args(CELL), prebuilt.container_args(CELL)
    assert first[:2] == ["--init", "--name"] and len(first) == 3
    assert re.fullmatch(rf"imagegen-{re.escape(CELL.name)}-[0-9a-f]{{8}}", first[2]) and first[2] != second[2]


def test_env_args_hand_the_cells_variables_to_docker_run_in_order():
    assert prebuilt.env_args(CELL) == []  # the fixture's recipe sets none
    version = with_env(CELL.recipe, CELL.version, {"ZED": "last", "ALPHA": "a b"})
    cell = dataclasses.replace(CELL, version=version)
    assert prebuilt.env_args(cell) == ["-e", "ALPHA=a b", "-e", "ZED=last"]


# ------------------------------------------------------------------------------ bake_builders


class BuilderBake:
    """Stands in for engine.bake when builder images are baked: keeps the bake file it was given,
    writes bake's metadata file, or fails with ``stderr``."""

    def __init__(self, stderr: str = "") -> None:
        self.stderr = stderr
        self.calls: list[dict] = []

    def __call__(self, file, targets, *, on_line, builder=None, variables=None, metadata_file=None):
        data = json.loads(Path(file).read_text())
        self.calls.append({"data": data, "targets": targets, "builder": builder, "variables": variables,
                           "metadata": metadata_file})
        on_line(f"#1 [{targets[0]} builder 1/9] FROM docker.io/library/python:3.11-slim-bookworm")
        if self.stderr:
            raise engine.BakeFailed(self.stderr)
        if metadata_file is not None:
            Path(metadata_file).write_text(json.dumps({t: {"containerimage.digest": DIGEST} for t in targets}
                                                      | {"buildx.build.warnings": ["not a target"]}))


def test_bake_builders_builds_the_builder_stage_tagged_and_labelled(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fake = BuilderBake()
    monkeypatch.setattr(engine, "bake", fake)
    said: list[str] = []
    digests = prebuilt.bake_builders([CELL], REG, work=tmp_path / "work", push=False, ca_bundle=None, builder="farm",
                                     cache_from=["type=registry,ref=r/c"], cache_to=[], say=said.append)
    assert digests == {}  # loaded into the local engine: no registry digest
    (call,) = fake.calls
    target = call["data"]["target"][CELL.name]
    assert call["targets"] == [CELL.name] and call["builder"] == "farm"
    assert (target["target"], target["tags"], target["output"]) == ("builder", [image_ref(CELL, REG)], ["type=docker"])
    assert target["labels"]["io.imagegen.inputs"] == prebuilt.builder_inputs(CELL)
    assert target["labels"]["io.imagegen.version"] == __version__
    assert target["labels"]["io.imagegen.cell"] == CELL.name  # the Dockerfile's own labels are kept
    assert target["cache-from"] == ["type=registry,ref=r/c"] and "cache-to" not in target
    (run_dir,) = (tmp_path / "work" / "runs").iterdir()
    assert "-builder-" in run_dir.name
    assert target["context"] == str(run_dir / "dockerfiles")
    assert call["variables"] == bake_variables(call["data"]["variable"]["IMAGEGEN_PIP_CERT"]["default"])
    assert said == [f"building 1 builder image(s); log: {run_dir / 'bake.log'}"]
    assert "FROM docker.io/library/python" in (run_dir / "bake.log").read_text()
    dockerfile = (run_dir / "dockerfiles" / f"{CELL.name}.Dockerfile").read_text()
    assert ": imagegen pull" in dockerfile.splitlines()[1]


def test_pushing_builder_images_returns_their_digests(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fake = BuilderBake()
    monkeypatch.setattr(engine, "bake", fake)
    cells = [tiny_cell(python="3.11"), tiny_cell(python="3.12")]
    digests = prebuilt.bake_builders(cells, REG, work=tmp_path / "work", push=True, ca_bundle=None, builder=None,
                                     cache_from=[], cache_to=["type=inline"], say=lambda m: None)
    assert digests == {c.name: DIGEST for c in cells}
    data = fake.calls[0]["data"]
    assert all(t["output"] == ["type=image,push=true"] and t["cache-to"] == ["type=inline"]
               for t in data["target"].values())
    (run_dir,) = (tmp_path / "work" / "runs").iterdir()
    assert "-push-" in run_dir.name and fake.calls[0]["metadata"] == run_dir / "metadata.json"


def test_a_push_the_registry_refuses_says_how_to_log_in(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(engine, "bake", BuilderBake(
        "#12 pushing layers\nERROR: failed to push registry.example:5000/ml/imagegen-tiny-kernel: unauthorized:"
        " authentication required\n"))
    with pytest.raises(RegistryError) as info:
        prebuilt.bake_builders([CELL], REG, work=tmp_path / "work", push=True, ca_bundle=None, builder=None,
                               cache_from=[], cache_to=[], say=lambda m: None)
    assert "registry.example:5000 refused the credentials" in str(info.value)
    assert "docker login registry.example:5000" in str(info.value) and info.value.exit_code == 7


def test_a_failed_builder_bake_names_its_error_lines_and_log(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(engine, "bake", BuilderBake(
        "#9 [builder 4/9] RUN pip install torch\n#9 12.0 error: no matching distribution for torch==2.11.0\n"
        "#9 ERROR: process did not complete successfully: exit code: 1\n"
        "ERROR: target tiny: failed to solve: process did not complete successfully\n"))
    with pytest.raises(BuildError) as info:
        prebuilt.bake_builders([CELL], REG, work=tmp_path / "work", push=False, ca_bundle=None, builder=None,
                               cache_from=[], cache_to=[], say=lambda m: None)
    (run_dir,) = (tmp_path / "work" / "runs").iterdir()
    message = str(info.value)
    assert message.startswith("baking the builder image(s) failed: #9 12.0 error: no matching distribution")
    assert " | ERROR: target tiny: failed to solve" in message and message.endswith(f"(log: {run_dir / 'bake.log'})")
    assert "\n" not in message and info.value.exit_code == 5


# ------------------------------------------------------------------------------------- pull


class Docker:
    """Stands in for the registry pull and `docker run` of a builder image: the audit step writes
    ``audit`` (or fails with ``audit_log``), the build step copies ``wheel`` into the /out mount
    (or fails with ``build_rc`` and ``build_log``)."""

    def __init__(self, *, audit=None, audit_rc=0, audit_log="", build_rc=0, build_log="compiled\n", wheel=WHEEL,
                 missing=False) -> None:
        self.audit = audit_report(["sm_80", "sm_90"], ["compute_90"]) if audit is None else audit
        self.audit_rc, self.audit_log = audit_rc, audit_log
        self.build_rc, self.build_log, self.wheel = build_rc, build_log, wheel
        self.missing = missing
        self.pulled: list[str] = []
        self.runs: list[list[str]] = []

    def pull(self, ref: str, platform: str | None = None) -> str:
        self.pulled.append(ref if platform is None else f"{ref} ({platform})")
        if self.missing:
            raise ImageMissing(f"{ref} is not in the registry (push it with imagegen push)")
        return DIGEST

    def run_container(self, args: list[str], log_path: Path) -> subprocess.CompletedProcess:
        self.runs.append(list(args))
        (out,) = [Path(a.split(":", 1)[0]) for a in args if a.endswith(":/out")]
        if "audit" in args:
            log_path.write_text(self.audit_log)
            if self.audit_rc == 0:
                (out / "audit.json").write_text(json.dumps(self.audit))
            return subprocess.CompletedProcess(args, self.audit_rc)
        log_path.write_text(self.build_log)
        if self.build_rc == 0 and self.wheel is not None:
            (out / self.wheel.name).write_bytes(self.wheel.read_bytes())
        return subprocess.CompletedProcess(args, self.build_rc)


@pytest.fixture
def docker(monkeypatch, tmp_path):
    fake = Docker()
    monkeypatch.setattr(registry, "pull", fake.pull)
    monkeypatch.setattr(engine, "run_container", fake.run_container)
    monkeypatch.setattr(jobs, "host", lambda: jobs.Host(cpus=16, mem_gb=64))
    monkeypatch.delenv("IMAGEGEN_CCACHE_VOLUME", raising=False)
    monkeypatch.chdir(tmp_path)
    return fake


def _pull(tmp_path, cells=(CELL,), **kw):
    kw.setdefault("gpus", "none")
    kw.setdefault("lock", Lock(tmp_path / "imagegen.lock"))
    kw.setdefault("say", lambda m: None)
    return prebuilt.pull(Plan(cells=list(cells)), REG, out=tmp_path / "out", work=tmp_path / "work", finish=finish,
                         **kw)


def _value(args: list[str], flag_value_prefix: str) -> str:
    return next(a for a in args if a.startswith(flag_value_prefix))


def test_pull_audits_then_compiles_in_the_pulled_image_and_collects_the_wheel(tmp_path, docker):
    said: list[str] = []
    (result,) = _pull(tmp_path, max_jobs=3, nvcc_threads=2, say=said.append)
    ref = image_ref(CELL, REG)
    assert result.status == "built" and result.wheel == wheelhouse.cell_dir(tmp_path / "out", CELL) / WHEEL.name
    assert docker.pulled == [ref] and f"[{CELL.name}] pulled {ref} ({DIGEST})" in said
    audit_run, build_run = docker.runs
    (run_dir,) = (tmp_path / "work" / "runs").iterdir()
    assert "-pull-" in run_dir.name
    assert audit_run[:2] == ["--rm", "--init"] and audit_run[-4:] == [ref, "audit", "--out", "/out/audit.json"]
    assert f"{run_dir / 'pull' / (CELL.name + '--audit')}:/out" in audit_run and "--gpus" not in audit_run
    assert build_run[-4:] == [ref, "build", "--out", "/out"] and "--gpus" not in build_run  # --gpus none
    assert f"{run_dir / 'pull' / CELL.name}:/out" in build_run
    assert "imagegen-ccache:/root/.cache/ccache" in build_run
    assert [_value(build_run, p) for p in ("TORCH_CUDA_ARCH_LIST=", "MAX_JOBS=", "NVCC_THREADS=")] == [
        "TORCH_CUDA_ARCH_LIST=8.0;9.0+PTX", "MAX_JOBS=3", "NVCC_THREADS=2"]
    assert build_run[build_run.index("MAX_JOBS=3") - 1] == "-e"
    entry = wheelhouse.read_manifest(result.wheel.parent)["cells"][CELL.name]
    assert entry["image"] == ref and entry["audit"]["verdict"] == "ok"
    assert entry["inputs"] == inputs_hash(CELL, cell_document(CELL))
    assert Path(entry["log"]).read_text() == "compiled\n"


def test_the_lock_pins_the_image_that_is_pulled_and_run(tmp_path, docker):
    ref = image_ref(CELL, REG)
    lock = Lock(tmp_path / "imagegen.lock", builder_images={ref: f"{ref}@{DIGEST}"})
    (result,) = _pull(tmp_path, lock=lock, audit=False)
    assert result.status == "built" and docker.pulled == [f"{ref}@{DIGEST}"]
    (build_run,) = docker.runs  # --no-audit: the compile alone
    assert build_run[-4:] == [f"{ref}@{DIGEST}", "build", "--out", "/out"]
    assert wheelhouse.read_manifest(result.wheel.parent)["cells"][CELL.name]["image"] == f"{ref}@{DIGEST}"


def test_gpus_all_reaches_the_compile_but_not_the_audit(tmp_path, docker):
    (result,) = _pull(tmp_path, gpus="all")
    audit_run, build_run = docker.runs
    assert "--gpus" not in audit_run and build_run[build_run.index("--gpus") + 1] == "all"
    assert result.status == "built"


def test_up_to_date_and_refused_cells_touch_no_registry(tmp_path, docker):
    other = tiny_cell("9.0")
    collect.place(tmp_path / "out", CELL, WHEEL, inputs=inputs_hash(CELL, cell_document(CELL)), record={})
    said: list[str] = []
    (same,) = _pull(tmp_path, say=said.append)
    assert same.status == "up-to-date" and same.wheel == wheelhouse.cell_dir(tmp_path / "out", CELL) / WHEEL.name
    (refused,) = _pull(tmp_path, cells=[other], say=said.append)  # same wheel name, other archs
    assert refused.status == "refused" and "would be replaced by the wheel for archs 9.0" in refused.error
    assert docker.pulled == [] and docker.runs == []
    # The refusal is said once, when the results are reported (executors.results.report), not here too.
    assert said == [f"[{CELL.name}] up to date: {same.wheel}"]


def test_a_missing_image_without_fallback_is_an_error(tmp_path, docker):
    docker.missing = True
    with pytest.raises(ImageMissing, match="is not in the registry"):
        _pull(tmp_path, fallback=False)
    assert docker.runs == []


def test_a_missing_image_is_built_locally_from_the_same_dockerfile(tmp_path, docker, monkeypatch):
    docker.missing = True
    baked = BuilderBake()
    monkeypatch.setattr(engine, "bake", baked)
    said: list[str] = []
    (result,) = _pull(tmp_path, say=said.append)
    ref = image_ref(CELL, REG)
    assert result.status == "built" and docker.runs[-1][-4] == ref
    (call,) = baked.calls
    assert call["data"]["target"][CELL.name]["output"] == ["type=docker"]  # loaded, not pushed
    assert any(line.startswith(f"[{CELL.name}] no prebuilt image {ref} in the registry: building it locally")
               for line in said)


# `docker buildx inspect` of a builder without QEMU's binfmt handler: it runs amd64 steps only.
NO_QEMU = "Name: default\nDriver: docker\nPlatforms: linux/amd64, linux/amd64/v2, linux/386\n"


@pytest.fixture
def no_qemu(monkeypatch):
    monkeypatch.setattr(engine, "docker", lambda *a, **k: subprocess.CompletedProcess(["docker", *a], 0, NO_QEMU, ""))
    return dataclasses.replace(CELL, platform="linux/arm64")


def test_an_arm64_image_missing_from_the_registry_is_said_first_even_where_it_could_not_run(tmp_path, docker,
                                                                                           no_qemu):
    # Pulling needs no QEMU: the registry is asked before the platform is judged (exit 7, not 5).
    docker.missing = True
    with pytest.raises(ImageMissing, match="is not in the registry"):
        _pull(tmp_path, cells=[no_qemu], fallback=False)
    assert docker.pulled == [f"{image_ref(no_qemu, REG)} (linux/arm64)"] and docker.runs == []


def test_a_pulled_arm64_image_this_engine_cannot_run_fails_before_it_runs(tmp_path, docker, no_qemu):
    said: list[str] = []
    (result,) = _pull(tmp_path, cells=[no_qemu], say=said.append)
    assert result.status == "refused" and "cannot run linux/arm64 build steps" in result.error
    assert "imagegen setup qemu" in result.error and not any("setup qemu" in line for line in said)
    assert len(docker.pulled) == 1 and docker.runs == []


def test_a_missing_arm64_image_is_not_built_where_its_steps_cannot_run(tmp_path, docker, no_qemu, monkeypatch):
    docker.missing = True
    monkeypatch.setattr(engine, "bake", lambda *a, **k: pytest.fail("nothing is built for a platform it cannot run"))
    said: list[str] = []
    (result,) = _pull(tmp_path, cells=[no_qemu], say=said.append)
    assert result.status == "refused" and "cannot run linux/arm64 build steps" in result.error
    assert result.error.startswith("no prebuilt image ") and docker.runs == []


def test_a_refused_audit_fails_the_cell_without_compiling(tmp_path, docker):
    docker.audit = audit_report(["sm_80"])
    said: list[str] = []
    (result,) = _pull(tmp_path, say=said.append)
    assert result.status == "failed" and result.audit["verdict"] == "refused"
    assert result.error.startswith(f"cannot build {CELL.describe()}: the gencode audit refuses it: ")
    assert len(docker.runs) == 1 and result.log.name == f"{CELL.name}.audit.log"
    assert f"[{CELL.name}] audit (1.5 s): REFUSED; what the build would compile:" in said


@pytest.mark.parametrize("rc, log, says", [
    (2, "usage: imagegen_build.py [-h]\nimagegen_build.py: error: argument step: invalid choice: 'audit'\n",
     "the image predates imagegen's audit step (push it again with this imagegen)"),
    (137, "Killed\n", "exit 137"),
])
def test_an_audit_that_cannot_run_in_the_image_says_why(tmp_path, docker, rc, log, says):
    docker.audit_rc, docker.audit_log = rc, log
    (result,) = _pull(tmp_path)
    assert result.status == "failed" and len(docker.runs) == 1
    assert result.error == f"the gencode audit could not run in {image_ref(CELL, REG)}: {says} (--no-audit skips it)"
    assert result.log_tail == log.splitlines()


def test_an_unreadable_audit_report_fails_the_cell(tmp_path, docker):
    docker.audit = ["not", "an", "object"]
    (result,) = _pull(tmp_path)
    assert result.status == "failed"
    assert result.error == "the audit report is not a JSON object (--no-audit skips the audit)"


def test_a_builder_that_exits_non_zero_is_a_failed_cell_with_its_tail(tmp_path, docker):
    docker.build_rc = 3
    docker.build_log = "".join(f"line {i}\n" for i in range(30)) + "csrc/add_one.cu(7): error: x\n"
    (result,) = _pull(tmp_path)
    assert result.status == "failed" and result.error == f"the builder image {image_ref(CELL, REG)} exited 3"
    assert result.log_tail[-1] == "csrc/add_one.cu(7): error: x" and len(result.log_tail) == 15
    assert result.audit["verdict"] == "ok" and not (tmp_path / "out").exists()


def test_a_docker_that_cannot_hand_out_gpus_stops_the_whole_pull(tmp_path, docker):
    docker.build_rc = 125
    docker.build_log = ("docker: Error response from daemon: could not select device driver \"\" with capabilities:"
                        " [[gpu]].\n")
    with pytest.raises(EngineError) as info:
        _pull(tmp_path, cells=[tiny_cell(python="3.11"), tiny_cell(python="3.12")], gpus="all")
    assert str(info.value) == f"docker cannot give containers the GPUs (--gpus all): {prebuilt.GPU_TOOLKIT_FIX}"
    assert len(docker.runs) == 2  # the first cell's audit and compile: the second cell never started
    # Without --gpus the same exit is the cell's own failure.
    docker.runs.clear()
    (result,) = _pull(tmp_path)
    assert result.status == "failed" and result.error.endswith("exited 125")


def test_a_builder_that_leaves_no_wheel_fails_in_finish(tmp_path, docker):
    docker.wheel = None
    (result,) = _pull(tmp_path)
    assert result.status == "failed" and result.error == "expected one wheel, got []"
