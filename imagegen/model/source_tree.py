"""A local project as a recipe (a team's own kernels package: a setup.py/pyproject project).

Everything is read statically: PKG-INFO, pyproject.toml and setup.cfg as data, setup.py and a
package's ``__init__.py``/``version.py`` parsed with :mod:`ast`, never imported or run (imagegen runs
no code of a tree it only reads: docs/security.md). A version nothing states that way is assumed
(``ASSUMED_VERSION``), and the recipe says so (its version's ``source_version`` is None).
"""

from __future__ import annotations

import ast
import configparser
import re
from dataclasses import dataclass, replace
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from imagegen import safety
from imagegen.errors import ImagegenError, RecipeError, UsageError
from imagegen.model.arch import ArchList
from imagegen.model.arch_parse import parse_arch_list
from imagegen.model.recipe_reader import MAX_PATCH_BYTES, quoted, shown_path
from imagegen.model.recipes import ArchKnob, BuildFlags, Recipe, RecipeVersion, SmokeTest

ASSUMED_VERSION = "0.0.0"
# Where a tree's version is read from, in this order (what an "assumed" message lists).
VERSION_PLACES = ("PKG-INFO, pyproject.toml, setup.py's setup(version=...), setup.cfg, or the package's"
                  " __version__ that setup.py reads")
# What every local project's build gets; its own [build-system].requires are added (and replace one
# of these they name).
LOCAL_BUILD_REQUIRES = ("setuptools", "wheel", "ninja", "packaging")
MAX_BUILD_REQUIRES = 64
MAX_SOURCE_BYTES = 1 << 20  # an __init__.py, version.py or VERSION file read for a version


def looks_like_path(text: str) -> bool:
    if text.startswith((".", "/", "~")) or "/" in text:
        return True
    try:
        return Path(text).is_dir()
    except (OSError, ValueError):  # a NUL byte or an over-long name: not a path we can use
        return False


@dataclass(frozen=True)
class TreeFacts:
    """What a project tree states about itself, read without running any of it."""

    name: str
    version: str | None  # None: nothing imagegen reads states one
    version_from: str  # where ``version`` was read ("" where it was not)
    build_requires: tuple[str, ...]  # LOCAL_BUILD_REQUIRES with the project's [build-system].requires
    requires_left_out: tuple[str, ...] = ()  # "requirement (why)": ones the builder does not install


def recipe_from_source_tree(path: Path, *, archs_hint: ArchList | None = None) -> Recipe:
    """Treat a local setup.py / pyproject.toml project as a recipe.

    The project is sent to the build as the named context ``source``; its arch knob is
    TORCH_CUDA_ARCH_LIST (what torch's BuildExtension reads) unless the project passes its own
    -gencode flags, in which case verification tells the user what really got compiled. Its version
    is the one the tree states (read_tree); where none does, ``ASSUMED_VERSION``, with
    ``source_version`` None and ``resolved`` saying how to give it (with_declared_version).
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
    facts = read_tree(root)
    name = facts.name
    version = facts.version or ASSUMED_VERSION
    safe_name = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-") or "local-project"
    if not safety.RECIPE_NAME.fullmatch(safe_name):
        safe_name = "local-project"
    modules = tuple(m for m in _top_level_modules(root) if safety.MODULE_NAME.fullmatch(m)) or (
        safe_name.replace("-", "_"),
    )
    from imagegen.model.arch_data import known_ccs

    all_archs = parse_arch_list(list(known_ccs()))
    knob = ArchKnob(env="TORCH_CUDA_ARCH_LIST", style="torch", ptx="honoured")
    said = [] if facts.version else [assumed_note(root)]
    if facts.requires_left_out:
        said.append("[build-system].requires not installed in the builder: " + "; ".join(facts.requires_left_out))
    rv = RecipeVersion(
        version=version, ref="", commit=None, archs=all_archs, emits={}, env={}, patches=(),
        min_cuda_by_arch={}, arch=knob, notes="local source tree", source_version=facts.version,
        resolved="; ".join(said), **unaudited(root),
    )
    return Recipe(
        name=safe_name, aliases=(), description=f"local project at {root}",
        distribution=re.sub(r"[-_.]+", "_", safe_name),
        homepage="", source_kind="local", source_url=None, source_path=root, submodules=False,
        subdir="", default_version=version, versions={version: rv}, by_version=(), force_env={},
        local_version_env=None, jobs_env="MAX_JOBS", threads_env=None,
        ext_parallel_env=None, ext_parallel_max=1, env={},
        build_requires=facts.build_requires, system_requires=(),
        min_cuda=Version("11.8"), min_torch=None, max_torch=None, python=SpecifierSet(">=3.9"),
        memory_per_thread_gb=2.0, default_nvcc_threads=4, links_libcuda=False, abi3=False,
        smoke=SmokeTest(imports=modules), obsolete_patches=(), path=str(root),
    )


# What a setup.py's own string constants say it compiles: -gencode's code= targets (arch=compute_80,code=sm_80;
# code=[sm_90a,compute_90a]) and a hard-coded -std=c++17 (or MSVC's /std:c++17).
_GENCODE = re.compile(r"arch=compute_(\d+[a-z]?),code=\[?((?:(?:sm|compute)_\d+[a-z]?,?)+)\]?")
_CXX_STD = re.compile(r"^[-/]std[:=]c\+\+(\d\d)$")


def build_flags(root: Path) -> BuildFlags:
    """The -gencode targets and -std a tree's setup.py names in its string constants (BuildFlags); none for a
    tree without a setup.py that parses (comments and computed strings are not read)."""
    text = _read_text(root, Path("setup.py"), MAX_PATCH_BYTES) if (root / "setup.py").is_file() else None
    module = _parse(text) if text is not None else None
    if module is None:
        return BuildFlags()
    gencode: dict[str, None] = {}
    stds: dict[int, None] = {}
    for node in ast.walk(module):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or len(node.value) > 400:
            continue
        for m in _GENCODE.finditer(node.value.replace(" ", "")):
            for code in m.group(2).split(","):
                if code:
                    gencode.setdefault(code, None)
        std = _CXX_STD.match(node.value.strip())
        if std:
            stds.setdefault(int(std.group(1)), None)
    return BuildFlags(gencode=tuple(gencode), cxx_std=tuple(stds))


def unaudited(root: Path) -> dict:
    """A tree nobody audited (a team's own package, a fork, a changed checkout), as RecipeVersion fields:
    ``unchecked``, what a plan says of it (its facts are unchecked, with what its setup.py names, never the
    recipe's list), and ``stated``, those flags (build_flags), which the plan judges against each cell."""
    flags = build_flags(root)
    said = flags.said()
    read = (f"its setup.py names {said}, read without running it" if said else
            "its setup.py names no -gencode target or -std that imagegen reads without running it")
    return {"unchecked": f"unaudited: what this tree compiles is unchecked; {read}; `imagegen plan --audit` checks it",
            "stated": flags}


def assumed_note(root: Path) -> str:
    return (f"version {ASSUMED_VERSION} assumed: {shown_path(root)} states none that imagegen reads without running"
            f" it ({VERSION_PLACES}); give the version its wheel will have with --version X.Y.Z")


def with_declared_version(recipe: Recipe, declared: str | None) -> Recipe:
    """A local project's recipe (recipe_from_source_tree) at the version the user declares
    (``--version``): its cells, folders and image tags are named by it. A tree that states another
    version is refused: its wheel will say the tree's."""
    if not declared:
        return recipe
    try:
        label = str(Version(declared))
    except InvalidVersion:
        raise UsageError(f"--version {quoted(declared)}: not a PEP 440 version (what {recipe.name}'s wheel will"
                         " say, like 0.3.0)") from None
    safety.validate(label, safety.VERSION_LABEL, "version")
    rv = recipe.version(None)
    said = rv.source_version
    if said not in (None, label):
        # Cells, folders and image tags named 7.7 for a wheel that says 1.0 would be the mismatch
        # --version exists to prevent.
        raise UsageError(f"--version {label}: {recipe.name}'s tree says it is {said} (its wheel will say that):"
                         f" give --version {said}, or none")
    left = [part for part in rv.resolved.split("; ") if part.startswith("[build-system]")]
    rv = replace(rv, version=label, source_version=label, resolved="; ".join(left))
    return replace(recipe, default_version=label, versions={label: rv})


def read_tree(root: Path) -> TreeFacts:
    """The name, version and build requirements ``root`` states, read as its build would see them
    but statically: PKG-INFO; pyproject.toml's [project]; setup.py's setup() arguments (constants, or
    module-level names bound to one); setup.cfg's [metadata]; [tool.setuptools.dynamic] and
    [tool.hatch.version]; a package's ``__version__`` where setup.py reads one (Block-Sparse-Attention
    reads block_sparse_attn/__init__.py's). Unreadable or hostile files count as absent."""
    pyproject: dict = {}
    if (root / "pyproject.toml").is_file():
        try:
            pyproject = safety.read_toml(root / "pyproject.toml", inside=root)
        except ImagegenError:
            pyproject = {}
    project = pyproject.get("project", {})
    if not isinstance(project, dict):  # `project = 5`: not PEP 621 metadata
        project = {}
    tool = pyproject.get("tool", {}) if isinstance(pyproject.get("tool"), dict) else {}
    setup = _setup_py(root)
    cfg = _setup_cfg(root)
    requires, left_out = build_system_requires(pyproject.get("build-system"), root / "pyproject.toml")

    from_metadata = pkg_info(root)
    name = from_metadata[0] if from_metadata else str(project.get("name") or root.name)
    if name == root.name and setup.name:
        name = setup.name
    elif name == root.name and cfg.get("name"):
        name = cfg["name"]
    # Each place a thunk, read in order until one states a version (a tree with PKG-INFO reads no more).
    places: list = [
        lambda: (from_metadata[1] if from_metadata else None, "PKG-INFO"),
        lambda: (_pep440(project.get("version")), "pyproject.toml's [project].version"),
        lambda: (_pep440(setup.version), "setup.py's setup(version=...)"),
    ]
    cfg_version = cfg.get("version", "")
    if cfg_version.startswith("attr:"):
        places.append(lambda: _attr_version(root, cfg_version[5:].strip(), "setup.cfg's version = attr:"))
    elif cfg_version.startswith("file:"):
        places.append(lambda: _file_version(root, cfg_version[5:].strip(), "setup.cfg's version = file:"))
    elif cfg_version:
        places.append(lambda: (_pep440(cfg_version), "setup.cfg's [metadata] version"))
    dynamic = tool.get("setuptools", {}).get("dynamic", {}) if isinstance(tool.get("setuptools"), dict) else {}
    dyn = dynamic.get("version") if isinstance(dynamic, dict) else None
    if isinstance(dyn, dict) and isinstance(dyn.get("attr"), str):
        places.append(lambda: _attr_version(root, dyn["attr"], "[tool.setuptools.dynamic] version attr"))
    elif isinstance(dyn, dict) and isinstance(dyn.get("file"), (str, list)):
        file = dyn["file"] if isinstance(dyn["file"], str) else str((dyn["file"] or [""])[0])
        places.append(lambda: _file_version(root, file, "[tool.setuptools.dynamic] version file"))
    hatch = tool.get("hatch", {}).get("version", {}) if isinstance(tool.get("hatch"), dict) else {}
    if isinstance(hatch, dict) and isinstance(hatch.get("path"), str):
        places.append(lambda: _path_version(root, hatch["path"], "__version__", "[tool.hatch.version] path"))
    if setup.reads_dunder_version:  # get_package_version() reading block_sparse_attn/__init__.py, exec(version.py)
        places += [lambda m=f"{package}{sub}.__version__": _attr_version(root, m, "", which_reads="setup.py reads it")
                   for package in _candidate_packages(root, name) for sub in ("", ".version", "._version")]
    version, where = None, ""
    for place in places:
        version, where = place()
        if version:
            break
    else:
        version, where = None, ""
    return TreeFacts(name=name, version=version, version_from=where, build_requires=requires,
                     requires_left_out=left_out)


def build_system_requires(system: object, where: Path) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """LOCAL_BUILD_REQUIRES with the project's ``[build-system].requires`` (``system``): each a PEP 508
    requirement (packaging parses it; one that does not parse is refused, as pip would), written back
    as ``name[extras]specifiers`` and checked against safety.PIP_REQUIREMENT before it reaches a cell
    document, a Dockerfile or a Windows script. One with an environment marker or a URL, or that
    safety's pattern does not take, is left out and named (the second value): the builder installs
    the rest with the cell's torch pinned. One naming a default replaces it (``setuptools>=64``)."""
    requires = system.get("requires", []) if isinstance(system, dict) else []
    if not isinstance(requires, list) or not all(isinstance(r, str) for r in requires):
        raise RecipeError(f"{shown_path(where)}: [build-system].requires is not a list of strings")
    if len(requires) > MAX_BUILD_REQUIRES:
        raise RecipeError(f"{shown_path(where)}: [build-system].requires lists {len(requires)} requirements"
                          f" (at most {MAX_BUILD_REQUIRES})")
    own: list[str] = []
    left_out: list[str] = []
    for text in requires:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            raise RecipeError(f"{shown_path(where)}: [build-system].requires: {quoted(text)} is not a PEP 508"
                              " requirement") from None
        extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
        spec = ",".join(sorted(str(s) for s in req.specifier))
        line = f"{req.name}{extras}{spec}"
        if req.url:
            left_out.append(f"{quoted(text)} (a URL)")
        elif req.marker is not None:
            left_out.append(f"{quoted(text)} (an environment marker)")
        elif not safety.PIP_REQUIREMENT.fullmatch(line):
            left_out.append(f"{quoted(text)} (not a plain name[extras]specifier)")
        elif line not in own:
            own.append(line)
    named = {canonicalize_name(Requirement(r).name) for r in own}
    defaults = [r for r in LOCAL_BUILD_REQUIRES if canonicalize_name(r) not in named]
    return tuple(defaults + own), tuple(left_out)


def _pep440(value: object) -> str | None:
    if not isinstance(value, str) or not value.strip():
        return None
    try:
        return str(Version(value.strip()))
    except InvalidVersion:
        return None


def _read_text(root: Path, rel: Path, limit: int = MAX_SOURCE_BYTES) -> str | None:
    """A regular file of the tree (never a FIFO, nor a symlink to elsewhere), or None."""
    try:
        return safety.read_regular_file(root / rel, limit=limit, inside=root).decode("utf-8", "replace")
    except safety.Unreadable:
        return None


def _parse(text: str) -> ast.Module | None:
    try:
        return ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # not Python 3, a NUL, nested too deeply
        return None


def _constants(module: ast.Module) -> dict[str, str]:
    """The module-level names bound to a string constant (``__version__ = "0.0.1"``; the last binding wins)."""
    found: dict[str, str] = {}
    for node in module.body:
        targets = (node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign)
                   else [])
        value = getattr(node, "value", None)
        for target in targets:
            if isinstance(target, ast.Name):
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    found[target.id] = value.value
                else:
                    found.pop(target.id, None)  # rebound to something computed
    return found


@dataclass(frozen=True)
class _SetupPy:
    name: str | None = None
    version: str | None = None
    reads_dunder_version: bool = False


def _setup_py(root: Path) -> _SetupPy:
    """setup()'s name and version where they are constants or module-level names bound to one
    (``name=PACKAGE_NAME``), and whether setup.py reads a ``__version__`` (``version=get_package_version()``
    reading block_sparse_attn/__init__.py); with no setup() call, a module-level ``version`` constant. A
    setup.py that does not parse: the first quoted name= after setup( and version= anywhere."""
    if not (root / "setup.py").is_file():
        return _SetupPy()
    text = _read_text(root, Path("setup.py"), MAX_PATCH_BYTES)  # a regular file of this tree only
    if text is None:
        return _SetupPy()
    # get_package_version() reading block_sparse_attn/__init__.py; open("pkg/__init__.py") parsed by hand; exec(version.py)
    reads = "__version__" in text or bool(re.search(r"\b(__init__|_?version)\.py\b", text))
    module = _parse(text)
    if module is None:
        # The setup() call's name, not an Extension's (CUDAExtension(name="causal_conv1d_cuda", ...) comes first).
        call = re.search(r"\bsetup\s*\(", text)
        m = re.search(r"""\bname\s*=\s*["']([A-Za-z0-9_.\-]+)["']""", text[call.end():] if call else text)
        v = re.search(r"""\bversion\s*=\s*["']([0-9][A-Za-z0-9_.+\-]*)["']""", text)
        return _SetupPy(m.group(1) if m else None, v.group(1) if v else None, reads)
    constants = _constants(module)
    for node in ast.walk(module):
        func = getattr(node, "func", None)
        if isinstance(node, ast.Call) and ((isinstance(func, ast.Name) and func.id == "setup")
                                           or (isinstance(func, ast.Attribute) and func.attr == "setup")):
            args = {k.arg: _static_str(k.value, constants) for k in node.keywords if k.arg in ("name", "version")}
            name = args.get("name")
            return _SetupPy(name if name and re.fullmatch(r"[A-Za-z0-9_.\-]+", name) else None,
                            args.get("version"), reads)
    # no setup() call to read (setup(**kwargs), or a fragment): a module-level version constant
    version = next((constants[k] for k in ("version", "VERSION", "__version__") if k in constants), None)
    return _SetupPy(version=version, reads_dunder_version=reads)


def _static_str(node: ast.expr, constants: dict[str, str]) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return constants.get(node.id)
    return None


def _setup_cfg(root: Path) -> dict[str, str]:
    """setup.cfg's [metadata] name and version, as text (``attr: pkg.__version__`` left for the caller)."""
    if not (root / "setup.cfg").is_file():
        return {}
    text = _read_text(root, Path("setup.cfg"))
    if text is None:
        return {}
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    try:
        parser.read_string(text)
        section = parser["metadata"] if parser.has_section("metadata") else {}
        return {k: section[k].strip() for k in ("name", "version") if k in section}
    except (configparser.Error, ValueError):
        return {}


def _module_path(module: str) -> tuple[Path, ...] | None:
    """The files a dotted module may be (``pkg.sub``: pkg/sub/__init__.py, pkg/sub.py), under the tree
    and its src/; None for a name that is not a dotted identifier."""
    parts = module.split(".")
    if not parts or not all(p.isidentifier() and p.isascii() for p in parts) or len(parts) > 8:
        return None
    rel = Path(*parts)
    return tuple(base / p for base in (Path("."), Path("src")) for p in (rel / "__init__.py", rel.with_suffix(".py")))


def _attr_version(root: Path, attr: str, how: str, which_reads: str = "") -> tuple[str | None, str]:
    """``pkg.__version__`` (setup.cfg's ``attr:``): the constant that module binds to that name."""
    module, _, name = attr.strip().rpartition(".")
    files = _module_path(module) if module and name.isidentifier() else None
    for rel in files or ():
        version = _constant_in(root, rel, name)
        if version:
            where = f"{rel.as_posix()}'s {name}"
            return version, (f"{where}, which {which_reads}" if which_reads else f"{how} {attr} ({where})")
    return None, how


def _path_version(root: Path, path: str, name: str, how: str) -> tuple[str | None, str]:
    rel = _relative(path)
    version = _constant_in(root, rel, name) if rel is not None else None
    return version, f"{how} {rel.as_posix() if rel else ''}"


def _file_version(root: Path, path: str, how: str) -> tuple[str | None, str]:
    rel = _relative(path)
    text = _read_text(root, rel, 4096) if rel is not None else None
    return (_pep440(text) if text else None), f"{how} {rel.as_posix() if rel else ''}"


def _relative(path: str) -> Path | None:
    rel = Path(path.strip())
    if not path.strip() or rel.is_absolute() or ".." in rel.parts:
        return None
    return rel


def _constant_in(root: Path, rel: Path, name: str) -> str | None:
    if not (root / rel).is_file():
        return None
    text = _read_text(root, rel)
    module = _parse(text) if text is not None else None
    return _pep440(_constants(module).get(name)) if module is not None else None


def _candidate_packages(root: Path, name: str) -> list[str]:
    """The packages whose __version__ setup.py may read: the distribution's own name first, then the
    tree's top-level packages."""
    own = re.sub(r"[-.]+", "_", name)
    found = [own] if own.isidentifier() else []
    return found + [m for m in _top_level_modules(root) if m != own]


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


def _top_level_modules(root: Path) -> list[str]:
    found = []
    for base in (root, root / "src"):
        if not base.is_dir():
            continue
        for child in sorted(base.iterdir()):
            if child.is_dir() and (child / "__init__.py").is_file() and child.name not in ("tests", "test"):
                found.append(child.name)
    return found
