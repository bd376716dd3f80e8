"""Unit tests for the pieces of a build that need no engine: job sizing, bake-log splitting, the
output folder and manifest, wheel verification on a real wheel, and the in-build script's own arch
formatting and wheel retagging."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from imagegen import collect, wheelhouse
from imagegen.executors.bake_log import TargetLogs
from imagegen.fatbin import read_so
from imagegen.model import jobs
from imagegen.model.arch_format import to_cmake, to_dotted_list, to_gencode, to_numeric_list, to_torch_arch_list
from imagegen.model.arch_parse import parse_arch_list
from imagegen.model.catalogue import load_catalogue
from imagegen.plan import make_cell
from imagegen.render.dockerfile import builder_script
from imagegen.verify import VerifyError, verify_wheel
from tests.unit.builder_script import builder_module

WHEEL = next((Path(__file__).parent.parent / "fixtures" / "wheels").glob("tiny_kernel-*.whl"))




B = builder_module("imagegen_build")


# ---------------------------------------------------------------------------------------- jobs


def test_small_machine_gets_seed_002_settings():
    s = jobs.settings_for(5.0, 4, jobs.Host(cpus=16, mem_gb=6))
    assert (s.max_jobs, s.nvcc_threads) == (1, 1)


def test_jobs_follow_memory_and_cores():
    assert jobs.settings_for(2.0, 4, jobs.Host(cpus=16, mem_gb=64)).max_jobs == 8
    assert jobs.settings_for(2.0, 4, jobs.Host(cpus=4, mem_gb=256)).max_jobs == 4
    shared = jobs.settings_for(2.0, 4, jobs.Host(cpus=16, mem_gb=64), share=2)
    assert shared.max_jobs == 4 and shared.peak_gb == 32


def test_jobs_count_only_the_nvcc_threads_that_have_work():
    # nvcc --threads runs one thread per -gencode target: a one-arch build of a recipe that pins
    # 8 threads needs one thread's memory per job, a four-target build four threads' worth.
    h = jobs.Host(cpus=16, mem_gb=100)
    assert jobs.settings_for(2.5, 8, h, targets=1).max_jobs == 16
    assert jobs.settings_for(2.5, 8, h, targets=4).max_jobs == 10
    assert jobs.settings_for(2.5, 8, h).max_jobs == 5  # unknown: every thread counts
    assert parse_arch_list("8.0;9.0+PTX").gencode_targets == 3
    assert B.auto_jobs({"memory_per_thread_gb": 2.5}, 8, 1) >= B.auto_jobs({"memory_per_thread_gb": 2.5}, 8, 4)


def test_explicit_values_win():
    s = jobs.settings_for(5.0, 4, jobs.Host(cpus=2, mem_gb=4), max_jobs=3, nvcc_threads=2)
    assert (s.max_jobs, s.nvcc_threads) == (3, 2)


def test_batch_size_bounds():
    assert jobs.batch_size(10, jobs.Host(cpus=2, mem_gb=24), 5.0) == 2
    assert jobs.batch_size(1, jobs.Host(cpus=64, mem_gb=512), 5.0) == 1
    assert jobs.batch_size(10, jobs.Host(cpus=64, mem_gb=4), 5.0) == 1


@given(st.integers(1, 256), st.integers(1, 8))
def test_extension_split_stays_within_the_budget_and_agrees_with_the_builder(total, ext_max):
    parallel, per_ext = jobs.split_extensions(total, ext_max)
    assert 1 <= parallel <= ext_max and parallel * per_ext <= total
    assert parallel == min(ext_max, total)  # as many extensions at once as the budget allows
    assert B.split_extensions(total, ext_max) == (parallel, per_ext)


def _sage_cell_doc(**extra):
    from imagegen.render.dockerfile import cell_document
    recipe = load_catalogue().get("sageattention")
    doc = cell_document(make_cell(recipe, recipe.version(None), "2.11", "13.0", "3.11", parse_arch_list("9.0"),
                                  "pypi"))
    doc.update(extra)
    return doc


def test_builder_splits_the_job_budget_between_sage_extensions(monkeypatch):
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    monkeypatch.setenv("MAX_JOBS", "16")
    monkeypatch.delenv("EXT_PARALLEL", raising=False)
    env = B.build_env(_sage_cell_doc())
    assert (env["EXT_PARALLEL"], env["MAX_JOBS"]) == ("4", "4")
    monkeypatch.setenv("MAX_JOBS", "1")  # seed 002's settings: one extension, one job
    env = B.build_env(_sage_cell_doc())
    assert (env["EXT_PARALLEL"], env["MAX_JOBS"]) == ("1", "1")


def test_job_settings_from_imagegens_bake_come_as_a_secret_and_win(monkeypatch, tmp_path):
    # imagegen's bake hands each batch's MAX_JOBS/NVCC_THREADS in the imagegen_jobs secret (no cache
    # key, unlike a build arg): it wins over the ARGs' environment; junk in it is ignored.
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    monkeypatch.setattr(B, "SECRETS", str(secrets))
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    monkeypatch.setenv("MAX_JOBS", "16")
    monkeypatch.setenv("NVCC_THREADS", "8")
    monkeypatch.delenv("EXT_PARALLEL", raising=False)
    assert B.jobs_from_secret() == {}  # no secret: the ARGs/environment as before
    (secrets / "imagegen_jobs").write_text("MAX_JOBS=2\nNVCC_THREADS=3\nPATH=/evil\nMAX_JOBS_X=9\n")
    assert B.jobs_from_secret() == {"MAX_JOBS": "2", "NVCC_THREADS": "3"}
    env = B.build_env(_sage_cell_doc())
    assert (env["EXT_PARALLEL"], env["MAX_JOBS"]) == ("2", "1") and env["PATH"] != "/evil"
    (secrets / "imagegen_jobs").write_text("MAX_JOBS=0\nNVCC_THREADS=lots\n")
    assert B.jobs_from_secret() == {}


def test_a_bake_run_hands_every_target_its_job_secret(tmp_path):
    from imagegen.executors.bake_run import prepare_run
    from imagegen.resources.builder.imagegen_rules import JOBS_SECRET

    recipe = load_catalogue().get("sageattention")
    cell = make_cell(recipe, recipe.version(None), "2.11", "13.0", "3.11", parse_arch_list("9.0"), "pypi")
    run = prepare_run([cell], tmp_path / "work")
    data = json.loads(run.bake_file.read_text())
    assert set(data["target"]) == {cell.name, cell.name + "--log", cell.name + "--audit"}
    for target in data["target"].values():
        assert f"id={JOBS_SECRET},src={run.jobs_file(cell.name)}" in target["secret"]
        assert any(s.startswith("id=pip_cert,") for s in target["secret"])
        # Never a number in a build arg (a cache key): the ARG stays the variable run_bake blanks.
        assert not str(target.get("args", {}).get("MAX_JOBS", "")).isdigit()
    assert run.jobs_file(cell.name).is_file()
    # The compile step mounts it; the Dockerfile still takes ARGs for a plain `docker buildx build`.
    dockerfile = next((run.dir / "dockerfiles").glob("*.Dockerfile")).read_text()
    assert "--mount=type=secret,id=imagegen_jobs" in dockerfile and "ARG MAX_JOBS=" in dockerfile


def test_builder_leaves_path_alone_when_cuda_homes_nvcc_is_already_first(tmp_path):
    def toolkit(name):
        (tmp_path / name / "bin").mkdir(parents=True)
        nvcc = tmp_path / name / "bin" / "nvcc"
        nvcc.write_text("#!/bin/sh\n")
        nvcc.chmod(0o755)
        return tmp_path / name
    home, other = toolkit("cuda-13.0"), toolkit("cuda-12.8")
    (tmp_path / "cuda").symlink_to(home)  # /usr/local/cuda -> cuda-13.0, as on most hosts
    user_path = os.pathsep.join([str(tmp_path / "cuda" / "bin"), "/usr/bin"])
    # The user's nvcc is CUDA_HOME's (through the symlink): their PATH, untouched, so that a plain
    # `pip wheel` with the --print-env variables repeats the build exactly.
    assert B.path_with_nvcc(user_path, str(home)) == user_path
    # Another toolkit's nvcc first, or none at all: CUDA_HOME's bin goes in front.
    other_first = os.pathsep.join([str(other / "bin"), str(home / "bin")])
    assert B.path_with_nvcc(other_first, str(home)).split(os.pathsep) == [str(home / "bin"), str(other / "bin"), str(home / "bin")]
    assert B.path_with_nvcc("/usr/bin", str(home)).split(os.pathsep)[0] == str(home / "bin")
    assert B.path_with_nvcc("", str(home)) == str(home / "bin")


def _sm90_patch():
    patch = load_catalogue().get("sageattention").version("2.2.0").patches[0]
    return {"name": patch.name, "reason": patch.reason, "text": patch.text}


def _sm90_tree(tree):
    """The patched region of v2.2.0's sm90_compile.py, enough context for the hunk to apply."""
    (tree / "sageattention").mkdir(parents=True)
    body = ["" for _ in range(73)] + [
        "", "", '@torch.library.register_fake("sageattention_sm90::qk_int8_sv_f8_accum_f32_fuse_v_scale_attn_inst_buf")',
        "def qk_int8_sv_f8_accum_f32_fuse_v_scale_attn_inst_buf(",
        "    query: torch.Tensor, ", "    key: torch.Tensor, ", "    value: torch.Tensor, "]
    target = tree / "sageattention" / "sm90_compile.py"
    target.write_text("\n".join(body[1:]) + "\n")
    return target


@pytest.mark.parametrize("layout", ["vendored", "own-checkout"])
def test_patches_apply_to_a_tree_inside_a_git_work_tree(tmp_path, layout):
    # Found on the H100: a --src-dir inside the user's own repository got "applying patch" and an
    # unpatched wheel, because `git apply` read the patch's paths from the outer repository's root
    # and skipped them all with exit 0.
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
    outer = tmp_path / "project"
    outer.mkdir()
    subprocess.run([*git, "init", "-q", str(outer)], check=True)
    tree = outer / "vendor" / "SageAttention"
    target = _sm90_tree(tree)
    if layout == "own-checkout":  # the tree is a clone of its own: its .git is the one that counts
        subprocess.run([*git, "init", "-q", str(tree)], check=True)
        subprocess.run([*git, "-C", str(tree), "add", "-A"], check=True)
        subprocess.run([*git, "-C", str(tree), "commit", "-qm", "v2.2.0"], check=True)
    B.apply_patch(_sm90_patch(), str(tree))
    assert "_fake_impl(" in target.read_text()


def test_patches_apply_once_and_a_foreign_tree_is_refused(tmp_path, capsys):
    doc = _sm90_patch()
    tree = tmp_path / "src"
    target = _sm90_tree(tree)
    B.apply_patch(doc, str(tree))
    assert "_fake_impl(" in target.read_text()
    B.apply_patch(doc, str(tree))  # the same --src-dir fetched again: already applied, not an error
    assert "already applied" in capsys.readouterr().out
    target.write_text("something else\n")
    with pytest.raises(SystemExit):
        B.apply_patch(doc, str(tree))


# ------------------------------------------------------------------------------------ bake logs


def test_target_logs_split_and_detect_failure(tmp_path):
    logs = TargetLogs(tmp_path, ["a-1", "b-2"])
    steps = [logs.feed(line) for line in [
        "#5 [a-1 builder 3/3] RUN python x",
        "#5 [a-1 builder 3/3] RUN python x",  # repeated header: no second progress line
        "#5 12.0 foo.cu(4): error: expected a declaration",
        "#6 [b-2 base 5/5] RUN pip install",
        "#6 1.0 Collecting torch",
        "#5 ERROR: process \"x\" did not complete successfully: exit code: 1",
        "#6 CANCELED",
    ]]
    assert [s for s in steps if s] == [("a-1", "builder 3/3 RUN python x"), ("b-2", "base 5/5 RUN pip install")]
    assert logs.failed == {"a-1"}
    assert "foo.cu(4): error: expected a declaration" in "\n".join(logs.tail("a-1"))
    logs.close()
    assert (tmp_path / "b-2.log").read_text().count("\n") == 3


# ------------------------------------------------------------------------------ output folder


def _cell():
    r = load_catalogue().get("sage")
    return make_cell(r, r.version(None), "2.8", "12.8", "3.12", parse_arch_list("9.0"), "cuda")


def test_publish_is_atomic_and_up_to_date_checks_hash(tmp_path):
    cell = _cell()
    out = tmp_path / "out"
    dest = collect.publish(out, cell, WHEEL, inputs="abc", record={"duration_s": 1.0})
    assert dest.parent == out / "sageattention-2.2.0" / "torch2.8" / "cu128"
    assert not list(out.rglob("*.partial"))
    manifest = json.loads((dest.parent / "manifest.json").read_text())
    assert manifest["cells"][cell.name]["sha256"] == wheelhouse.sha256(WHEEL)
    assert wheelhouse.up_to_date(out, cell, "abc") == dest
    assert wheelhouse.up_to_date(out, cell, "other-inputs") is None
    dest.write_bytes(b"tampered")
    assert wheelhouse.up_to_date(out, cell, "abc") is None


# ---------------------------------------------------------------------------------- verify


def test_fatbin_reader_on_a_real_wheel():
    with zipfile.ZipFile(WHEEL) as zf:
        so = next(n for n in zf.namelist() if n.endswith(".so"))
        entries = read_so(zf.read(so))
    assert sorted(map(str, entries)) == ["compute_90", "sm_80", "sm_90"]
    report = verify_wheel(WHEEL, parse_arch_list("8.0;9.0+PTX"), cuobjdump=None)
    assert report.ok and report.version == "0.1.0+cu130torch2.11"


def test_missing_arch_fails_verification():
    report = verify_wheel(WHEEL, parse_arch_list("8.6;9.0;12.0+PTX"), cuobjdump=None)
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


# ------------------------------------------------------------------------- the in-build script


def test_builder_script_is_what_render_embeds():
    assert builder_script() == (Path(B.__file__)).read_text()


CANONICAL = st.lists(st.sampled_from(["7.5", "8.0", "8.6", "8.9", "9.0", "9.0a", "10.0", "10.0a", "10.0f", "12.0",
                                      "12.0a", "12.1"]), min_size=1, max_size=5)


@settings(max_examples=200, deadline=None)
@given(CANONICAL, st.lists(st.booleans(), min_size=5, max_size=5))
def test_builder_formats_agree_with_the_arch_model(entries, ptx_flags):
    text = ";".join(e + ("+PTX" if p else "") for e, p in zip(entries, ptx_flags))
    archs = parse_arch_list(text)
    canonical = str(archs)  # what the Dockerfile's ARG carries
    parsed = B.parse_archs(canonical)
    assert B.format_archs(parsed, "numeric") == to_numeric_list(archs)
    assert B.format_archs(parsed, "numeric", keep_variant=True) == to_numeric_list(archs, keep_variant=True)
    assert B.format_archs(parsed, "dotted") == to_dotted_list(archs)
    assert B.format_archs(parsed, "cmake") == to_cmake(archs)
    assert B.format_archs(parsed, "gencode") == " ".join(to_gencode(archs))
    if not any(a.variant == "f" for a in archs):
        assert B.format_archs(parsed, "torch") == to_torch_arch_list(archs)


def test_retag_rewrites_name_metadata_and_record(tmp_path):
    src = tmp_path / "demo-1.0-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(src, "w") as zf:
        zf.writestr("demo/__init__.py", "")
        zf.writestr("demo-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n")
        zf.writestr("demo-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\n")
        zf.writestr("demo-1.0.dist-info/RECORD", "")
    out = Path(B.retag(str(src), "cu128torch2.8", str(tmp_path)))
    assert out.name == "demo-1.0+cu128torch2.8-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(out) as zf:
        names = zf.namelist()
        assert "demo-1.0+cu128torch2.8.dist-info/METADATA" in names
        assert "Version: 1.0+cu128torch2.8" in zf.read("demo-1.0+cu128torch2.8.dist-info/METADATA").decode()
        record = zf.read("demo-1.0+cu128torch2.8.dist-info/RECORD").decode()
        assert "demo/__init__.py,sha256=" in record and not any(n.startswith("demo-1.0.dist-info") for n in names)
    # A wheel that already has a local version (the package's own knob) is left alone.
    assert B.retag(str(out), "x", str(tmp_path)) == str(out)


def test_retag_copies_compressed_entries_as_they_are_and_pip_installs_the_result(tmp_path):
    """The .so files are copied without a second deflate (seconds on a CUDA wheel), and the result is
    still a wheel that zip readers and pip accept."""
    payload = os.urandom(1 << 16) * 8 + bytes(1 << 18)  # compressible, like a cubin
    src = tmp_path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(src, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("demo/__init__.py", "VALUE = 42\n")
        zf.writestr("demo/_C.so", payload)
        zf.writestr("demo-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n")
        zf.writestr("demo-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr("demo-1.0.dist-info/RECORD", "")
    out = Path(B.retag(str(src), "cu130torch2.11", str(tmp_path)))
    with zipfile.ZipFile(src) as before, zipfile.ZipFile(out) as after:
        assert after.testzip() is None
        assert after.read("demo/_C.so") == payload
        assert after.getinfo("demo/_C.so").compress_size == before.getinfo("demo/_C.so").compress_size < len(payload)
        record = after.read("demo-1.0+cu130torch2.11.dist-info/RECORD").decode()
        digest = base64.urlsafe_b64encode(hashlib.sha256(payload).digest()).rstrip(b"=").decode()
        assert f"demo/_C.so,sha256={digest},{len(payload)}" in record
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(target), str(out)],
                   check=True)
    assert (target / "demo" / "_C.so").read_bytes() == payload
    assert (target / "demo-1.0+cu130torch2.11.dist-info").is_dir()


def test_so_summary_lists_repeated_entries_once():
    # More in tests/unit/test_verify.py (counts where they differ, archs not requested).
    from imagegen.fatbin import FatbinEntry
    from imagegen.verify import SoReport

    so = verify_wheel(WHEEL, parse_arch_list("8.0")).extensions[0]
    doubled = SoReport(so.name, so.entries + so.entries)
    assert doubled.summary() == so.summary() == "sm_80, sm_90, compute_90"
    assert doubled.counts() == {"sm_80": 2, "sm_90": 2, "compute_90": 2}
    assert isinstance(so.entries[0], FatbinEntry)


def test_reproducible_digest_ignores_only_nvcc_temp_names():
    from imagegen.fatbin import reproducible_digest

    a = b"\x7fELF..._GLOBAL__sub_I_tmpxft_0000001d_00000000_6_add_one.compute_90.cudafe1.cpp\x00rest"
    b = a.replace(b"0000001d", b"0000001e")
    assert a != b and reproducible_digest(a) == reproducible_digest(b)
    assert reproducible_digest(a) != reproducible_digest(a.replace(b"rest", b"resT"))  # any other byte counts
    assert reproducible_digest(a) != reproducible_digest(a.replace(b"add_one", b"add_two"))


# ------------------------------------------------------------------------------- import test


def _pure_wheel(path: Path, body: str) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("demo/__init__.py", body)
        zf.writestr("demo-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n")
    return path


def test_import_test_loads_the_wheel_not_the_source_tree(tmp_path, monkeypatch):
    """A started-early importer imports the unpacked wheel from an empty folder: a same-named package
    in the caller's directory (the source tree) does not shadow it, and a failing import is an error."""
    from imagegen.errors import BuildError
    from imagegen.executors.import_test import Importer, import_test

    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "__init__.py").write_text("raise ImportError('the source tree, not the wheel')\n")
    monkeypatch.chdir(tmp_path)
    good = _pure_wheel(tmp_path / "demo-1.0-py3-none-any.whl", "import sys\nassert sys.modules\n")
    with Importer(sys.executable) as started_early:
        assert import_test(good, ["demo"], sys.executable, importer=started_early) == {"demo": "ok"}
    assert import_test(good, ["demo", "json"], sys.executable) == {"demo": "ok", "json": "ok"}
    (tmp_path / "bad").mkdir()
    bad = _pure_wheel(tmp_path / "bad" / "demo-1.0-py3-none-any.whl", "raise RuntimeError('kernel image missing')\n")
    with pytest.raises(BuildError, match=r"`import demo` failed: RuntimeError: kernel image missing"):
        import_test(bad, ["demo"], sys.executable)
    driverless = _pure_wheel(tmp_path / "bad" / "demo-1.0-py3-none-any.whl",
                             "raise ImportError('libcuda.so.1: cannot open shared object file')\n")
    assert import_test(driverless, ["demo"], sys.executable)["demo"].startswith("skipped: needs a GPU driver")


def test_importer_that_dies_on_start_reports_why(tmp_path):
    from imagegen.errors import BuildError
    from imagegen.executors.import_test import Importer

    wheel = _pure_wheel(tmp_path / "demo-1.0-py3-none-any.whl", "")
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\necho 'torch: undefined symbol cudaGetDriverEntryPoint' >&2\nexit 1\n")
    broken.chmod(0o755)
    with Importer(str(broken)) as importer, pytest.raises(BuildError, match="the import test did not run: .*undefined symbol"):
        importer.run(wheel, ["demo"])


# ------------------------------------------------------------------------- audit pre-flight (engine)


def test_every_cell_gets_log_and_audit_companion_targets(tmp_path, monkeypatch):
    from imagegen.executors.bake_log import AUDIT_SUFFIX, LOG_SUFFIX, cell_of
    from imagegen.executors.bake_run import prepare_run
    from imagegen.plan import Plan

    monkeypatch.chdir(tmp_path)
    cell = _cell()
    run = prepare_run([cell], tmp_path / "work", ca_bundle=None, cache_from=["type=local,src=/c"],
                      cache_to=["type=inline"])
    data = json.loads(run.bake_file.read_text())
    wheel, log, audit = (data["target"][cell.name + s] for s in ("", LOG_SUFFIX, AUDIT_SUFFIX))
    assert (wheel["target"], log["target"], audit["target"]) == ("wheels", "buildlog", "audit-report")
    assert audit["output"] == [f"type=local,dest={run.stage / (cell.name + AUDIT_SUFFIX)}"]
    # The companions build the same Dockerfile with the same args, so they share the cell's layers.
    assert audit["dockerfile"] == wheel["dockerfile"] and audit["args"] == wheel["args"]
    assert all(t["cache-from"] == ["type=local,src=/c"] for t in (wheel, log, audit))
    assert "cache-to" in wheel and "cache-to" not in log and "cache-to" not in audit
    # The Dockerfile has the stage the audit target names.
    dockerfile = (Path(wheel["context"]) / wheel["dockerfile"]).read_text()
    assert "FROM scratch AS audit-report" in dockerfile and "FROM builder AS audit" in dockerfile
    assert {cell_of(n) for n in data["target"]} == {cell.name}
    assert cell_of("x--audit--log") == "x--audit" and Plan(cells=[cell]).buildable == [cell]


def test_audit_target_lines_go_to_the_cells_log(tmp_path):
    logs = TargetLogs(tmp_path, ["a-1"])
    step = logs.feed("#7 [a-1--audit audit 1/1] RUN python /imagegen/imagegen_build.py audit --out /imagegen/audit/audit.json")
    assert step is not None and step[0] == "a-1" and step[1].startswith("audit 1/1 RUN python /imagegen/imagegen_build.py audit")
    logs.feed("#7 3.2 [imagegen] audit: ok in 3.1 s: 1 extension(s)")
    logs.feed("ERROR: target a-1--audit: failed to solve: boom")
    assert logs.failed == {"a-1"}
    logs.close()
    assert "audit: ok in 3.1 s" in (tmp_path / "a-1.log").read_text()


def test_a_sole_targets_unnamed_vertices_are_its_own(tmp_path):
    # bake prefixes vertex names with the target only when it runs several targets.
    logs = TargetLogs(tmp_path, ["a-1", "b-2"])
    logs.sole = "a-1"
    assert logs.feed("#3 [internal] load metadata for docker.io/x") is None
    assert logs.feed("#11 [audit 1/1] RUN python /imagegen/imagegen_build.py audit --out x")[0] == "a-1"
    logs.feed("#11 0.5 [imagegen] audit: ok in 0.4 s")
    logs.close()
    text = (tmp_path / "a-1.log").read_text()
    assert "imagegen_build.py audit" in text and "audit: ok" in text and "load metadata" not in text
    assert (tmp_path / "b-2.log").read_text() == ""
