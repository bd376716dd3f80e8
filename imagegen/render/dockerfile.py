"""Render: turn one validated cell into a builder Dockerfile (Jinja2 templates in the package).

Every value the template places in an instruction passes a filter that either proves it safe or
raises: ``dq`` (a double-quoted LABEL value), ``token`` (a bare word such as an image path or an
arch list) and ``comment`` (text after ``#``: newlines and control characters are flattened, so a
comment can never end early and start an instruction). Recipe data that the build needs travels as
one line of JSON in a quoted heredoc, which Docker does not expand.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shlex
import stat
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import jinja2

from imagegen import __version__, safety
from imagegen.errors import UnsafeValueError, UsageError
from imagegen.model.cell import Cell
from imagegen.model.cell_rules import routed_smoke_modules
from imagegen.model.recipes import Recipe, RecipeVersion
from imagegen.render import templating
from imagegen.shipped.builder import imagegen_rules as rules

VENV = "/opt/imagegen/venv"
SRC_DIR = "/imagegen/src"
PYPI_CUDA_HOME = "/opt/imagegen/cuda"
WORK_DIR = "/imagegen/work"  # fixed: the same inputs compile to the same bytes (see imagegen_build.py)

_TOKEN = re.compile(r"[A-Za-z0-9_.+:/@;=,%-]{1,400}")
_UNSAFE_IN_QUOTES = re.compile(r'["\\$`\x00-\x1f\x7f]')


def _dq(value: object) -> str:
    text = str(value)
    if _UNSAFE_IN_QUOTES.search(text) or len(text) > 1000:
        raise UnsafeValueError(f"value {text[:60]!r} cannot be placed in the Dockerfile (quotes, $, ` or control characters)")
    return f'"{text}"'


def _token(value: object) -> str:
    text = str(value)
    if not _TOKEN.fullmatch(text):
        raise UnsafeValueError(f"value {text[:60]!r} cannot be placed in the Dockerfile as a bare word")
    return text


def _comment(value: object) -> str:
    # Flatten whitespace and drop control characters: the text stays on this comment line.
    text = re.sub(r"[\x00-\x1f\x7f\u2028\u2029\x85]+", " ", str(value))
    return " ".join(text.split())


class _Raw(str):
    """Heredoc bodies: emitted verbatim (everything else is flattened by the finalize hook)."""


def _finalize(value: object) -> str:
    return str(value) if isinstance(value, _Raw) else _comment(value)


def _environment() -> jinja2.Environment:
    # finalize: any {{ }} without an explicit filter is flattened to one line
    return templating.environment(filters={"dq": _dq, "token": _token, "comment": _comment}, finalize=_finalize)


def _builder_resource(name: str) -> str:
    return (resources.files("imagegen") / "shipped" / "builder" / name).read_text(encoding="utf-8")


def builder_script() -> str:
    return _builder_resource("imagegen_build.py")


# The named build context that brings builder_files() into a build (bake definitions name it; a
# rendered Dockerfile's header says how to give it to `docker buildx build`).
SCRIPTS_CONTEXT = "imagegen-scripts"


def write_scripts(folder: Path, within: Path | None = None) -> list[Path]:
    """builder_files() into ``folder`` (render -o writes them beside the Dockerfile), atomically each;
    with ``within`` (the folder the user named), none of them through a link that leads out of it."""
    from imagegen.outputs import inside, write_text_atomic

    if within is not None:
        inside(within, folder, "the scripts' folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"{folder}: cannot write: {exc.strerror or exc.__class__.__name__}") from None
    written = []
    for name, text in builder_files().items():
        if within is not None:
            inside(within, folder / name, "build script")
        write_text_atomic(folder / name, text)
        written.append(folder / name)
    return written


def write_files(files: dict[str, str], folder: Path) -> list[Path]:
    """A rendered cell's files (Rendered.files) under ``folder``, atomically each, none through a link
    that leads out of it."""
    from imagegen.outputs import inside, write_text_atomic

    written = []
    for rel, text in files.items():
        path = folder / rel
        inside(folder, path, "cell file")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"{path.parent}: cannot write: {exc.strerror or exc.__class__.__name__}") from None
        write_text_atomic(path, text)
        written.append(path)
    return written


# The modules shipped beside the in-build script (imagegen_build.py's docstring says what each is for).
# imagegen_toolchain.py first: the torch layer is made from it alone (the Dockerfile's first COPY).
BUILDER_FILES = ("imagegen_toolchain.py", "imagegen_build.py", "imagegen_fetch.py", "imagegen_sdist.py",
                 "imagegen_buildenv.py", "imagegen_supervise.py", "imagegen_ccache.py", "imagegen_resume.py",
                 "imagegen_records.py", "imagegen_check.py", "imagegen_rules.py", "imagegen_wheeltools.py",
                 "imagegen_audit.py", "imagegen_audit_records.py", "imagegen_audit_probe.py", "imagegen_audit_links.py",
                 "imagegen_audit_includes.py")


def builder_files() -> dict[str, str]:
    """Every file the in-build script needs beside it, by name (a native build writes them into its
    work folder; a Dockerfile carries them)."""
    return {name: _builder_resource(name) for name in BUILDER_FILES}


@dataclass(frozen=True)
class CellInputs:
    """A cell's document (what the in-build script reads) and the hash of everything that decides its wheel,
    worked out once per cell and handed to whatever needs them (the up-to-date check, the Dockerfile)."""
    document: dict
    inputs_hash: str


def cell_inputs(cell: Cell) -> CellInputs:
    doc = cell_document(cell)
    return CellInputs(doc, inputs_hash(cell, doc))


@dataclass(frozen=True)
class Rendered:
    cell: Cell
    dockerfile: str
    cell_json: dict
    inputs_hash: str
    # The cell's files the Dockerfile copies from its build context, by path relative to the Dockerfile's
    # folder: <files_dir>/cell.json and each patch as <files_dir>/patches/<name> (render -o and bake write them).
    files: dict[str, str]


_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,199}")


def context_files(doc: dict, files_dir: str) -> dict[str, str]:
    """The cell document as the files a Dockerfile copies: cell.json (indented, one key a line) with each
    patch named by its file, and the patches themselves, so a person reads them beside the Dockerfile."""
    safety.validate(files_dir, _FILE_NAME, "cell files folder")
    files = {}
    patches = []
    for patch in doc["patches"]:
        name = patch["name"]
        if not _FILE_NAME.fullmatch(name):
            raise UnsafeValueError(f"patch name {name[:60]!r} cannot be a file name in the build context")
        files[f"{files_dir}/patches/{name}"] = patch["text"]
        patches.append({"name": name, "reason": patch["reason"], "file": f"patches/{name}"})
    body = json.dumps({**doc, "patches": patches}, ensure_ascii=True, sort_keys=True, indent=2)
    return {f"{files_dir}/cell.json": body + "\n", **files}


def source_document(recipe: Recipe, version: RecipeVersion) -> dict:
    """Where a cell's source comes from, as the fetch steps read it (imagegen_fetch.py in a build,
    imagegen_windows.py in a Windows script): a git commit, an sdist pinned by its sha256, or a local tree."""
    source = {"kind": recipe.source_kind, "url": recipe.source_url, "ref": version.pinned_ref, "commit": version.commit,
              "submodules": recipe.submodules, "subdir": recipe.subdir}
    if recipe.source_kind == "sdist":
        assert version.sdist is not None
        source["sha256"] = version.sdist.sha256
    return source


def cell_document(cell: Cell) -> dict:
    """What the in-image build script needs to know, arch excluded (it comes from the ARG)."""
    recipe, version = cell.recipe, cell.version
    base = cell.base
    assert base is not None
    toolkit: dict = {"kind": base.toolkit}
    if base.toolkit == "pypi":
        toolkit.update(version=cell.cuda.pypi_toolkit, extras=list(cell.cuda.pypi_extras), home=PYPI_CUDA_HOME)
    source = source_document(recipe, version)
    env = dict(recipe.env)
    env.update(version.env)
    ext_env, ext_max = recipe.ext_parallel_for(version)
    return {
        "schema": 1,
        "cell": cell.name,
        "recipe": recipe.name,
        "distribution": recipe.distribution,
        "python": cell.python,
        "flavor": base.flavor.name,
        "version": version.version,
        "source": source,
        "src_dir": SRC_DIR,
        "patches": [{"name": p.name, "reason": p.reason, "text": p.text} for p in version.patches],
        "base_python": base.python,
        "venv": VENV,
        "torch": {
            "version": cell.torch_version,
            "cuda": cell.cuda.name,
            "cuda_dotted": cell.cuda.dotted,
            "index_url": cell.torch_index_url,
            # "image": the base image's interpreter has this torch (the plan knows the image): reuse it
            # through a venv with the system site packages; "if-present": a custom image, checked in the
            # build; None: install it into an isolated venv.
            "reuse": {"image": "image", "image-or-venv": "if-present"}.get(cell.torch_from or ""),
        },
        "toolkit": toolkit,
        "cuda_home": PYPI_CUDA_HOME if base.toolkit == "pypi" else None,
        "build_requires": list(recipe.build_requires),
        "env": env,
        "force_env": dict(recipe.force_env),
        "knob": {
            "env": version.arch.env,
            "style": version.arch.style,
            "keep_variant": version.arch.keep_variant,
            # requested cc -> the cc the package compiles for it (recipes.ArchKnob.runs_on): the in-build
            # script applies it to a list that comes at build time (a bake override, the GPUs of
            # `docker run --gpus all`), as cell_rules.compiled_archs does to the planned one. Only where a
            # recipe has it, so that no other cell's document (and inputs hash) changes.
            **({"runs_on": dict(version.arch.runs_on)} if version.arch.runs_on else {}),
            # A fixed-arch package compiles its own list whatever TORCH_CUDA_ARCH_LIST says: the script sizes
            # nvcc's threads and MAX_JOBS by that list's -gencode targets (cell_rules.compiled_targets). Only
            # in a fixed knob's document, so that no other cell's document (and inputs hash) changes.
            **({"targets": cell.gencode_targets} if version.arch.style == "fixed" else {}),
        },
        "jobs_env": recipe.jobs_env,
        "threads_env": recipe.threads_env,
        "ext_parallel": {"env": ext_env, "max": ext_max} if ext_env else None,
        "default_nvcc_threads": recipe.default_nvcc_threads,
        "memory_per_thread_gb": recipe.memory_per_thread_gb,
        **({"memory_per_thread_gb_max": recipe.heaviest_gb_per_thread} if recipe.source_memory_gb else {}),
        "local_version_env": recipe.local_version_env,
        "local_version": cell.local_version,
        "log_dir": "/imagegen/logs",
        "work_dir": WORK_DIR,
        # The modules this cell's arch list builds (Cell.smoke: a routed extension the list leaves out is not
        # imported); where the recipe routes one, its routes, for a build of another list (bake --set, the GPUs
        # `docker run --gpus all` sees): imagegen_check.smoke_lists.
        "smoke_imports": list(cell.smoke.imports),
        "smoke_driver_imports": list(cell.smoke.driver_imports),
        **({"smoke_routed": routed} if (routed := routed_smoke_modules(cell.version, cell.recipe.smoke)) else {}),
        # Only when set: every other cell's document (and inputs hash) stays as it was.
        **({"offline": True} if cell.offline else {}),
    }


TOOLCHAIN_KEYS = ("schema", "base_python", "venv", "torch", "toolkit", "cuda_home")
OPTIONAL_TOOLCHAIN_KEYS = ("offline",)


def toolchain_document(doc: dict) -> dict:
    """The part of a cell document the heavy toolchain layer (venv, torch, PyPI CUDA) reads: no
    recipe in it, so every recipe's builder for one torch x CUDA x Python x base shares that layer
    (one copy of several GB on disk and one download, not one per recipe)."""
    return {**{key: doc[key] for key in TOOLCHAIN_KEYS}, **{key: doc[key] for key in OPTIONAL_TOOLCHAIN_KEYS if key in doc}}


@functools.lru_cache(maxsize=1)
def _scripts_digest() -> str:
    """Every shipped module, by name and content: all of them run in the build (or decide its source)."""
    digest = hashlib.sha256()
    for name, text in builder_files().items():
        digest.update(f"{name}\0{len(text)}\0".encode() + text.encode())
    return digest.hexdigest()


def inputs_hash(cell: Cell, doc: dict) -> str:
    """A digest of everything that decides the wheel: the cell document, archs and base image, and
    for a local source tree its content (a git source is pinned by its revision in the document)."""
    assert cell.base is not None
    inputs = {"cell": doc, "archs": str(cell.archs), "base": cell.base.ref,
              "script": _scripts_digest()}
    if cell.recipe.source_kind == "local" and cell.recipe.source_path is not None:
        inputs["source_tree"] = tree_digest(cell.recipe.source_path)
    payload = json.dumps(inputs, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


# tree_digest's results by (root, every entry's path, kind, mode, size, mtime and ctime): one `imagegen build`
# hashes a local tree for the up-to-date check and again for each cell's Dockerfile, and a matrix
# has several cells per tree; a stat walk tells whether the contents must be read again.
_TREE_DIGESTS: dict[tuple, str] = {}


def tree_digest(root: Path) -> str:
    """sha256 over a source tree's paths, executable bits, file contents and symlink targets, in a
    fixed order; `.git` is left out (history that changes no file changes no wheel). An edited,
    added, removed or renamed file changes it; timestamps do not."""
    entries = []  # (path relative to root, absolute path, lstat)
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != ".git"]
        for name in dirs + files:
            path = Path(folder, name)
            entries.append((path.relative_to(root).as_posix(), path, path.lstat()))
    entries.sort(key=lambda e: e[0])
    key = (str(root), tuple((rel, st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns) for rel, _, st in entries))
    if key in _TREE_DIGESTS:
        return _TREE_DIGESTS[key]
    digest = hashlib.sha256()
    # A name need not be UTF-8 (a file name is bytes): its bytes, as the file system gives them.
    line = lambda text: digest.update(os.fsencode(text))  # noqa: E731
    try:
        for rel, path, st in entries:
            if stat.S_ISLNK(st.st_mode):
                line(f"L {rel} -> {os.readlink(path)}\n")
            elif stat.S_ISREG(st.st_mode):
                line(f"F {rel} {st.st_mode & 0o111:o} {st.st_size}\n")
                with path.open("rb") as fh:
                    for block in iter(lambda: fh.read(1 << 20), b""):
                        digest.update(block)
            elif stat.S_ISDIR(st.st_mode):
                line(f"D {rel}\n")
    except OSError as exc:  # a file the tree holds but this user cannot read
        raise UsageError(f"source tree {root}: cannot read {exc.filename!s}: {exc.strerror or exc.__class__.__name__}") from None
    _TREE_DIGESTS[key] = digest.hexdigest()
    return _TREE_DIGESTS[key]


def _packages(cell: Cell) -> tuple[list[str], list[str], list[str], list[str]]:
    """(apt, dnf) packages every builder on this base needs, then the recipe's own (apt, dnf) ones
    not already among them: those are installed after the toolchain layer, which stays shared."""
    base = cell.base
    assert base is not None
    extra = list(cell.recipe.system_requires)
    py = cell.python
    apt = ["ca-certificates", "ccache", "git", "g++", "make"]
    if base.flavor.os == "apt" and base.flavor.python_template.startswith("/usr/bin/"):
        # the distribution's interpreter (runpod, cuda, jetson): its venv and headers are packages of their own
        apt += [f"python{py}-venv", f"python{py}-dev"]
        if base.deadsnakes:
            apt += [f"python{py}"]
    dnf = ["git"]
    for pkg in extra:
        safety.validate(pkg, safety.SYSTEM_PACKAGE, "system package")
    return (sorted(set(apt)), sorted(set(dnf)),
            sorted(set(extra) - set(apt)), sorted(set(extra) - set(dnf)))


def _json_line(doc: dict) -> str:
    """``doc`` as the one line of JSON a heredoc carries (ASCII, keys sorted: the same document
    gives the same bytes, so the same layer)."""
    text = json.dumps(doc, ensure_ascii=True, sort_keys=True, separators=(",", ":"))
    if "\n" in text or "\r" in text:
        raise UnsafeValueError("internal: a heredoc's document must be one line")
    return text


def _json_lines(doc: dict) -> str:
    """``doc`` as JSON with one top-level key a line (ASCII, keys sorted: the same document gives the same
    bytes, so the same layer), short enough to read in a heredoc."""
    items = [f"  {json.dumps(k)}: {json.dumps(v, ensure_ascii=True, sort_keys=True)}" for k, v in sorted(doc.items())]
    return "{\n" + ",\n".join(items) + "\n}"


def render_dockerfile(cell: Cell, *, command: str | None = None, stdout: bool = False,
                      inputs: CellInputs | None = None, files_dir: str | None = None) -> Rendered:
    """The builder Dockerfile of ``cell``. ``stdout``: it goes to stdout, with no scripts folder beside it
    (its header says what it needs to build). ``inputs``: the cell's, where the caller has them already.
    ``files_dir``: the folder of the cell's files beside the Dockerfile (default: the cell's name)."""
    if not cell.buildable or cell.base is None:
        raise UnsafeValueError("internal: render_dockerfile needs a buildable cell")
    base = cell.base
    safety.validate(base.ref, safety.IMAGE_REF, "base image")
    safety.validate(base.python, safety.IMAGE_PATH, "Python path")
    inputs = inputs or cell_inputs(cell)
    doc, digest = inputs.document, inputs.inputs_hash
    files_dir = files_dir or cell.name
    files = context_files(doc, files_dir)
    toolchain_json = _json_lines(toolchain_document(doc))
    apt, dnf, recipe_apt, recipe_dnf = _packages(cell)
    recipe = cell.recipe
    if recipe.source_kind == "git":
        source_desc = f"{recipe.source_url} @ {cell.version.ref} ({cell.version.pinned_ref})"
    elif recipe.source_kind == "sdist":
        source_desc = f"{recipe.source_url}"
    else:
        source_desc = f"local tree {recipe.source_path} (named build context `source`)"
    image_name = f"imagegen-{recipe.name}:{cell.version.version}-torch{cell.torch.series}-{cell.cuda.name}-py{cell.python.replace('.', '')}"
    image_name = image_name.replace("+", "_")
    build_flags = (f"--platform {cell.platform} " if cell.platform != "linux/amd64" else "") + (
        f"--build-context source={shlex.quote(str(recipe.source_path))} " if recipe.source_kind == "local" else "")
    # The build requirements as pip's words (each PEP 508 string quoted for the shell), torch pinned last.
    build_requires = [shlex.quote(r) for r in [*recipe.build_requires, f"torch=={cell.torch_version}"]]
    if any("\n" in r or "\r" in r for r in build_requires):
        raise UnsafeValueError("a build requirement cannot hold a line break")
    gpu_check_json = ""
    if cell.gpu_check_device:
        safety.validate(cell.gpu_check_device, safety.CDI_DEVICE, "--gpu-check-device")
        safety.validate(cell.dockerfile_frontend or "", safety.IMAGE_REF, "--dockerfile-frontend")
        gpu_check_json = _json_line({"recipe": recipe.name, "device": cell.gpu_check_device,
                                     "code": recipe.smoke.gpu_check, "requires": list(recipe.smoke.check_requires)})
    text = _environment().get_template("Dockerfile.j2").render(
        imagegen_version=__version__,
        command=command or f"imagegen render {recipe.name}",
        cell=cell,
        recipe=recipe,
        version=cell.version,
        base=base,
        flavor=base.flavor,
        archs=str(cell.archs),
        source_desc=source_desc,
        local_source=shlex.quote(str(recipe.source_path)) if recipe.source_kind == "local" else "",
        image_name=image_name,
        inputs_hash=digest,
        cuda_home=PYPI_CUDA_HOME if base.toolkit == "pypi" else None,
        # The link-time libcuda stub: the image's CUDA's, or the one the toolchain step makes beside
        # the PyPI toolkit (imagegen_toolchain.make_libcuda_stub).
        stubs=(f"{PYPI_CUDA_HOME}/lib64/stubs" if base.toolkit == "pypi" else "/usr/local/cuda/lib64/stubs")
        if recipe.links_libcuda and (base.toolkit == "pypi" or not base.flavor.stubs_in_library_path) else None,
        apt_packages=[_token(p) for p in apt],
        dnf_packages=[_token(p) for p in dnf],
        recipe_apt_packages=[_token(p) for p in recipe_apt],
        recipe_dnf_packages=[_token(p) for p in recipe_dnf],
        venv=VENV,
        files_dir=files_dir,
        build_flags=_Raw(build_flags),
        build_requires=[_Raw(r) for r in build_requires],
        toolchain_delimiter=safety.heredoc_delimiter(toolchain_json, "IMAGEGEN_TOOLCHAIN_JSON"),
        toolchain_json=_Raw(toolchain_json),
        scripts_context=SCRIPTS_CONTEXT,
        builder_scripts=BUILDER_FILES,
        step_scripts=[name for name in BUILDER_FILES if name != "imagegen_toolchain.py"],  # that one is in already
        stdout=stdout,
        jobs_secret=rules.JOBS_SECRET,
        compile_cache_secret=rules.COMPILE_CACHE_SECRET,
        offline=cell.offline,
        net=_Raw("--network=none " if cell.offline else ""),
        gpu_check_json=_Raw(gpu_check_json),
        gpu_check_requires=bool(cell.gpu_check_device and recipe.smoke.check_requires),
        gpu_check_delimiter=safety.heredoc_delimiter(gpu_check_json, "IMAGEGEN_GPU_CHECK_JSON"),
    )
    return Rendered(cell=cell, dockerfile=text, cell_json=doc, inputs_hash=digest, files=files)
