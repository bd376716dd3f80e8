"""Tests for imagegen.plan.refs: --ref and --git URL@REF, resolved against a real git server (git's own
http-backend on 127.0.0.1, tests/git_server.py) before anything is planned, and the recipe facts each
ref gets: the catalogue's pin, the by_version range of the version it names or declares, or a refusal."""

from __future__ import annotations

import json
import textwrap

import pytest

from imagegen.plan import refs
from imagegen.cli import main
from imagegen.errors import RecipeError, UnsafeValueError, UsageError
from imagegen.model.catalogue import load_catalogue
from tests.git_server import GitServer, git, make_repo


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("git") / "srv"
    root.mkdir()
    work = make_repo(root, "demo.git", {"setup.py": "version = '1.2.0'\n"})
    shas = {"v1.2.0": git(work, "rev-parse", "HEAD")}
    git(work, "tag", "-a", "v1.2.0", "-m", "release")  # annotated: ls-remote lists it peeled as well
    (work / "setup.py").write_text("version = '1.3.0.dev0'\n")
    git(work, "commit", "-q", "-am", "dev")
    shas["main"] = git(work, "rev-parse", "HEAD")
    git(work, "tag", "light")  # lightweight
    git(work, "checkout", "-q", "-b", "feature/x")
    (work / "setup.py").write_text("version = '1.3.0.dev1'\n")
    git(work, "commit", "-q", "-am", "feature")
    shas["feature/x"] = git(work, "rev-parse", "HEAD")
    git(work, "push", "-q", "origin", "main", "feature/x", "v1.2.0", "light")
    with GitServer(root) as srv:
        yield srv, shas


def _recipe_dir(tmp_path, url: str, main_commit: str = "0" * 40):
    d = tmp_path / "recipes"
    d.mkdir(exist_ok=True)
    (d / "demo.yaml").write_text(textwrap.dedent(f"""\
        schema: 1
        name: demo
        source: {{git: "{url}"}}
        by_version:
          - match: ">=1.3.dev0"
            archs: ["8.0", "9.0", "12.0"]
            notes: "1.3 line"
          - match: ">=1.0,<1.3.dev0"
            archs: ["8.0", "9.0"]
            emits: {{"9.0": "9.0a"}}
        versions:
          "1.1":
            ref: v1.1
            commit: "{"1" * 40}"
          main:
            ref: main
            commit: "{main_commit}"
            source_version: "1.3.0.dev0"
        arch: {{env: DEMO_ARCHS, style: numeric, ptx: none}}
        smoke: {{imports: [demo]}}
        """))
    return d


def _demo(tmp_path, server, **kw):
    srv, _ = server
    return load_catalogue((_recipe_dir(tmp_path, srv.url("demo.git"), **kw),)).get("demo")


def test_tags_branches_and_commits_resolve_to_the_commit_they_name(server):
    srv, shas = server
    url = srv.url("demo.git")
    assert refs.resolve_commit(url, "v1.2.0") == shas["v1.2.0"]  # the annotated tag's commit, not the tag object
    assert refs.resolve_commit(url, "light") == shas["main"]
    assert refs.resolve_commit(url, "main") == shas["main"]
    assert refs.resolve_commit(url, "feature/x") == shas["feature/x"]
    assert refs.resolve_commit(url, "HEAD") == shas["main"]
    assert refs.resolve_commit(url, "a" * 40) == "a" * 40  # a full commit names itself, no network


def test_unknown_refs_short_commits_and_unreachable_hosts_are_one_line(server):
    srv, shas = server
    with pytest.raises(UsageError, match="has no branch or tag of that name"):
        refs.resolve_commit(srv.url("demo.git"), "nope")
    with pytest.raises(UsageError, match="give the full 40-character commit"):
        refs.resolve_commit(srv.url("demo.git"), shas["main"][:10])
    with pytest.raises(UsageError, match="git ls-remote failed"):
        refs.resolve_commit(srv.url("missing.git"), "main")
    # nothing listens on port 9: a network failure, named as one (not as missing credentials)
    with pytest.raises(UsageError, match=r"cannot reach 127\.0\.0\.1 \(connection: .*check the network or a proxy"):
        refs.resolve_commit("http://127.0.0.1:9/demo.git", "main")


@pytest.mark.parametrize("value, expected", [
    ("https://github.com/me/fork.git", ("https://github.com/me/fork.git", None)),
    ("https://github.com/me/fork.git@v2.8.2", ("https://github.com/me/fork.git", "v2.8.2")),
    ("https://github.com/me/fork@feature/x", ("https://github.com/me/fork", "feature/x")),
    ("git@github.com:me/fork.git", ("git@github.com:me/fork.git", None)),
    ("git@github.com:me/fork.git@main", ("git@github.com:me/fork.git", "main")),
    ("ssh://git@host.example/org/repo.git@v1", ("ssh://git@host.example/org/repo.git", "v1")),
    ("http://127.0.0.1:8080/demo.git", ("http://127.0.0.1:8080/demo.git", None)),
])
def test_split_git(value, expected):
    assert refs.split_git(value) == expected


@pytest.mark.parametrize("value", ["", "file:relative", "file:///a/../b", "ext::sh -c id", "https://host", "git@host:",
                                   "https://github.com/me/fork.git@", "https://github.com/me/fork;id"])
def test_split_git_refuses_what_is_not_a_repository(value):
    with pytest.raises(UsageError, match="--git"):
        refs.split_git(value)


@pytest.mark.parametrize("value", ["https://user@host.example/org/repo.git@v1", "https://u:pw@host.example/org/repo"])
def test_split_git_refuses_userinfo_which_may_be_a_token(value):
    """An https user name may be the token itself (https://TOKEN@github.com): refused, never written
    into a Dockerfile or a cell document (issue 32)."""
    with pytest.raises(UnsafeValueError, match="carries a credential.*~/.netrc"):
        refs.split_git(value)


def test_version_tag():
    assert refs.version_tag("v2.8.2") == "2.8.2" and refs.version_tag("2.8.3.post1") == "2.8.3.post1"
    assert refs.version_tag("releases/v1.0") == "1.0"
    assert refs.version_tag("main") is None and refs.version_tag("feature/x") is None


def test_a_version_tag_gets_the_facts_of_the_range_that_holds_it(tmp_path, server):
    _, shas = server
    recipe, v = refs.at_ref(_demo(tmp_path, server), "v1.2.0", None, None)
    assert v.commit == shas["v1.2.0"] and v.ref == "v1.2.0" and v.version == f"1.2.0-g{shas['v1.2.0'][:8]}"
    assert str(v.archs) == "8.0;9.0" and dict(v.emits) == {"9.0": "9.0a"} and v.source_version == "1.2.0"
    assert "built with its version 1.2.0 (from the tag v1.2.0) (recipe rules: by_version[1]" in v.resolved


def test_a_branch_a_pin_follows_gets_that_pins_facts_at_the_new_commit(tmp_path, server):
    _, shas = server
    _, v = refs.at_ref(_demo(tmp_path, server), "main", None, None)
    assert v.commit == shas["main"] and str(v.archs) == "8.0;9.0;12.0"
    assert v.version == f"1.3.0.dev0-g{shas['main'][:8]}" and "it follows main" in v.resolved


def test_the_pinned_commit_is_the_pin_itself(tmp_path, server):
    _, shas = server
    recipe = _demo(tmp_path, server, main_commit=shas["main"])
    _, v = refs.at_ref(recipe, "main", None, None)
    assert v.version == "main" and v.commit == shas["main"] and "the pinned main" in v.resolved


def test_a_branch_without_a_version_needs_one_declared(tmp_path, server):
    _, shas = server
    recipe = _demo(tmp_path, server)
    with pytest.raises(UsageError, match="give --version X.Y.Z"):
        refs.at_ref(recipe, "feature/x", None, None)
    _, v = refs.at_ref(recipe, "feature/x", None, "1.3.0.dev1")
    assert v.commit == shas["feature/x"] and str(v.archs) == "8.0;9.0;12.0" and "(--version)" in v.resolved
    with pytest.raises(RecipeError, match="no by_version range holds it"):
        refs.at_ref(recipe, "feature/x", None, "0.5")


def test_a_fork_is_the_recipe_at_another_url(tmp_path, server):
    srv, shas = server
    recipe = _demo(tmp_path, server, main_commit=shas["main"])
    fork = srv.url("demo.git").replace("127.0.0.1", "localhost")  # another URL, the same repository
    forked, v = refs.at_ref(recipe, None, f"{fork}@v1.2.0", None)
    assert forked.source_url == fork and forked.name == "demo" and v.commit == shas["v1.2.0"]
    # the recipe's facts, assumed for a repository nobody has read: the plan says they are unchecked
    assert v.unchecked.startswith("unaudited: what this fork compiles is unchecked (the recipe's facts for 1.2.0")
    assert refs.at_ref(recipe, None, f"{srv.url('demo.git')}@v1.2.0", None)[1].unchecked == ""  # the recipe's own
    # The fork's main at the pinned commit is still a fork: never mistaken for the catalogue's pin.
    _, v = refs.at_ref(recipe, None, f"{fork}@main", None)
    assert v.version == f"1.3.0.dev0-g{shas['main'][:8]}"
    with pytest.raises(UsageError, match="give the ref once"):
        refs.at_ref(recipe, "main", f"{fork}@main", None)


def test_refs_apply_to_git_recipes_only_and_are_checked(tmp_path, server):
    from tests.unit.executor_fixtures import tiny_recipe

    with pytest.raises(UsageError, match="apply to a recipe whose source is a git repository"):
        refs.at_ref(tiny_recipe(), "main", None, None)
    with pytest.raises(UnsafeValueError):
        refs.at_ref(_demo(tmp_path, server), "main;id", None, None)


def test_plan_and_render_build_the_ref(tmp_path, server, capsys, monkeypatch):
    srv, shas = server
    d = _recipe_dir(tmp_path, srv.url("demo.git"))
    cell = ["--torch", "2.8", "--cuda", "12.8", "--python", "3.12", "--arch", "9.0", "--recipe-dir", str(d)]
    assert main(["plan", "demo", "--ref", "v1.2.0", "--json", *cell]) == 0
    (c,) = json.loads(capsys.readouterr().out)["cells"]
    assert c["status"] == "buildable" and c["version"] == f"1.2.0-g{shas['v1.2.0'][:8]}"
    assert c["expected_archs"] == "9.0a"  # the 1.0-1.3 range's emits
    assert c["notes"] == [f"v1.2.0 is {shas['v1.2.0'][:12]}, built with its version 1.2.0 (from the tag v1.2.0)"
                          " (recipe rules: by_version[1] (<1.3.dev0,>=1.0))"]
    monkeypatch.chdir(tmp_path)
    assert main(["render", "demo", "--ref", "v1.2.0", "-o", "Dockerfile", *cell]) == 0
    text = (tmp_path / "Dockerfile").read_text()
    # the build fetches the resolved commit, from the recipe's URL
    source = _cell_file(tmp_path)["source"]
    assert (source["commit"], source["kind"], source["ref"]) == (shas["v1.2.0"], "git", shas["v1.2.0"])
    assert source["url"] == srv.url("demo.git") and "imagegen render demo --ref v1.2.0" in text
    capsys.readouterr()
    assert main(["plan", "demo", "demo", "--ref", "v1.2.0", *cell]) == 0  # one recipe, named twice
    code = main(["plan", "demo", "sage", "--ref", "v1.2.0", *cell])
    assert code == 2 and "exactly one recipe" in capsys.readouterr().err
    code = main(["plan", "demo", "--ref", "v1.2.0", "--fetch", "sdist", *cell])
    assert code == 2 and "--fetch sdist" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# Local trees of catalogue packages: --src-dir on a fork or a changed checkout, --source on an sdist


CAUSAL_SETUP = """from setuptools import setup
from torch.utils.cpp_extension import CUDAExtension
ext_modules = [CUDAExtension(name="causal_conv1d_cuda", sources=["csrc/causal_conv1d.cpp"])]
setup(name="causal_conv1d", version=get_package_version(), ext_modules=ext_modules)
"""


def test_an_sdist_of_a_catalogue_package_gets_its_name_version_and_knobs_from_pkg_info(tmp_path):
    from imagegen.plan.request import recipe_at

    tree = tmp_path / "causal_conv1d-1.6.1"
    tree.mkdir()
    (tree / "setup.py").write_text(CAUSAL_SETUP)
    (tree / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: causal_conv1d\nVersion: 1.6.1\nSummary: x\n\n"
                                   "Name: not-this\nVersion: 9.9\n")
    cat = load_catalogue()
    recipe, v = recipe_at(cat, None, tree, None)
    pinned = cat.get("causal-conv1d")
    assert recipe.name == "causal-conv1d" and recipe.source_kind == "local" and recipe.source_path == tree
    assert recipe.force_env == pinned.force_env and recipe.force_env  # no download of a prebuilt wheel
    assert v.version == "1.6.1-local" and v.archs == pinned.versions["1.6.1"].archs
    assert "is built as a local tree with the rules of causal-conv1d 1.6.1" in v.resolved
    # The same tree as a path argument, and without PKG-INFO: setup()'s name, not the extension's
    (tree / "PKG-INFO").unlink()
    recipe, v = recipe_at(cat, str(tree), None, "1.6.1")
    assert recipe.name == "causal-conv1d" and v.version == "1.6.1-local"


def test_a_fork_checkout_is_built_in_place_with_the_rules_of_its_version(tmp_path, server):
    from tests.git_server import git as run_git

    recipe = _demo(tmp_path, server)
    work = tmp_path / "fork"
    work.mkdir()
    run_git(work, "init", "-q", "-b", "main")
    (work / "setup.py").write_text("from setuptools import setup\nsetup(name='demo', version='1.2.0')\n")
    run_git(work, "add", "-A")
    run_git(work, "commit", "-q", "-m", "fork")
    local, v = refs.at_tree(recipe, recipe.version("main"), work, None)
    assert local.source_kind == "local" and local.source_path == work and local.source_url is None
    assert v.version == "1.2.0-local" and dict(v.emits) == {"9.0": "9.0a"} and v.commit is None
    head = run_git(work, "rev-parse", "HEAD")
    assert f"HEAD {head[:12]}; version 1.2.0" in v.resolved and "by_version[1]" in v.resolved
    (work / "setup.py").write_text("from setuptools import setup\nsetup(name='demo', version='1.2.0')  # edited\n")
    assert ", with changes" in refs.at_tree(recipe, recipe.version("main"), work, None)[1].resolved
    with pytest.raises(RecipeError, match="no pinned version or by_version range holds"):
        refs.at_tree(recipe, recipe.version("main"), work, "0.1")


def test_a_clean_checkout_at_the_pinned_commit_is_the_pin(tmp_path, server):
    srv, shas = server
    checkout = tmp_path / "clone"
    git(tmp_path, "clone", "-q", srv.url("demo.git"), str(checkout))
    recipe = _demo(tmp_path, server, main_commit=shas["main"])
    same, v = refs.at_tree(recipe, recipe.version("main"), checkout, None)
    assert same is recipe and v is recipe.version("main")
    assert refs.checkout_head(checkout) == (shas["main"], False)
    assert refs.checkout_head(tmp_path) == (None, False)  # not a checkout


PATCH_EDIT = """\
diff --git a/setup.py b/setup.py
--- a/setup.py
+++ b/setup.py
@@ -1 +1,2 @@
 version = '1.3.0.dev0'
+# patched by the recipe
"""
PATCH_ADD = """\
diff --git a/extra.py b/extra.py
new file mode 100644
--- /dev/null
+++ b/extra.py
@@ -0,0 +1 @@
+EXTRA = 1
"""


def test_a_pinned_checkout_an_earlier_build_patched_is_still_the_pin(tmp_path, server):
    """imagegen patches the source in place: building the same --src-dir again must not turn the pin
    into a local tree (another version label, other rules) because of imagegen's own patches."""
    import dataclasses

    from imagegen.model.recipes import Patch

    srv, shas = server
    checkout = tmp_path / "clone"
    git(tmp_path, "clone", "-q", srv.url("demo.git"), str(checkout))
    recipe = _demo(tmp_path, server, main_commit=shas["main"])
    patches = (Patch("edit.patch", PATCH_EDIT, "r"), Patch("add.patch", PATCH_ADD, "r"))
    pin = dataclasses.replace(recipe.version("main"), patches=patches)
    for p in patches:
        (tmp_path / p.name).write_text(p.text)
        git(checkout, "apply", str(tmp_path / p.name))
    assert refs.checkout_head(checkout) == (shas["main"], True)
    same, v = refs.at_tree(recipe, pin, checkout, None)
    assert same is recipe and v is pin
    assert git(checkout, "status", "--porcelain") == "M setup.py\n?? extra.py"  # the user's index untouched
    # Anything beyond the patches is a change of the user's: a local tree.
    (checkout / "setup.py").write_text((checkout / "setup.py").read_text() + "# mine\n")
    assert refs.at_tree(recipe, pin, checkout, None)[1].version == "1.3.0.dev0-local"
    assert not refs.only_patched(checkout, patches)
    git(checkout, "checkout", "--", "setup.py")  # only the new file's patch applied now: not the pin's tree
    assert not refs.only_patched(checkout, patches) and not refs.only_patched(checkout, ())


def test_build_native_src_dir_on_a_fork_uses_the_recipes_knobs(tmp_path, capsys):
    """Seed 000: `imagegen build bsa --native --src-dir ./my-fork` on a fork of Block-Sparse-Attention."""
    from tests.unit.command_helpers import fake_host

    fork = tmp_path / "Block-Sparse-Attention"
    fork.mkdir()
    git(fork, "init", "-q", "-b", "main")
    (fork / "setup.py").write_text("from setuptools import setup\nsetup(name='block_sparse_attn', version='0.0.2')\n")
    git(fork, "add", "-A")
    git(fork, "commit", "-q", "-m", "my fork")
    py = fake_host(tmp_path)
    work = tmp_path / "work"
    assert main(["build", "bsa", "--native", "--src-dir", str(fork), "--arch", "8.0", "--python-exe", py,
                 "--print-env", "--no-audit", "--work", str(work)]) == 0
    env = json.loads(capsys.readouterr().out)
    bsa = load_catalogue().get("bsa")
    assert env["BLOCK_SPARSE_ATTN_CUDA_ARCHS"] == "80"  # the recipe's own arch knob
    assert all(env.get(k) == v for k, v in bsa.force_env.items())
    cell = json.loads((work / "cell.json").read_text())
    assert cell["source"]["kind"] == "local" and cell["src_dir"] == str(fork) and cell["version"] == "0.0.2-local"
    assert [p["name"] for p in cell["patches"]] == [p.name for p in bsa.versions["0.0.2"].patches]


# --------------------------------------------------------------------------------------------
# --git file:///path@REF: a repository on this machine, exported on the host for the build


def test_a_local_repository_is_resolved_exported_and_built_as_a_local_tree(tmp_path, monkeypatch, capsys):
    from pathlib import Path

    from tests.git_server import tiny_kernel_repo

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    repo, commit = tiny_kernel_repo(tmp_path)
    recipes = Path(__file__).parents[1] / "fixtures" / "tiny_git_recipe"
    cell = ["--torch", "2.11", "--cuda", "13.0", "--python", "3.11", "--arch", "8.0", "--flavor", "pypi",
            "--recipe-dir", str(recipes)]
    assert main(["plan", "tiny", "--git", f"file://{repo}@v0.1.0", "--json", *cell]) == 0
    (c,) = json.loads(capsys.readouterr().out)["cells"]
    tree = tmp_path / "cache" / "imagegen" / "sources" / f"tiny-{commit[:16]}"
    assert c["status"] == "unchecked" and c["version"] == f"0.1.0-g{commit[:8]}"  # another repository than the recipe's
    assert c["unchecked"].startswith("unaudited: what this tree compiles is unchecked; its setup.py names")
    assert f"exported from file://{repo} to {tree}" in c["notes"][0] and "by_version[0]" in c["notes"][0]
    assert (tree / "setup.py").read_text() == (repo / "setup.py").read_text() and not (tree / ".git").exists()
    assert (tree / ".imagegen-export").read_text().strip() == commit
    # the build gets the exported tree as its local source (a container cannot reach the host's path)
    monkeypatch.chdir(tmp_path)
    assert main(["render", "tiny", "--git", f"file://{repo}@v0.1.0", "-o", "Dockerfile", *cell]) == 0
    text = (tmp_path / "Dockerfile").read_text()
    assert _cell_file(tmp_path)["source"]["kind"] == "local" and "COPY --from=source" in text
    # an unknown ref, a relative or hostile path: one line each
    for value, words in ((f"file://{repo}@v9", "has no branch or tag"), ("file://relative/x@v1", "not a repository URL"),
                         (f"file://{repo}/../x@v0.1.0", "not a repository URL")):
        assert main(["plan", "tiny", "--git", value, *cell]) == 2
        assert words in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# Local trees named by the version they state (issue 34 item 4): seed 000's fork, seed 003's package


def test_seed_000s_fork_is_its_init_version_not_a_refused_0_0_0(tmp_path, capsys):
    """cliffpyles/Block-Sparse-Attention: setup(name=PACKAGE_NAME, version=get_package_version()), the
    version in block_sparse_attn/__init__.py (0.0.1): planned with 0.0.1's rules, no --version guessed."""
    from tests.unit.test_source_tree import BSA_INIT, BSA_SETUP

    fork = tmp_path / "Block-Sparse-Attention"
    (fork / "block_sparse_attn").mkdir(parents=True)
    (fork / "setup.py").write_text(BSA_SETUP)
    (fork / "block_sparse_attn" / "__init__.py").write_text(BSA_INIT)
    cell = ["--torch", "2.8", "--cuda", "12.8", "--python", "3.12", "--arch", "8.0", "--json"]
    assert main(["plan", str(fork), *cell]) == 0
    (c,) = json.loads(capsys.readouterr().out)["cells"]
    # planned with 0.0.1's rules, but nobody has read what this tree compiles: unchecked until an audit
    assert c["recipe"] == "block-sparse-attn" and c["version"] == "0.0.1-local" and c["status"] == "unchecked"
    assert "version 0.0.1) is built as a local tree with the rules of block-sparse-attn 0.0.1" in c["notes"][0]
    assert c["unchecked"].startswith("unaudited: what this tree compiles is unchecked; its setup.py names no -gencode")
    assert not any("fixed arch list" in n for n in c["notes"]) and c["expected_archs"] is None  # not the recipe's list
    recipe = load_catalogue().get("bsa")
    local, v = refs.at_tree(recipe, recipe.version(None), fork, None)
    assert v.version == "0.0.1-local" and v.source_version == "0.0.1"
    assert not (fork / "RAN").exists()


def test_a_fork_that_states_no_version_is_refused_asking_for_version_not_named_0_0_0(tmp_path, capsys):
    fork = tmp_path / "fork"
    fork.mkdir()
    (fork / "setup.py").write_text("from setuptools import setup\nsetup(name='block_sparse_attn', version=compute())\n")
    recipe = load_catalogue().get("bsa")
    with pytest.raises(UsageError) as err:
        refs.at_tree(recipe, recipe.version(None), fork, None)
    assert "which block-sparse-attn version is this tree? it states none" in str(err.value)
    assert "give --version X.Y.Z (the pinned ones: 0.0.2.post1, 0.0.2, 0.0.1)" in str(err.value)
    assert "0.0.0" not in str(err.value)
    assert refs.at_tree(recipe, recipe.version(None), fork, "0.0.1")[1].version == "0.0.1-local"
    assert main(["plan", str(fork), "--arch", "8.0"]) == 2
    assert capsys.readouterr().err.startswith("imagegen: error: ") 


def test_a_local_package_is_named_by_its_wheels_version_and_installs_its_build_requires(tmp_path, capsys, monkeypatch):
    """Seed 003: setup.py computes the version from the package (0.3.0); cells, folders and the
    builder's requirements follow the tree, and the pyproject's build requirements reach the image."""
    from tests.unit.test_source_tree import tree

    root = tree(tmp_path, {
        "setup.py": 'import re\nfrom setuptools import setup\nsetup(name="kernel-pytorch", version=re.search('
                    'r"__version__ = \\"(.+)\\"", open("src/kernel_pytorch/__init__.py").read())[1])\n',
        "src/kernel_pytorch/__init__.py": '__version__ = "0.3.0"\n',
        "pyproject.toml": '[build-system]\nrequires = ["setuptools>=64", "pybind11>=2.6", "numpy>=1.21.0"]\n'
                          'build-backend = "setuptools.build_meta"\n'}, "KernelPyTorch")
    cell = ["--torch", "2.8", "--cuda", "12.8", "--python", "3.12", "--arch", "9.0"]
    assert main(["plan", str(root), "--json", *cell]) == 0
    out = capsys.readouterr()
    (c,) = json.loads(out.out)["cells"]
    assert c["version"] == "0.3.0" and c["name"] == "kernel-pytorch-0_3_0-torch2_8-cu128-py312"
    assert c["wheel_dir"] == "kernel-pytorch-0.3.0/torch2.8/cu128" and "warning" not in out.err
    monkeypatch.chdir(tmp_path)
    assert main(["render", str(root), "-o", "Dockerfile", *cell]) == 0
    text = (tmp_path / "Dockerfile").read_text()
    doc = _cell_file(tmp_path)
    assert doc["build_requires"] == ["wheel", "ninja", "packaging", "setuptools>=64", "pybind11>=2.6", "numpy>=1.21.0"]
    assert doc["version"] == "0.3.0" and "pybind11>=2.6" in text  # the visible pip install names them too


def test_a_local_package_with_no_stated_version_warns_and_takes_version(tmp_path, capsys):
    from tests.unit.test_source_tree import tree

    root = tree(tmp_path, {"setup.py": "import setuptools\nsetuptools.setup(version=compute())\n"}, "mine")
    cell = ["--torch", "2.8", "--cuda", "12.8", "--python", "3.12", "--arch", "9.0", "--json"]
    assert main(["plan", str(root), *cell]) == 0
    out = capsys.readouterr()
    assert out.err.startswith("imagegen: warning: version 0.0.0 assumed: ") and "--version X.Y.Z" in out.err
    assert json.loads(out.out)["cells"][0]["version"] == "0.0.0"
    assert main(["plan", str(root), "--version", "0.3.0", *cell]) == 0  # before: "mine has no version '0.3.0'"
    out = capsys.readouterr()
    assert json.loads(out.out)["cells"][0]["version"] == "0.3.0" and "warning" not in out.err
    assert main(["plan", str(root), "--version", "x!y", *cell]) == 2
    assert capsys.readouterr().err.startswith("imagegen: error: --version 'x!y': not a PEP 440 version")


def _cell_file(folder) -> dict:
    """The cell document `render -o folder/Dockerfile` wrote beside it (<cell>/cell.json)."""
    (path,) = folder.glob("*/cell.json")
    return json.loads(path.read_text())
