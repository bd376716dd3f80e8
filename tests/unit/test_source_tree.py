"""Tests for imagegen.model.source_tree: a local project (setup.py / pyproject.toml) as a recipe: its name
and version read from its metadata, its files read only inside the tree and within bounds, a hostile tree
refused or read safely, and looks_like_path telling a directory from a recipe name."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from imagegen.errors import RecipeError
from imagegen.model.arch_data import known_ccs
from imagegen.model.recipe_reader import MAX_PATCH_BYTES
from imagegen.model.source_tree import looks_like_path, recipe_from_source_tree


def test_local_source_tree_becomes_a_recipe():
    fixture = Path(__file__).parent.parent / "fixtures" / "tiny_kernel"
    r = recipe_from_source_tree(fixture)
    assert r.name == "tiny-kernel" and r.default_version == "0.1.0" and r.source_kind == "local"
    assert r.smoke.imports == ("tiny_kernel",)
    assert r.version(None).arch.env == "TORCH_CUDA_ARCH_LIST"


def test_local_source_tree_errors(tmp_path):
    with pytest.raises(RecipeError, match="not a directory"):
        recipe_from_source_tree(tmp_path / "nope")
    with pytest.raises(RecipeError, match="no setup.py or pyproject.toml"):
        recipe_from_source_tree(tmp_path)


def tree(tmp_path: Path, files: dict[str, str | bytes], name: str = "proj") -> Path:
    """A project directory under ``tmp_path`` holding ``files`` (relative path -> content)."""
    root = tmp_path / name
    root.mkdir()
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    return root


SETUP = 'from setuptools import setup\nsetup(name="fast_Kern.els", version="2.1.0")\n'


def test_a_pyproject_project_is_named_by_its_pep621_metadata(tmp_path):
    root = tree(tmp_path, {"pyproject.toml": '[project]\nname = "My_Fast.Kernels"\nversion = "1.2.3"\n',
                           "my_fast_kernels/__init__.py": ""})
    r = recipe_from_source_tree(root)
    assert (r.name, r.distribution, r.default_version, list(r.versions)) == (
        "my-fast-kernels", "my_fast_kernels", "1.2.3", ["1.2.3"])
    assert (r.source_kind, r.source_path, r.source_url, r.path) == ("local", root.resolve(), None, str(root.resolve()))
    assert r.description == f"local project at {root.resolve()}" and r.smoke.imports == ("my_fast_kernels",)


def test_a_setup_py_project_is_named_by_its_setup_call(tmp_path):
    r = recipe_from_source_tree(tree(tmp_path, {"setup.py": SETUP}))
    assert (r.name, r.default_version, r.distribution) == ("fast-kern-els", "2.1.0", "fast_kern_els")


def test_pyproject_metadata_wins_and_setup_py_fills_a_dynamic_version(tmp_path):
    both = tree(tmp_path, {"pyproject.toml": '[project]\nname = "from-pyproject"\ndynamic = ["version"]\n',
                           "setup.py": SETUP})
    r = recipe_from_source_tree(both)
    assert (r.name, r.default_version) == ("from-pyproject", "2.1.0")
    pinned = tree(tmp_path, {"pyproject.toml": '[project]\nversion = "0.5"\n', "setup.py": SETUP}, "pinned")
    r = recipe_from_source_tree(pinned)
    assert (r.name, r.default_version) == ("fast-kern-els", "0.5")  # the name falls back to setup.py's


def test_without_metadata_the_directory_names_the_project_at_version_0(tmp_path):
    r = recipe_from_source_tree(tree(tmp_path, {"setup.py": "import setuptools\nsetuptools.setup()\n"}, "Cool_Ops"))
    assert (r.name, r.default_version, r.distribution) == ("cool-ops", "0.0.0", "cool_ops")
    assert r.smoke.imports == ("cool_ops",)  # no package found: the name as a module


@pytest.mark.parametrize("version, expected", [
    ("1.0.0-rc1", "1.0.0rc1"),  # normalised as pip writes it
    ("v2.0", "2.0"),
    ("banana", "0.0.0"),
    ("1.0; rm -rf /", "0.0.0"),
])
def test_the_version_is_normalised_or_falls_back_to_0(tmp_path, version, expected):
    root = tree(tmp_path, {"pyproject.toml": f'[project]\nname = "p"\nversion = "{version}"\n'})
    assert recipe_from_source_tree(root).default_version == expected


@pytest.mark.parametrize("name, expected", [
    ("!!!", "local-project"),  # nothing left after cleaning
    ("x" * 65, "local-project"),  # longer than a recipe name may be
    ("__Private__", "private"),
    ("evil\nRUN id", "evil-run-id"),
])
def test_a_name_that_is_not_a_recipe_name_is_cleaned_or_replaced(tmp_path, name, expected):
    root = tree(tmp_path, {"pyproject.toml": f'[project]\nname = {json.dumps(name)}\nversion = "1.0"\n'})
    assert recipe_from_source_tree(root).name == expected


def test_top_level_packages_become_the_smoke_imports(tmp_path):
    root = tree(tmp_path, {"setup.py": SETUP, "alpha/__init__.py": "", "src/beta/__init__.py": "",
                           "tests/__init__.py": "", "test/__init__.py": "", "not-a-module/__init__.py": "",
                           "data/readme.txt": "no __init__ here", "csrc/k.cu": ""})
    assert recipe_from_source_tree(root).smoke.imports == ("alpha", "beta")


def test_the_recipe_is_a_torch_style_build_for_every_known_arch(tmp_path):
    r = recipe_from_source_tree(tree(tmp_path, {"setup.py": SETUP}))
    v = r.version(None)
    assert [a.cc for a in v.archs] == list(known_ccs())
    assert (v.arch.env, v.arch.style, v.arch.ptx) == ("TORCH_CUDA_ARCH_LIST", "torch", "honoured")
    assert (v.ref, v.commit, v.patches, dict(v.env)) == ("", None, (), {})
    assert (r.jobs_env, r.build_requires, str(r.min_cuda), str(r.python)) == (
        "MAX_JOBS", ("setuptools", "wheel", "ninja", "packaging"), "11.8", ">=3.9")


def test_a_tree_given_with_tilde_or_a_relative_path_is_resolved(tmp_path, monkeypatch):
    root = tree(tmp_path, {"setup.py": SETUP})
    monkeypatch.setenv("HOME", str(tmp_path))
    assert recipe_from_source_tree(Path("~/proj")).source_path == root.resolve()
    monkeypatch.chdir(root)
    assert recipe_from_source_tree(Path(".")).source_path == root.resolve()


def test_a_file_or_a_nul_path_is_not_a_directory(tmp_path):
    (tmp_path / "setup.py").write_text(SETUP)
    with pytest.raises(RecipeError, match=r"setup\.py: not a directory; give the root of a project"):
        recipe_from_source_tree(tmp_path / "setup.py")
    with pytest.raises(RecipeError) as err:
        recipe_from_source_tree(Path("bad\x00path\nRUN id"))
    assert str(err.value).startswith("bad\\x00path RUN id: not a directory") and err.value.exit_code == 2


def test_metadata_that_is_not_regular_is_not_taken_for_a_project(tmp_path):
    root = tmp_path / "proj"
    root.mkdir()
    os.mkfifo(root / "setup.py")  # must not block
    (root / "pyproject.toml").mkdir()
    with pytest.raises(RecipeError, match="no setup.py or pyproject.toml here; is this the project root"):
        recipe_from_source_tree(root)


def test_a_fifo_setup_py_beside_a_pyproject_is_never_opened(tmp_path):
    root = tree(tmp_path, {"pyproject.toml": '[project]\nname = "ok"\nversion = "1.0"\n'})
    os.mkfifo(root / "setup.py")
    r = recipe_from_source_tree(root)
    assert (r.name, r.default_version) == ("ok", "1.0")


def test_broken_or_hostile_metadata_is_ignored_not_fatal(tmp_path):
    broken = tree(tmp_path, {"pyproject.toml": "[project\nname = ", "setup.py": SETUP}, "broken")
    assert recipe_from_source_tree(broken).name == "fast-kern-els"
    binary = tree(tmp_path, {"pyproject.toml": b"\xff\xfe[project]\n"}, "binary")
    r = recipe_from_source_tree(binary)
    assert (r.name, r.default_version) == ("binary", "0.0.0")
    odd = tree(tmp_path, {"pyproject.toml": '[project]\nname = 5\nversion = ["1.0"]\n'}, "odd")
    assert (recipe_from_source_tree(odd).name, recipe_from_source_tree(odd).default_version) == ("5", "0.0.0")
    latin = tree(tmp_path, {"setup.py": b'# caf\xe9\nsetup(name="latin-ok", version="3.0")\n'}, "latin")
    assert (recipe_from_source_tree(latin).name, recipe_from_source_tree(latin).default_version) == ("latin-ok", "3.0")


def test_a_setup_py_over_the_bound_is_not_read(tmp_path):
    head = b'setup(name="big-one", version="9.9")\n'
    big = tree(tmp_path, {"setup.py": head + b"#" * (MAX_PATCH_BYTES + 1 - len(head))}, "big")
    assert (recipe_from_source_tree(big).name, recipe_from_source_tree(big).default_version) == ("big", "0.0.0")
    (big / "setup.py").write_bytes(head + b"#" * (MAX_PATCH_BYTES - len(head)))  # exactly the bound: read
    assert recipe_from_source_tree(big).name == "big-one"


def test_a_pyproject_over_the_config_bound_is_not_read(tmp_path):
    root = tree(tmp_path, {"pyproject.toml": '[project]\nname = "huge"\nversion = "1.0"\n' + "#" * (1 << 20)})
    r = recipe_from_source_tree(root)
    assert (r.name, r.default_version) == ("proj", "0.0.0")


def test_metadata_symlinked_inside_the_tree_is_read_and_outside_is_not(tmp_path):
    (tmp_path / "host.toml").write_text('[project]\nname = "stolen"\nversion = "6.6.6"\n')
    root = tree(tmp_path, {"meta/real.toml": '[project]\nname = "inside"\nversion = "1.0"\n'})
    (root / "pyproject.toml").symlink_to(root / "meta" / "real.toml")
    assert recipe_from_source_tree(root).name == "inside"
    (root / "pyproject.toml").unlink()
    (root / "pyproject.toml").symlink_to(tmp_path / "host.toml")
    r = recipe_from_source_tree(root)
    assert (r.name, r.default_version) == ("proj", "0.0.0")


def test_a_package_symlinked_in_from_elsewhere_is_still_only_a_name(tmp_path):
    # _top_level_modules only lists names; nothing of the linked directory is read.
    (tmp_path / "elsewhere" / "pkg").mkdir(parents=True)
    (tmp_path / "elsewhere" / "pkg" / "__init__.py").write_text("")
    root = tree(tmp_path, {"setup.py": SETUP})
    (root / "pkg").symlink_to(tmp_path / "elsewhere" / "pkg")
    assert recipe_from_source_tree(root).smoke.imports == ("pkg",)


@pytest.mark.parametrize("text", ["./proj", "/abs/dir", "~/src", "~", "a/b", ".."])
def test_looks_like_path_for_path_spellings(text):
    assert looks_like_path(text)


def test_looks_like_path_for_a_bare_name_is_whether_such_a_directory_exists(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert not looks_like_path("sageattention")
    (tmp_path / "sageattention").mkdir()
    assert looks_like_path("sageattention")
    (tmp_path / "afile").write_text("")
    assert not looks_like_path("afile")


@pytest.mark.parametrize("text", ["nul\x00byte", "x" * 5000])
def test_looks_like_path_never_raises_on_an_unusable_name(text, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert looks_like_path(text) is False


# --------------------------------------------------------------------------------------------
# Versions read as the build would, statically (issue 34 item 4): never a silent 0.0.0


# Seed 000's fork (cliffpyles/Block-Sparse-Attention): setup(name=PACKAGE_NAME, version=get_package_version()),
# which reads __version__ from block_sparse_attn/__init__.py. Running it would leave a marker file.
BSA_SETUP = """import ast, os, re
from pathlib import Path
from setuptools import setup
this_dir = os.path.dirname(os.path.abspath(__file__))
open(os.path.join(this_dir, "RAN"), "w").write("setup.py was run")
PACKAGE_NAME = "block_sparse_attn"

def get_package_version():
    with open(Path(this_dir) / "block_sparse_attn" / "__init__.py", "r") as f:
        version_match = re.search(r"^__version__\\s*=\\s*(.*)$", f.read(), re.MULTILINE)
    public_version = ast.literal_eval(version_match.group(1))
    local_version = os.environ.get("FLASH_ATTN_LOCAL_VERSION")
    return f"{public_version}+{local_version}" if local_version else str(public_version)

setup(name=PACKAGE_NAME, version=get_package_version(), packages=["block_sparse_attn"])
"""
BSA_INIT = '__version__ = "0.0.1"\n\nfrom block_sparse_attn.flash_attn_interface import flash_attn_func\nimport os; os.system("touch RAN")\n'


def test_a_setup_py_reading_its_packages_version_gives_that_version_without_running_anything(tmp_path):
    from imagegen.model.source_tree import read_tree

    root = tree(tmp_path, {"setup.py": BSA_SETUP, "block_sparse_attn/__init__.py": BSA_INIT}, "Block-Sparse-Attention")
    r = recipe_from_source_tree(root)
    assert (r.name, r.distribution, r.default_version) == ("block-sparse-attn", "block_sparse_attn", "0.0.1")
    assert r.version(None).source_version == "0.0.1" and r.version(None).resolved == ""
    assert read_tree(root).version_from == "block_sparse_attn/__init__.py's __version__, which setup.py reads it"
    assert not (root / "RAN").exists()  # neither setup.py nor the package was run


@pytest.mark.parametrize("files, expected, where", [
    # seed 003's shape: a src/ layout whose setup.py computes the version from the package
    ({"setup.py": 'import re\nfrom setuptools import setup, find_packages\ndef get_version():\n'
                  '    return re.search(r"__version__ = \\"(.+)\\"", open("src/kernel_pytorch/__init__.py").read())[1]\n'
                  'setup(name="kernel-pytorch", version=get_version(), package_dir={"": "src"})\n',
      "src/kernel_pytorch/__init__.py": '"""KernelPyTorch."""\n__version__ = "0.3.0"\n'},
     "0.3.0", "src/kernel_pytorch/__init__.py's __version__, which setup.py reads it"),
    ({"setup.py": 'from setuptools import setup\nVERSION = "1.4.0"\nsetup(name="const", version=VERSION)\n'},
     "1.4.0", "setup.py's setup(version=...)"),
    ({"setup.py": 'from setuptools import setup\nexec(open("fast/version.py").read())\nsetup(name="fast", version=__version__)\n',
      "fast/__init__.py": "from .version import __version__\n", "fast/version.py": "__version__ = '2.2.0'\n"},
     "2.2.0", "fast/version.py's __version__, which setup.py reads it"),
    ({"setup.py": "import setuptools\nsetuptools.setup()\n", "setup.cfg": "[metadata]\nname = cfgpkg\nversion = attr: cfgpkg.__version__\n",
      "cfgpkg/__init__.py": "__version__: str = '0.9.1'\n"},
     "0.9.1", "setup.cfg's version = attr: cfgpkg.__version__ (cfgpkg/__init__.py's __version__)"),
    ({"setup.py": "import setuptools\nsetuptools.setup()\n", "setup.cfg": "[metadata]\nversion = file: VERSION.txt\n",
      "VERSION.txt": "3.1\n"}, "3.1", "setup.cfg's version = file: VERSION.txt"),
    ({"setup.py": "import setuptools\nsetuptools.setup()\n", "setup.cfg": "[metadata]\nversion = 1.0.post2\n"},
     "1.0.post2", "setup.cfg's [metadata] version"),
    ({"pyproject.toml": '[project]\nname = "dyn"\ndynamic = ["version"]\n[tool.setuptools.dynamic]\nversion = {attr = "dyn.__version__"}\n',
      "src/dyn/__init__.py": "__version__ = '5.0.0'\n"},
     "5.0.0", "[tool.setuptools.dynamic] version attr dyn.__version__ (src/dyn/__init__.py's __version__)"),
    ({"pyproject.toml": '[project]\nname = "h"\ndynamic = ["version"]\n[tool.hatch.version]\npath = "h/about.py"\n',
      "h/about.py": "__version__ = '0.7'\n"}, "0.7", "[tool.hatch.version] path h/about.py"),
])
def test_computed_versions_are_read_statically_where_the_build_reads_them(tmp_path, files, expected, where):
    from imagegen.model.source_tree import read_tree

    root = tree(tmp_path, files)
    assert recipe_from_source_tree(root).default_version == expected
    assert read_tree(root).version_from == where


@pytest.mark.parametrize("files", [
    # a __version__ computed, not a constant; a package setup.py never reads; an attr: out of the tree
    {"setup.py": "from setuptools import setup\nimport pkg\nsetup(version=pkg.__version__)\n",
     "pkg/__init__.py": "__version__ = '.'.join(map(str, (1, 2)))\n"},
    {"setup.py": "from setuptools import setup\nsetup(version=os.environ['V'])\n", "pkg/__init__.py": "__version__ = '1.0'\n"},
    {"setup.py": "import setuptools\nsetuptools.setup()\n", "setup.cfg": "[metadata]\nversion = attr: ..etc.__version__\n"},
    {"setup.py": "import setuptools\nsetuptools.setup()\n", "setup.cfg": "[metadata]\nversion = file: /etc/hostname\n"},
    {"setup.py": "import setuptools\nsetuptools.setup()\n", "setup.cfg": "[metadata]\nversion = file: ../outside\n"},
])
def test_a_version_nothing_states_statically_is_assumed_and_says_how_to_give_it(tmp_path, files):
    (tmp_path / "outside").write_text("6.6.6\n")
    r = recipe_from_source_tree(tree(tmp_path, files))
    v = r.version(None)
    assert r.default_version == "0.0.0" and v.source_version is None
    assert v.resolved.startswith("version 0.0.0 assumed: ") and "--version X.Y.Z" in v.resolved


def test_a_declared_version_names_a_local_project(tmp_path):
    from imagegen.errors import UsageError
    from imagegen.model.source_tree import with_declared_version

    unknown = recipe_from_source_tree(tree(tmp_path, {"setup.py": "import setuptools\nsetuptools.setup()\n"}))
    r = with_declared_version(unknown, "0.3")
    assert (r.default_version, list(r.versions), r.version(None).source_version, r.version(None).resolved) == (
        "0.3", ["0.3"], "0.3", "")
    stated = recipe_from_source_tree(tree(tmp_path, {"setup.py": SETUP}, "stated"))
    assert with_declared_version(stated, "2.1.0").version(None).resolved == ""
    # another version than the tree states: the cells would be named for a wheel that says otherwise
    with pytest.raises(UsageError, match=r"^--version 3\.0: .*'s tree says it is 2\.1\.0 \(its wheel will say that\): give --version 2\.1\.0, or none$"):
        with_declared_version(stated, "3.0")
    assert with_declared_version(stated, None) is stated
    for bad in ("banana", "1.0; id"):
        with pytest.raises(UsageError, match="not a PEP 440 version"):
            with_declared_version(stated, bad)


# --------------------------------------------------------------------------------------------
# A local project's [build-system].requires, installed in the builder (issue 34 item 4)


def test_build_system_requires_are_added_to_the_builders_requirements(tmp_path):
    root = tree(tmp_path, {"pyproject.toml": '[build-system]\nrequires = ["setuptools >= 64", "pybind11[global] >=2.6",'
                                             ' "NumPy>=1.21,<3", "wheel"]\n[project]\nname = "p"\nversion = "1.0"\n'})
    r = recipe_from_source_tree(root)
    assert r.build_requires == ("ninja", "packaging", "setuptools>=64", "pybind11[global]>=2.6", "NumPy<3,>=1.21", "wheel")
    assert r.version(None).resolved == ""


def test_build_system_requires_with_a_marker_or_url_are_left_out_and_named(tmp_path):
    root = tree(tmp_path, {"pyproject.toml": '[build-system]\nrequires = ["tomli; python_version < \'3.11\'",'
                                             ' "x @ https://example.com/x.whl", "ok==1.0", "odd===1.0"]\n'
                                             '[project]\nname = "p"\nversion = "1.0"\n'})
    r = recipe_from_source_tree(root)
    assert r.build_requires == ("setuptools", "wheel", "ninja", "packaging", "ok==1.0")
    note = r.version(None).resolved
    assert note.startswith("[build-system].requires not installed in the builder: ")
    assert "(an environment marker)" in note and "(a URL)" in note and "(not a plain name[extras]specifier)" in note


@pytest.mark.parametrize("requires, words", [
    ('["x\\nRUN id"]', "is not a PEP 508 requirement"),
    ('["pkg; os.system(\'id\')"]', "is not a PEP 508 requirement"),
    ('["a b"]', "is not a PEP 508 requirement"),
    ('"setuptools"', "is not a list of strings"),
    ('[1]', "is not a list of strings"),
    ("[" + ", ".join(['"a"'] * 65) + "]", "lists 65 requirements (at most 64)"),
])
def test_build_system_requires_that_are_not_requirements_are_refused_in_one_line(tmp_path, requires, words):
    root = tree(tmp_path, {"pyproject.toml": f'[build-system]\nrequires = {requires}\n[project]\nname = "p"\nversion = "1"\n'})
    with pytest.raises(RecipeError) as err:
        recipe_from_source_tree(root)
    assert words in str(err.value) and "\n" not in str(err.value) and err.value.exit_code == 2
