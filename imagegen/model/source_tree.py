"""A local project as a recipe (seed 003: a setup.py/pyproject project with its own kernels)."""

from __future__ import annotations

import re
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from imagegen import safety
from imagegen.errors import ImagegenError, RecipeError
from imagegen.model.arch import ArchList
from imagegen.model.arch_parse import parse_arch_list
from imagegen.model.recipe_reader import MAX_PATCH_BYTES
from imagegen.model.recipes import ArchKnob, Recipe, RecipeVersion, SmokeTest


def looks_like_path(text: str) -> bool:
    if text.startswith((".", "/", "~")) or "/" in text:
        return True
    try:
        return Path(text).is_dir()
    except (OSError, ValueError):  # a NUL byte or an over-long name: not a path we can use
        return False


def recipe_from_source_tree(path: Path, *, archs_hint: ArchList | None = None) -> Recipe:
    """Treat a local setup.py / pyproject.toml project as a recipe.

    The project is sent to the build as the named context ``source``; its arch knob is
    TORCH_CUDA_ARCH_LIST (what torch's BuildExtension reads) unless the project passes its own
    -gencode flags, in which case verification tells the user what really got compiled.
    """
    try:
        root = path.expanduser().resolve()
        is_dir = root.is_dir()
    except (OSError, ValueError, RuntimeError):
        is_dir = False
        root = path
    if not is_dir:
        raise RecipeError(f"{path}: not a directory; give the root of a project with setup.py or pyproject.toml")
    if not (root / "setup.py").is_file() and not (root / "pyproject.toml").is_file():
        raise RecipeError(f"{path}: no setup.py or pyproject.toml here; is this the project root?")
    name, version = _project_name_version(root)
    safe_name = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-") or "local-project"
    if not safety.RECIPE_NAME.fullmatch(safe_name):
        safe_name = "local-project"
    modules = tuple(m for m in _top_level_modules(root) if safety.MODULE_NAME.fullmatch(m)) or (
        safe_name.replace("-", "_"),
    )
    from imagegen.model.arch_data import known_ccs

    all_archs = parse_arch_list(list(known_ccs()))
    knob = ArchKnob(env="TORCH_CUDA_ARCH_LIST", style="torch", ptx="honoured")
    rv = RecipeVersion(
        version=version, ref="", commit=None, archs=all_archs, emits={}, env={}, patches=(),
        min_cuda_by_arch={}, arch=knob, notes="local source tree",
    )
    return Recipe(
        name=safe_name, aliases=(), description=f"local project at {root}",
        distribution=re.sub(r"[-_.]+", "_", safe_name),
        homepage="", source_kind="local", source_url=None, source_path=root, submodules=False,
        subdir="", default_version=version, versions={version: rv}, by_version=(), force_env={},
        local_version_env=None, jobs_env="MAX_JOBS", threads_env=None,
        ext_parallel_env=None, ext_parallel_max=1, env={},
        build_requires=("setuptools", "wheel", "ninja", "packaging"), system_requires=(),
        min_cuda=Version("11.8"), min_torch=None, max_torch=None, python=SpecifierSet(">=3.9"),
        memory_per_thread_gb=2.0, default_nvcc_threads=4, links_libcuda=False, abi3=False,
        smoke=SmokeTest(imports=modules), obsolete_patches=(), path=str(root),
    )


def pkg_info(root: Path) -> tuple[str, str] | None:
    """Name and version from the tree's PKG-INFO: an sdist's metadata, written by its build backend
    (causal-conv1d's setup.py computes its version; its PKG-INFO says 1.6.1). Read, never run."""
    path = root / "PKG-INFO"
    if not path.is_file():
        return None
    try:
        text = safety.read_regular_file(path, limit=1 << 20, inside=root).decode("utf-8", "replace")
    except safety.Unreadable:
        return None
    fields: dict[str, str] = {}
    for line in text.split("\n\n", 1)[0].splitlines():  # the header block (the body is the long description)
        key, sep, value = line.partition(":")
        if sep and key in ("Name", "Version") and key not in fields:
            fields[key] = value.strip()
    if "Name" not in fields or "Version" not in fields:
        return None
    try:
        return fields["Name"], str(Version(fields["Version"]))
    except InvalidVersion:
        return None


def _project_name_version(root: Path) -> tuple[str, str]:
    from imagegen.config import read_toml  # local import keeps tomllib optional here

    from_metadata = pkg_info(root)
    if from_metadata is not None:
        return from_metadata
    name, version = root.name, "0.0.0"
    pyproject = root / "pyproject.toml"
    if pyproject.is_file():
        try:
            project = read_toml(pyproject, inside=root).get("project", {})
        except ImagegenError:
            project = {}
        if not isinstance(project, dict):  # `project = 5`: not PEP 621 metadata
            project = {}
        name = str(project.get("name") or name)
        version = str(project.get("version") or version)
    setup = root / "setup.py"
    if setup.is_file():
        try:  # a regular file of this tree only (not a FIFO, nor a symlink to elsewhere)
            text = safety.read_regular_file(setup, limit=MAX_PATCH_BYTES, inside=root).decode("utf-8", "replace")
        except safety.Unreadable:
            text = ""
        # The setup() call's name, not an Extension's (CUDAExtension(name="causal_conv1d_cuda", ...) comes first).
        call = re.search(r"\bsetup\s*\(", text)
        m = re.search(r"""\bname\s*=\s*["']([A-Za-z0-9_.\-]+)["']""", text[call.end():] if call else text)
        if m and name == root.name:
            name = m.group(1)
        m = re.search(r"""version\s*=\s*["']([0-9][A-Za-z0-9_.+\-]*)["']""", text)
        if m and version == "0.0.0":
            version = m.group(1)
    try:
        version = str(Version(version))
    except InvalidVersion:
        version = "0.0.0"
    return name, version


def _top_level_modules(root: Path) -> list[str]:
    found = []
    for base in (root, root / "src"):
        if not base.is_dir():
            continue
        for child in sorted(base.iterdir()):
            if child.is_dir() and (child / "__init__.py").is_file() and child.name not in ("tests", "test"):
                found.append(child.name)
    return found
