"""Issue 32, items 1-3: no credential of a URL leaves the place the user put it; no git call on a tree
imagegen only reads runs a command of that tree's; no command writes a wheelhouse into /, the home
folder or a system folder (docs/security.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from imagegen import safety
from imagegen.plan import refs
from imagegen.cli import main
from imagegen.errors import UnsafeValueError, UsageError
from imagegen.shipped.builder import imagegen_wheeltools as wheeltools

TOKEN = "ghp_S3cr3tT0kenDoNotLeak1234"
PASSWORD = "hunter2Pa55w0rdNeverShown"


# --------------------------------------------------------------------------------------------
# 1. credentials in URLs


@pytest.mark.parametrize("text, shown", [
    (f"https://user:{TOKEN}@host/org/repo@v1", "https://***@host/org/repo@v1"),
    (f"https://{TOKEN}@github.com/o/r", "https://***@github.com/o/r"),
    (f"pip install 'x @ git+https://u:{TOKEN}@h/x@v' now", "pip install 'x @ git+https://***@h/x@v' now"),
    (f"https://h/simple/?a=1&token={TOKEN}&b=2", "https://h/simple/?a=1&token=***&b=2"),
    (f"ssh://git:{PASSWORD}@h/x", "ssh://***@h/x"),
    # a URL that went through Path: str(Path("https://u:T@h/x")) keeps one '/'
    (f"https:/user:{TOKEN}@host/x: no such config file", "https:/***@host/x: no such config file"),
])
def test_redact_hides_userinfo_and_tokens(text, shown):
    assert safety.redact(text) == shown and safety.has_credentials(text)


@pytest.mark.parametrize("url", ["https://host/org/repo@v1", "git@github.com:org/repo@v1", "ssh://git@host/org/repo",
                                 "https://download.pytorch.org/whl/cu128"])
def test_urls_without_a_credential_are_left_alone(url):
    assert safety.redact(url) == url and not safety.has_credentials(url)


def test_redact_also_hides_known_secret_values():
    assert safety.redact(f"401 for {PASSWORD} at https://h/", [PASSWORD]) == "401 for *** at https://h/"


def test_an_error_never_shows_a_credential_not_even_half_of_one():
    long_host = "h" * 90
    err = UsageError(f"cannot reach https://user:{TOKEN}@{long_host}/x " + "y" * 500)
    assert TOKEN not in str(err) and TOKEN[:6] not in str(err)
    assert TOKEN[:6] not in safety.describe(f"https://user:{TOKEN}@{long_host}/x", 20)


def _scan(root: Path, *texts: str) -> list[str]:
    """Where the planted token or password shows up: in ``texts`` or any file under ``root``."""
    hits = [f"output {i}" for i, t in enumerate(texts) if TOKEN in t or PASSWORD in t]
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            if TOKEN.encode() in data or PASSWORD.encode() in data:
                hits.append(str(path))
    return hits


SECRET_URL = f"https://user:{PASSWORD}@{TOKEN}.example.invalid"
CELL = ["--torch", "2.8", "--cuda", "12.8", "--python", "3.12", "--arch", "9.0"]


@pytest.mark.parametrize("argv, refusal", [
    (["render", "flash-attn", "--git", f"{SECRET_URL.replace(TOKEN + '.', '')}/org/flash-attention@v2.8.3", *CELL,
      "-o", "Dockerfile"], "carries a credential"),
    (["plan", "flash-attn", "--git", f"https://oauth2:{TOKEN}@gitlab.example.invalid/org/fa.git", *CELL, "--json"],
     "carries a credential"),
    (["bake", "flash-attn", "--git", f"https://{TOKEN}@github.com/org/fa@main", *CELL], "carries a credential"),
    (["build", "flash-attn", "--git", f"https://u:{TOKEN}@github.com/org/fa@main", *CELL, "--out", "wh"],
     "carries a credential"),
    (["index", "wh", "--base-url", f"https://u:{TOKEN}@wheels.example.invalid/"], "carries a credential"),
    (["index", "wh", "--base-url", f"https://wheels.example.invalid/?token={TOKEN}"], None),
    (["publish", "wh", "--to", f"pypi:https://__token__:{TOKEN}@upload.example.invalid/legacy/", "--dry-run"], None),
    (["refresh", "--index-url", f"http://u:{TOKEN}@127.0.0.1:9/simple/", "--dry-run"], None),
    (["ci", "github", "--publish", f"pypi:https://__token__:{TOKEN}@upload.pypi.org/legacy/",
      "--imagegen-from", "imagegen-wheels[publish] @ git+https://github.com/ORG/imagegen@v0.1.0"], "carries a credential"),
    (["ci", "github", "--windows", "sage", "--windows-torch", "2.8", "--windows-cuda", "12.8", "--windows-python", "3.12",
      "--windows-arch", "8.0", "--imagegen-from", f"imagegen-wheels @ git+https://u:{TOKEN}@github.com/ORG/imagegen@v1"],
     "carries a credential"),
])
def test_a_token_in_any_url_flag_reaches_no_output_and_no_file(argv, refusal, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("IMAGEGEN_COMPAT_DIR", str(tmp_path / "compat"))
    (tmp_path / "wh").mkdir()
    code = main(argv)
    out, err = capsys.readouterr()
    assert code not in (0, 70), err
    assert err.startswith("imagegen: error: ") and err.count("\n") == 1, err
    if refusal:
        assert refusal in err and ("~/.netrc" in err or "secrets" in err or "pip itself" in err
                                   or "public" in err), err
    assert _scan(tmp_path, out, err) == []


def test_a_recipe_or_config_url_with_a_credential_is_refused(tmp_path, monkeypatch, capsys):
    d = tmp_path / "recipes"
    d.mkdir()
    (d / "demo.yaml").write_text(f"""schema: 1
name: demo
source: {{git: "https://u:{TOKEN}@git.example.invalid/demo.git"}}
versions: {{"1.0": {{ref: v1.0, commit: "{"1" * 40}"}}}}
arch: {{env: DEMO_ARCHS, style: numeric, ptx: none}}
smoke: {{imports: [demo]}}
""")
    monkeypatch.chdir(tmp_path)
    assert main(["plan", "demo", "--recipe-dir", str(d), *CELL]) == 2
    err = capsys.readouterr().err
    assert "carries a credential" in err and TOKEN not in err
    (tmp_path / "imagegen.toml").write_text(f'torch-index-url = "https://u:{TOKEN}@mirror.example.invalid/whl"\n')
    assert main(["plan", "flash-attn", *CELL]) == 2
    err = capsys.readouterr().err
    assert "carries a credential" in err and TOKEN not in err


def test_ls_remote_of_an_unreachable_host_shows_no_credential():
    with pytest.raises(UsageError) as info:
        refs.resolve_commit(f"http://u:{TOKEN}@127.0.0.1:9/org/repo.git", "main")
    assert "cannot resolve main" in str(info.value) and TOKEN not in str(info.value)


# --------------------------------------------------------------------------------------------
# 2. a tree imagegen only reads runs none of its commands

HOOKS = ("post-checkout", "post-index-change", "reference-transaction", "pre-auto-gc", "post-rewrite",
         "post-merge", "pre-commit", "fsmonitor-watchman")


def _git(cwd: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t",
               GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")
    return subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


def planted_tree(tmp_path: Path, files: dict[str, str]) -> tuple[Path, Path]:
    """A committed git tree whose config, hooks and attributes run a command that writes into the
    returned marker folder: an fsmonitor, every hook (a hooks path and .git/hooks), clean/smudge/process
    filters (one defined through an include), a textconv and an external diff, a pager, ssh and proxy
    commands."""
    tree, marks = tmp_path / "tree", tmp_path / "marks"
    tree.mkdir()
    marks.mkdir()
    for name, text in files.items():
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text(text)
    (tree / ".gitattributes").write_text("* filter=evil diff=evil\n*.py filter=inc\n")
    _git(tree, "init", "-q", "-b", "main")
    _git(tree, "add", "-A")
    _git(tree, "commit", "-q", "-m", "x")

    def cmd(kind: str) -> str:
        return f"touch {marks}/{kind}; cat"

    hooks = tmp_path / "hooks"
    hooks.mkdir()
    for hook in HOOKS:
        for folder in (hooks, tree / ".git" / "hooks"):
            (folder / hook).write_text(f"#!/bin/sh\ntouch {marks}/hook-{hook}\n")
            (folder / hook).chmod(0o755)
    (tmp_path / "included.cfg").write_text(f'[filter "inc"]\n\tclean = "{cmd("include-clean")}"\n'
                                           f'\tsmudge = "{cmd("include-smudge")}"\n\trequired = true\n')
    config = {"core.fsmonitor": f"touch {marks}/fsmonitor; false", "core.hooksPath": str(hooks),
              "filter.evil.clean": cmd("clean"), "filter.evil.smudge": cmd("smudge"),
              "filter.evil.process": f"touch {marks}/process", "filter.evil.required": "true",
              "diff.evil.textconv": cmd("textconv"), "diff.evil.command": cmd("diff-command"),
              "diff.external": cmd("diff-external"), "core.pager": cmd("pager"),
              "core.sshCommand": cmd("ssh"), "core.gitProxy": cmd("proxy"), "include.path": str(tmp_path / "included.cfg")}
    for key, value in config.items():
        _git(tree, "config", key, value)
    # stat data that no longer matches the index: git must look at (and would filter) every file
    for path in tree.rglob("*"):
        if path.is_file() and ".git" not in path.parts:
            os.utime(path, (1, 1))
    return tree, marks


def test_the_plant_itself_runs_under_plain_git(tmp_path):
    """The planted commands do run when git is called plainly: the tests below would see them."""
    tree, marks = planted_tree(tmp_path, {"setup.py": "x = 1\n"})
    subprocess.run(["git", "-C", str(tree), "status", "--porcelain"], capture_output=True)
    subprocess.run(["git", "-C", str(tree), "diff"], capture_output=True)
    assert {"fsmonitor", "process"} <= {p.name for p in marks.iterdir()}


def test_reading_a_planted_tree_runs_none_of_its_commands(tmp_path):
    tree, marks = planted_tree(tmp_path, {"setup.py": "version = '1.3.0.dev0'\n", "pkg/a.py": "A = 1\n"})
    head, _ = refs.checkout_head(tree)
    assert head == _git(tree, "rev-parse", "HEAD")
    from imagegen.model.recipes import Patch
    patch = Patch("p.patch", "diff --git a/setup.py b/setup.py\n--- a/setup.py\n+++ b/setup.py\n@@ -1 +1,2 @@\n"
                  " version = '1.3.0.dev0'\n+# x\n", "r")
    refs.only_patched(tree, (patch,))
    refs.export_commit(tree, head, "demo")
    from imagegen.commands import ci as workflow
    workflow._validate_top_folder(tree)
    wheeltools.apply_patch({"name": "p.patch", "text": patch.text}, str(tree), lambda m: None,
                           lambda m: pytest.fail(m), "broken")
    assert sorted(p.name for p in marks.iterdir()) == []


def test_render_and_plan_of_a_planted_catalogue_tree_run_none_of_its_commands(tmp_path, monkeypatch, capsys):
    setup = ("from setuptools import setup\nfrom torch.utils.cpp_extension import CUDAExtension\n"
             "setup(name='causal_conv1d', version='1.6.1',"
             " ext_modules=[CUDAExtension(name='causal_conv1d_cuda', sources=['csrc/a.cpp'])])\n")
    tree, marks = planted_tree(tmp_path, {"setup.py": setup, "PKG-INFO": "Metadata-Version: 2.1\nName: causal_conv1d\n"
                                          "Version: 1.6.1\n", "csrc/a.cpp": "int x;\n"})
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for argv in (["render", "--source", str(tree), *CELL, "-o", "Dockerfile"],
                 ["plan", "--source", str(tree), *CELL, "--json"]):
        code = main(argv)
        assert code != 70, capsys.readouterr().err
    assert "causal" in (tmp_path / "Dockerfile").read_text()
    assert sorted(p.name for p in marks.iterdir()) == []


def test_the_builder_scripts_fetch_step_reads_and_patches_a_planted_checkout_without_running_it(tmp_path):
    tree, marks = planted_tree(tmp_path, {"setup.py": "x = 1\n"})
    head = _git(tree, "rev-parse", "HEAD")
    patch = "diff --git a/setup.py b/setup.py\n--- a/setup.py\n+++ b/setup.py\n@@ -1 +1,2 @@\n x = 1\n+y = 2\n"
    cell = {"source": {"kind": "git", "url": "https://example.invalid/x.git", "ref": "main", "commit": head},
            "src_dir": str(tree), "patches": [{"name": "p.patch", "text": patch, "reason": "r"}]}
    builder = Path(wheeltools.__file__).parent
    code = ("import sys; sys.path.insert(0, %r); import imagegen_build as b; b.cmd_fetch(%r, None)"
            % (str(builder), cell))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "y = 2" in (tree / "setup.py").read_text()
    assert sorted(p.name for p in marks.iterdir()) == []


def test_a_driver_name_no_flag_can_switch_off_keeps_git_away(tmp_path):
    tree, marks = planted_tree(tmp_path, {"setup.py": "x = 1\n"})
    _git(tree, "config", "filter.a=b.clean", f"touch {marks}/odd; cat")
    with pytest.raises(wheeltools.UnsafeTree):
        wheeltools.git_cmd(str(tree), ["status"])
    assert refs.checkout_head(tree) == (None, False)
    assert sorted(p.name for p in marks.iterdir()) == []


# --------------------------------------------------------------------------------------------
# 3. no wheelhouse in /, the home folder or a system folder


@pytest.mark.parametrize("folder", ["/", "~", "/etc", "/usr", "/proc/self"])
def test_collect_index_and_out_refuse_the_root_home_and_system_folders(folder, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    path = os.path.expanduser(folder)
    for argv in (["collect", path], ["index", path], ["build", "flash-attn", *CELL, "--out", path]):
        code = main(argv)
        err = capsys.readouterr().err
        assert code == 2 or (argv[0] == "index" and code == 9), (argv, err)
        assert "is not a wheelhouse" in err and err.count("\n") == 1, err


def test_collect_of_a_folder_of_its_own_still_works(tmp_path, capsys):
    assert main(["collect", str(tmp_path)]) == 2
    assert "no build record" in capsys.readouterr().err
    with pytest.raises(UnsafeValueError):
        safety.wheelhouse_folder(Path("/"), "--out")
    assert safety.wheelhouse_folder(tmp_path / "wh", "--out") == (tmp_path / "wh").resolve()
