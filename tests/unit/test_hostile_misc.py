"""Issue 32, items 4 and 9-14: `cdi-spec` mounts only the driver's files; a wheelhouse layout every
reader walks, checked alike by every command; no input silently ignored; `ci github` destinations
checked as `publish --to` checks them; `repair` refuses member names that leave the wheel; messages
that say what failed and keep the end of a long path (docs/security.md). Each test failed on the code
before its fix."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
import zipfile
from pathlib import Path

import pytest

from imagegen import outputs
from imagegen.wheelhouse import manifest as wheelhouse
from imagegen.cli import main
from imagegen.executors import gpu_access
from imagegen.model.layout import validate_layout
from imagegen.errors import UsageError
from imagegen.publish import index
from tests.unit import bake_print_stand_in as stand_in
from tests.unit.command_helpers import fake_host
from tests.unit.executor_fixtures import WHEEL, temp_files_under

ROOT = Path(__file__).resolve().parents[2]
CELL = ["--torch", "2.8", "--cuda", "12.8", "--python", "3.12", "--arch", "9.0"]


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def refused(code: int, err: str, *words: str, notes: bool = False) -> None:
    """Bad input: exit 2 (or the kind's code), exactly one line `imagegen: error: ...`, never 70
    (``notes``: after the command's own `imagegen: ...` notes, which are not errors)."""
    assert code not in (0, 1, 70), (code, err)
    if notes:
        lines = err.splitlines()
        assert all(line.startswith("imagegen: ") for line in lines) and "Traceback" not in err, err
        err = lines[-1] + "\n"
    assert err.startswith("imagegen: error: ") and err.count("\n") == 1, err
    for word in words:
        assert word in err, err


# --------------------------------------------------------------------------------------------
# 4. cdi-spec mounts the driver's files, never a folder that holds anything else


DRIVER = "580.159.04"


def _node(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))


def _driver_in(libs: Path) -> None:
    libs.mkdir(parents=True, exist_ok=True)
    for name, soname in [("libcuda", "libcuda.so.1"), ("libnvidia-ml", "libnvidia-ml.so.1")]:
        (libs / f"{name}.so.{DRIVER}").write_text(f"{name}\n")
        (libs / soname).symlink_to(f"{name}.so.{DRIVER}")


def _host_with_nodes(root: Path) -> None:
    for name in ("nvidiactl", "nvidia-uvm", "nvidia0"):
        _node(root / "dev" / name)


@pytest.mark.parametrize("layout", ["home", "driver tree"])
def test_the_cdi_spec_mounts_only_the_drivers_files(tmp_path, layout):
    root = tmp_path / "host"
    _host_with_nodes(root)
    if layout == "home":
        # libcuda.so.1 in ~/lib, found through LD_LIBRARY_PATH: ~ holds ~/.ssh and ~/.netrc too.
        home = root / "home" / "u"
        _driver_in(home / "lib")
        (home / ".ssh").mkdir(parents=True)
        (home / ".ssh" / "id_ed25519").write_text("PRIVATE KEY\n")
        (home / ".netrc").write_text("machine h login u password p\n")
        (home / "bin").mkdir()
        (home / "bin" / "nvidia-smi").write_text("#!/bin/sh\n")
        edits = gpu_access.driver_edits(root, lambda: "", "/home/u/lib")
    else:
        # The NVIDIA runtime's own tree (/usr/local/nvidia) with something else beside the driver.
        tree = root / "usr" / "local" / "nvidia"
        _driver_in(tree / "lib64")
        (tree / "notes.txt").write_text("not the driver's\n")
        edits = gpu_access.driver_edits(root, lambda: "", "/usr/local/nvidia/lib64")
    assert isinstance(edits, gpu_access.DriverEdits)
    spec = gpu_access.cdi_spec(edits)
    hosts = [Path(m["hostPath"]) for m in spec["containerEdits"]["mounts"]]
    assert hosts, spec
    for host in hosts:
        assert host.is_file() and not host.is_symlink(), host  # a file of the driver's, never a folder
        assert host.name.startswith(("libcuda.so.", "libnvidia-ml.so.", "nvidia-smi")), host
    assert {m["containerPath"] for m in spec["containerEdits"]["mounts"]} >= {
        "/usr/local/nvidia/lib64/libcuda.so.1", f"/usr/local/nvidia/lib64/libcuda.so.{DRIVER}"}
    text = json.dumps(spec)
    assert ".ssh" not in text and ".netrc" not in text and "notes.txt" not in text


def test_a_library_name_linking_to_another_file_is_not_mounted(tmp_path):
    root = tmp_path / "host"
    _host_with_nodes(root)
    home = root / "home" / "u"
    _driver_in(home / "lib")
    # Named like a driver library, a link to a file of the driver's version that is not that library.
    (home / f".netrc.so.{DRIVER}").write_text("machine h login u password p\n")
    (home / "lib" / "libnvidia-cfg.so.1").symlink_to(f"../.netrc.so.{DRIVER}")
    edits = gpu_access.driver_edits(root, lambda: "", "/home/u/lib")
    mounts = gpu_access.cdi_spec(edits)["containerEdits"]["mounts"]
    assert ".netrc" not in json.dumps(mounts)
    assert any(m["hostPath"].endswith(f"libnvidia-ml.so.{DRIVER}") for m in mounts)


# --------------------------------------------------------------------------------------------
# 9. a layout every reader walks, validated alike everywhere


def test_the_layout_limit_is_what_the_readers_walk(tmp_path):
    """A wheel at the deepest layout validate_layout allows is found by the wheelhouse readers; the
    layout one deeper is refused."""
    depth = wheelhouse.MAX_WALK_DEPTH
    validate_layout("/".join(["d"] * depth))
    with pytest.raises(UsageError, match="deeper than"):
        validate_layout("/".join(["d"] * (depth + 1)))
    for parts, found in ((depth, True), (depth + 1, False)):
        out = tmp_path / f"house{parts}"
        folder = out.joinpath(*["d"] * parts)
        folder.mkdir(parents=True)
        wheel = folder / WHEEL.name
        wheel.write_bytes(WHEEL.read_bytes())
        (folder / wheelhouse.MANIFEST).write_text(json.dumps(
            {"schema": 1, "cells": {"c": {"wheel": wheel.name, "sha256": wheelhouse.sha256(wheel)}}}))
        assert bool(wheelhouse.verified_wheels(out)) is found


@pytest.mark.parametrize("command", ["plan", "bake", "build"])
@pytest.mark.parametrize("layout, words", [
    ("a/b/c/d/e/f/g/h/i/j", ["deeper than"]),
    ("{{package}}", ["--layout"]),
    ("x{{/{package}", ["--layout"]),
])
def test_every_command_refuses_the_same_layouts(command, layout, words, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    argv = [command, "sageattention", *CELL, "--layout", layout]
    if command != "plan":
        argv += ["--out", str(tmp_path / "wh")]
    code, _, err = run(argv, capsys)
    refused(code, err, *words)
    assert not (tmp_path / "wh").exists()


def test_a_config_layout_is_checked_the_same_way(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "imagegen.toml").write_text('layout = "{{package}}/x"\n')
    code, _, err = run(["plan", "sageattention", *CELL], capsys)
    refused(code, err, "layout")


# --------------------------------------------------------------------------------------------
# 10. no input silently ignored


@pytest.mark.parametrize("command", ["plan", "render"])
@pytest.mark.parametrize("value", ["12.8=", "", "12.8=,x", "img:1,,img:2"])
def test_an_empty_base_image_is_refused(command, value, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    argv = [command, "sageattention", *CELL, "--base-image", value] + (["-o", "Dockerfile"] if command == "render" else [])
    code, _, err = run(argv, capsys)
    refused(code, err, "--base-image")
    assert not (tmp_path / "Dockerfile").exists()


def _project(tmp_path: Path) -> Path:
    tree = tmp_path / "proj"
    tree.mkdir()
    (tree / "pyproject.toml").write_text('[project]\nname = "myproj"\nversion = "1.0"\n')
    (tree / "setup.py").write_text("from setuptools import setup\nsetup()\n")
    return tree


@pytest.mark.parametrize("command", ["plan", "render", "bake"])
def test_a_version_the_source_tree_is_not_is_refused_by_every_command(command, tmp_path, monkeypatch, capsys):
    tree = _project(tmp_path)
    monkeypatch.chdir(tmp_path)
    code, _, err = run([command, "--source", tree, "--version", "7.7", *CELL], capsys)
    refused(code, err, "7.7")
    assert run(["plan", "--source", tree, "--version", "1.0", *CELL], capsys)[0] == 0


@pytest.mark.parametrize("name", ["5", "5.0", "true", "[a]"])
def test_a_recipe_name_that_is_not_text_is_refused(name, tmp_path, monkeypatch, capsys):
    d = tmp_path / "recipes"
    d.mkdir()
    (d / "demo.yaml").write_text(f"""schema: 1
name: {name}
source: {{git: "https://git.example.invalid/demo.git"}}
versions: {{"1.0": {{ref: v1.0, commit: "{"1" * 40}"}}}}
arch: {{env: DEMO_ARCHS, style: numeric, ptx: none}}
smoke: {{imports: [demo]}}
""")
    monkeypatch.chdir(tmp_path)
    code, _, err = run(["recipes", "--recipe-dir", d], capsys)
    refused(code, err, "name")
    assert "expected" in err


# --------------------------------------------------------------------------------------------
# 11. ci github checks destinations as publish --to does


@pytest.fixture
def in_checkout(monkeypatch):
    monkeypatch.setattr("imagegen.render.bakefiles.print_bake", stand_in.print_bake)
    monkeypatch.chdir(ROOT)


@pytest.mark.parametrize("dest", [
    "hf:a/b@main:x/../../y",
    "pypi:https://h.example/legacy/,simple=https://a.example/simple/,simple=https://b.example/simple/",
    "pypi:https://u:p@upload.example/legacy/",
    "github:octo/wheels",  # no @TAG
    "s3://B/x",  # an upper-case bucket
    "hf:octo/a--b",
])
def test_ci_github_refuses_what_publish_refuses(dest, in_checkout, tmp_path, capsys):
    out = tmp_path / "wf.yml"
    code, _, err = run(["publish", tmp_path, "--to", dest, "--dry-run"], capsys)
    assert code == 2, err  # publish --to refuses it
    code, _, err = run(["ci", "github", "-o", out, "--publish", dest, "--imagegen-from", "./tools/imagegen"], capsys)
    refused(code, err, "--publish")
    assert not out.exists()


def test_ci_github_still_takes_what_publish_takes(in_checkout, tmp_path, capsys):
    out = tmp_path / "wf.yml"
    dests = ["pypi:https://upload.pypi.org/legacy/", "pypi:http://127.0.0.1:8080/,simple=http://127.0.0.1:8080/simple/",
             "hf:octo/sage-wheels@main:cu128", "github:octo/wheels@v0.1.0", "s3://wheels-bucket/cu128/"]
    argv = ["ci", "github", "-o", out, "--imagegen-from", "./tools/imagegen"] + [a for d in dests for a in ("--publish", d)]
    code, _, err = run(argv, capsys)
    assert code == 0, err


@pytest.mark.parametrize("requirement", ["imagegen #", "imagegen # the real one", "imagegen[publish] #x",
                                         "imagegen#egg", "imagegen==0.1 #"])
def test_ci_github_refuses_pypis_imagegen_behind_a_comment(requirement, in_checkout, tmp_path, capsys):
    out = tmp_path / "wf.yml"
    code, _, err = run(["ci", "github", "-o", out, "--publish", "hf:octo/w", "--imagegen-from", requirement], capsys)
    refused(code, err, "--imagegen-from")
    assert not out.exists()


# --------------------------------------------------------------------------------------------
# 12. repair refuses member names that leave the wheel


def _with_members(tmp_path: Path, extra: dict[str, bytes]) -> Path:
    """The fixture wheel (a real CUDA extension) with ``extra`` members, listed in its RECORD."""
    out = tmp_path / "hostile" / WHEEL.name
    out.parent.mkdir()
    with zipfile.ZipFile(WHEEL) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        record_name = next(n for n in src.namelist() if n.endswith(".dist-info/RECORD"))
        record = src.read(record_name).decode()
        for info in src.infolist():
            if info.filename != record_name:
                dst.writestr(info, src.read(info))
        for name, data in extra.items():
            dst.writestr(zipfile.ZipInfo(name, (2024, 1, 1, 0, 0, 0)), data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record += f"{name},sha256={digest},{len(data)}\n"
        dst.writestr(record_name, record)
    return out


@pytest.mark.parametrize("member", ["../../evil_pkg/__init__.py", "/abs_evil/__init__.py", "tiny_kernel/../../up.py"])
def test_repair_refuses_a_member_name_that_leaves_the_wheel(member, tmp_path, monkeypatch, capsys):
    temp_files_under(tmp_path, monkeypatch)
    wheel = _with_members(tmp_path, {member: b"print('pwned')\n"})
    out = tmp_path / "repaired"
    code, _, err = run(["repair", wheel, "--out", out], capsys)
    refused(code, err, member, "pip refuses", notes=True)
    assert code == 9
    assert not out.exists() or not list(out.glob("*.whl"))


# --------------------------------------------------------------------------------------------
# 13. messages


def test_a_failed_ls_remote_says_gits_reason(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    missing = tmp_path / "no-such-repo"
    code, _, err = run(["plan", "sageattention", "--git", f"file://{missing}@main", *CELL], capsys)
    refused(code, err, "does not appear to be a git repository")
    assert len(err) < 700


def test_doctor_with_a_failed_check_exits_with_a_documented_code(tmp_path, capsys):
    py = fake_host(tmp_path, nvcc="13.0")  # torch is a CUDA 12.8 build: "nvcc vs torch" fails
    code, out, err = run(["doctor", "--no-engine", "--python-exe", py], capsys)
    assert "FAIL" in out
    refused(code, err, "nvcc vs torch")
    assert code == 4  # README: Docker, buildx or the host toolchain is missing or refused


@pytest.mark.parametrize("shell, ext", [("cmd", "cmd"), ("powershell", "ps1")])
def test_the_rerender_header_keeps_non_ascii_readable_and_inert(shell, ext, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    script = f"build 100%^!.{ext}"  # the output's name reaches only the comment (a script value would be refused)
    code, _, err = run(["render", "sageattention", "--shell", shell, *CELL, "--src-dir", "C:\\src\\café-日本",
                        "-o", script], capsys)
    assert code == 0, err
    header = next(line for line in (tmp_path / script).read_text(encoding="utf-8").splitlines()
                  if "Re-render with:" in line)
    assert "--src-dir 'C:\\src\\café-日本'" in header, header  # readable as typed, not turned into spaces
    assert "build 100\\x25\\x5e\\x21" in header, header  # what cmd acts on even in a rem line, escaped


# --------------------------------------------------------------------------------------------
# 14. long paths keep their end


def test_shown_keeps_the_end_of_a_long_path():
    path = "/" + "/".join(["deep-folder-name"] * 12) + "/flash_attn-2.8.3+cu130torch2.11-cp313-cp313-linux_x86_64.whl"
    text = outputs.shown(path)
    assert len(text) <= 120 and "..." in text
    assert text.endswith("flash_attn-2.8.3+cu130torch2.11-cp313-cp313-linux_x86_64.whl") and text.startswith("/deep")
    assert outputs.shown("a\x1b[2Jb" * 100).count("\\x1b") >= 2  # escaped before it is cut


def test_a_warning_about_a_deep_wheel_names_the_wheel(tmp_path):
    out = tmp_path / "house"
    folder = out.joinpath(*["a-rather-long-folder-name"] * 7)
    folder.mkdir(parents=True)
    bad = folder / 'evil"<b>-1.0-py3-none-any.whl'
    bad.write_bytes(WHEEL.read_bytes())
    (folder / wheelhouse.MANIFEST).write_text(json.dumps(
        {"schema": 1, "cells": {"c": {"wheel": bad.name, "sha256": wheelhouse.sha256(bad)}}}))
    result = index.write_index(out, say=lambda _m: None)
    assert any(bad.name in p and "not a wheel file name" in p for p in result.problems), result.problems


def test_the_index_hostile_names_test_passes_under_a_long_tmpdir(tmp_path):
    from tests.unit.test_index import test_hostile_folder_names_file_names_and_metadata_are_escaped_or_left_out as hostile

    long_tmp = tmp_path.joinpath(*["a-long-temporary-folder"] * 6)  # as under a CI runner's TMPDIR
    long_tmp.mkdir(parents=True)
    hostile(long_tmp)
