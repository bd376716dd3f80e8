"""Tests for imagegen.shipped.builder.imagegen_fetch (the fetch step shipped beside the in-build script,
loaded by path as a module): a recipe's patches applied once, in a tree inside another git work tree too,
a foreign tree refused, and a local tree's copy patched while the tree itself is left alone. Its refusals
of hostile trees and servers: tests/unit/test_hostile_round2.py, test_hostile_netrc.py."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest

from imagegen.model.catalogue import load_catalogue
from imagegen.render.dockerfile import builder_files

SCRIPT = Path(__file__).resolve().parents[2] / "imagegen" / "shipped" / "builder" / "imagegen_fetch.py"
_spec = importlib.util.spec_from_file_location("imagegen_fetch_under_test", SCRIPT)
F = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(F)


def test_the_fetch_script_is_what_render_ships():
    assert builder_files()["imagegen_fetch.py"] == SCRIPT.read_text()


# ----------------------------------------------------------------------------------------- patches


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
    F.apply_patch(_sm90_patch(), str(tree))
    assert "_fake_impl(" in target.read_text()


def test_patches_apply_once_and_a_foreign_tree_is_refused(tmp_path, capsys):
    doc = _sm90_patch()
    tree = tmp_path / "src"
    target = _sm90_tree(tree)
    F.apply_patch(doc, str(tree))
    assert "_fake_impl(" in target.read_text()
    F.apply_patch(doc, str(tree))  # the same --src-dir fetched again (or upstream took it): not an error
    assert "is already in the source" in capsys.readouterr().out
    target.write_text("something else\n")
    with pytest.raises(SystemExit):
        F.apply_patch(doc, str(tree))
    assert "neither applies to the source" in capsys.readouterr().err


@pytest.mark.parametrize("kind,native", [("local", False), ("git", True), ("git", False)],
                         ids=["local", "native-git", "image-git"])
def test_the_source_folder_is_left_alone_and_the_copy_patched_except_in_an_image(tmp_path, capsys, kind, native):
    # Found on the H100: `imagegen build --native --source v2.2.0-tree` skipped the fetch step (the
    # tree is the user's), so no patch was applied and the wheel returned cosine 0.0002 vs SDPA.
    # Found on the H200: a native audit patched the user's --src-dir checkout in place, so the build
    # after it saw the pinned commit "with changes" and built a -local version instead of the pin.
    tree = tmp_path / "SageAttention"
    target = _sm90_tree(tree)
    pristine = target.read_text()
    cell = {"src_dir": str(tree), "source": {"kind": kind, "ref": "v2.2.0"}, "patches": [_sm90_patch()]}
    if native:
        cell["patch_copy"] = True  # executors.native's cell document
    if kind == "local" or native:
        F.cmd_fetch(cell, None)  # the tree (a git one: at its pin) is present: fetch leaves it as it is
    assert target.read_text() == pristine
    work = tmp_path / "work"
    work.mkdir()
    built = Path(F.copy_source(cell, str(work)))
    assert built == work / "src"
    copied = (built / "sageattention" / "sm90_compile.py").read_text()
    # in an image, fetch patched the tree it made where it lies: its copy is taken as it is
    assert ("_fake_impl(" in copied) == (kind == "local" or native) and target.read_text() == pristine
    said = capsys.readouterr().out
    assert ("applying patch" in said) == (kind == "local" or native)
    # what fetch leaves to the copy, it names (plan --audit --native shows the fetch step's lines)
    assert (f"the recipe's patches go on the build's copy, not on {tree}: {_sm90_patch()['name']}" in said) \
        == (kind == "local" or native)


# ------------------------------------------------------------------------------------ git sources
# The pinned checkout itself is imagegen_wheeltools.fetch_git, shared with the Windows helper
# (tests/unit/test_imagegen_windows.py runs it there): here through the Linux fetch step, on a real repository.

def _repo(tmp_path: Path) -> tuple[Path, str]:
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
    repo = tmp_path / "upstream"
    _sm90_tree(repo)
    subprocess.run([*git, "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "-C", str(repo), "add", "-A"], check=True)
    subprocess.run([*git, "-C", str(repo), "commit", "-qm", "v2.2.0"], check=True)
    subprocess.run([*git, "-C", str(repo), "tag", "v2.2.0"], check=True)
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    return repo, commit


def _fetch(cell: dict) -> subprocess.CompletedProcess:
    # the step as the build runs it: a process of its own (a refusal exits with its one line)
    code = f"import sys; sys.path.insert(0, {str(SCRIPT.parent)!r}); import imagegen_fetch as f; f.cmd_fetch({cell!r}, None)"
    return subprocess.run([__import__("sys").executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_a_git_source_is_fetched_at_its_pin_and_a_checkout_elsewhere_is_refused(tmp_path):
    repo, commit = _repo(tmp_path)
    dest = tmp_path / "src"
    cell = {"src_dir": str(dest), "patches": [_sm90_patch()],
            "source": {"kind": "git", "url": f"file://{repo}", "ref": "v2.2.0", "commit": commit}}
    proc = _fetch(cell)
    assert proc.returncode == 0, proc.stderr
    assert "_fake_impl(" in (dest / "sageattention" / "sm90_compile.py").read_text()  # patched after the fetch
    again = _fetch(cell)  # the same --src-dir again: at the pin, the patch already in it
    assert again.returncode == 0 and "source already present at" in again.stderr + again.stdout
    other = _fetch(dict(cell, source=dict(cell["source"], commit="0" * 40)))
    assert other.returncode == 1
    assert other.stderr.strip().splitlines()[-1] == (
        f"[imagegen] error: the checkout at {dest} is at {commit[:12]}, not the pinned 000000000000: check out the"
        " pinned commit")
    wrong_pin = _fetch(dict(cell, src_dir=str(tmp_path / "fresh"), source=dict(cell["source"], commit="1" * 40)))
    assert wrong_pin.returncode == 1 and f"is {commit}, not the pinned {'1' * 40}" in wrong_pin.stderr
    missing = _fetch(dict(cell, src_dir=str(tmp_path / "none"), source=dict(cell["source"], ref="v9.9.9")))
    assert missing.returncode != 0 and f"cannot fetch v9.9.9 from file://{repo}" in missing.stderr
