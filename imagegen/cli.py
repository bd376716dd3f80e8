"""Command line: ``imagegen plan | render | recipes | archs``.

Every known failure is an :class:`~imagegen.errors.ImagegenError` and ends as one line on stderr
with its exit code; an unexpected exception is reported the same way (with a hint to re-run with
IMAGEGEN_DEBUG=1 for the traceback) so a user never gets a wall of Python.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import re
import shlex
import shutil
import stat
import sys
import unicodedata
from pathlib import Path
from typing import Sequence

from imagegen import __version__, ci, compat, options
from imagegen.arch import ArchList, parse_arch_list
from imagegen.config import Config, load_config
from imagegen.errors import BuildError, CompatError, ImagegenError, NothingToDoError, UsageError
from imagegen.plan import BUILDABLE, MatrixRequest, Plan, choose_cell, defaults, expand
from imagegen.recipes import (FETCH_KINDS, Catalogue, Recipe, RecipeVersion, fetched_from, load_catalogue, looks_like_path,
                              recipe_from_source_tree)
from imagegen.outputs import shown, write_output
from imagegen.render import render_dockerfile


class _Parser(argparse.ArgumentParser):
    """argparse, but usage errors are one line (plus exit code 2) like every other error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lock", type=Path, help="lock file pinning images to digests (default: imagegen.lock here, if present)")
    p.add_argument("--config", type=Path, help="imagegen.toml or pyproject.toml to read (default: searched from the current directory)")
    p.add_argument("--recipe-dir", type=Path, action="append", default=[], help="extra directory of recipe YAML files (repeatable)")


def _add_cell_args(p: argparse.ArgumentParser, *, many: bool) -> None:
    kw = {"action": "append"} if many else {}
    p.add_argument("--arch", **kw, help="GPU archs: 12.0+PTX, 8.0;9.0, sm_90a, Hopper, H100 ... " + ("(repeat for several arch sets)" if many else ""))
    p.add_argument("--torch", **kw, help="torch series or release: 2.8 or 2.8.0" + (" (repeatable)" if many else ""))
    p.add_argument("--cuda", **kw, help="CUDA variant: 12.8 or cu128" + (" (repeatable)" if many else ""))
    p.add_argument("--python", **kw, help="CPython version: 3.12" + (" (repeatable)" if many else ""))
    p.add_argument("--flavor", choices=compat.container_flavors(), help="builder base-image family (default: runpod;"
                   " imagegen/resources/compat/base_images.yaml lists them)")
    p.add_argument("--base-image", help="use this base image instead of the flavor's catalogue image")
    p.add_argument("--version", dest="recipe_version", help="recipe version to build (default: the recipe's default)")
    p.add_argument("--fetch", choices=FETCH_KINDS, help="where the source comes from: git (default) or the version's"
                   " sdist pinned by sha256 (PyPI, where the git host cannot be reached)")
    p.add_argument("--source", type=Path, **kw, help="build a local project tree (setup.py / pyproject.toml) as a recipe"
                   + (" (repeatable)" if many else ""))


def _add_cache_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cache-from", action="append", default=[], help="layer cache to import, as for buildx:"
                   " type=registry,ref=HOST/NS/cache:TAG (repeatable)")
    p.add_argument("--cache-to", action="append", default=[], help="layer cache to export: type=inline on the docker"
                   " driver; type=registry,ref=...,mode=max on docker-container / remote / kubernetes builders")


def _add_registry_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--registry", help="HOST[:PORT]/NAMESPACE of the builder images (default: config registry)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="imagegen", description="Build CUDA-extension wheels for exact torch x CUDA x Python x GPU-arch cells.")
    parser.add_argument("--version", action="version", version=f"imagegen {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    p = sub.add_parser("render", help="print a builder Dockerfile for one cell", description=(
        "Render the builder Dockerfile for one recipe and cell. Unspecified torch/CUDA/Python are filled with"
        " the newest combination that can build the requested archs."))
    p.add_argument("recipe", nargs="?", help="recipe name or alias (sage, flash-attn, ...) or a path to a local project")
    _add_cell_args(p, many=False)
    p.add_argument("-o", "--output", help="write to this file instead of stdout")
    p.add_argument("--shell", choices=("cmd", "powershell"), help="print a native Windows build script instead of a"
                   " Dockerfile (vcvarsall, the recipe's variables, pip wheel)")
    p.add_argument("--src-dir", help="with --shell: where the source is (cloned there if missing)")
    p.add_argument("--python-exe", help="with --shell: the Python with torch, e.g. ..\\.venv\\Scripts\\python.exe")
    p.add_argument("--vcvars", help="with --shell: path of vcvarsall.bat (default: VS 2022 Community)")
    p.add_argument("--max-jobs", type=int, default=None, help="with --shell: MAX_JOBS (default 1: no OOM)")
    p.add_argument("--nvcc-threads", type=int, default=None, help="with --shell: NVCC_THREADS (default 1)")
    _add_common(p)

    p = sub.add_parser("plan", help="expand the matrix and explain every cell", description=(
        "Expand recipes x torch x CUDA x Python x arch into cells and say, for each, whether it can build and why not."))
    p.add_argument("recipes", nargs="*", help="recipes (default: the config's matrix, else every recipe)")
    _add_cell_args(p, many=True)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--only", choices=("buildable", "rejected", "skipped"), help="show only cells with this status")
    p.add_argument("--audit", action="store_true", help="run each buildable cell's own build with stand-in compilers"
                   " (nothing compiles) and show what it would really compile: SASS/PTX per extension and"
                   " the nvcc flags; refuse what would fail, warn about missing or unrequested archs. Runs in each"
                   " cell's builder image on the Docker engine (its base layers are the build's: minutes the first"
                   " time, seconds after), or with --native on this host")
    p.add_argument("--native", action="store_true", help="with --audit: audit the build on this host (its Python,"
                   " torch and nvcc), as `imagegen build --native` would run it")
    p.add_argument("--python-exe", help="with --native: the interpreter whose torch to build against (default: this one)")
    p.add_argument("--src-dir", type=Path, help="with --native: an existing checkout (default: clone into --work)")
    p.add_argument("--work", type=Path, help="with --audit: where sources and logs go (default: .imagegen)")
    _add_common(p)

    p = sub.add_parser("bake", help="write docker buildx bake definitions for a matrix", description=(
        "Render every buildable cell of the matrix into a Dockerfile and write a bake file with one target per"
        " cell (local output per cell, CA secret, IMAGEGEN_-prefixed overrides). Paths are relative to the"
        " current directory, where `docker buildx bake` must run."))
    p.add_argument("recipes", nargs="*", help="recipes (default: the config's matrix, else every recipe)")
    _add_cell_args(p, many=True)
    p.add_argument("-f", "--file", default="docker-bake.hcl", help="bake file to write: .hcl or .json (default: docker-bake.hcl)")
    p.add_argument("--out", help="wheel output folder (default: config out, else wheelhouse)")
    p.add_argument("--dockerfiles", default="dockerfiles", help="folder for the rendered Dockerfiles (default: dockerfiles)")
    p.add_argument("--print", dest="show", action="store_true", help="check the file with `docker buildx bake --print` and show what buildx will run")
    p.add_argument("--repo", action="store_true", help="regenerate this repository's committed dockerfiles/, bake/ and docker-bake.hcl")
    _add_common(p)

    p = sub.add_parser("build", help="build wheels for a matrix (bake), collect and verify them", description=(
        "Plan, render and bake every buildable cell, in batches sized by RAM and cores; keep going past"
        " failures; verify each wheel's SASS/PTX and install+import it; publish wheels atomically into"
        " OUT/<pkg>-<ver>/torch<X.Y>/cu<XYZ>/ with manifest.json. Unchanged cells are skipped."))
    p.add_argument("recipes", nargs="*", help="recipes (default: the config's matrix, else every recipe)")
    _add_cell_args(p, many=True)
    p.add_argument("--out", type=Path, help="output folder (default: config out, else wheelhouse)")
    p.add_argument("--work", type=Path, default=Path(".imagegen"), help="staging, logs and bake files (default: .imagegen)")
    p.add_argument("--force", action="store_true", help="rebuild cells whose wheel is up to date; replace a wheel of the same cell built for other archs (same file name)")
    p.add_argument("--max-jobs", type=int, help="MAX_JOBS per cell (default: from free RAM and cores)")
    p.add_argument("--nvcc-threads", type=int, help="nvcc --threads per job (default: the recipe's)")
    p.add_argument("--builder", action="append", default=[], help="buildx builder to run on (default: the current"
                   " one); repeat to split the matrix across several builders (bake sends all of one run to one node)")
    _add_cache_args(p)
    p.add_argument("--ca-bundle", help="CA bundle for PyPI/git inside builds, passed as a BuildKit secret"
                   " (default: PIP_CERT / REQUESTS_CA_BUNDLE / SSL_CERT_FILE, else the system bundle)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--native", action="store_true", help="build on this host, without Docker (Colab, bare metal):"
                   " the host's Python, torch and nvcc, checked against each other first")
    p.add_argument("--flat", action="store_true", help="with --native: put the wheel directly in --out"
                   " (e.g. a mounted Google Drive folder) instead of OUT/<pkg>-<ver>/torch<X.Y>/cu<XYZ>/")
    p.add_argument("--src-dir", type=Path, help="with --native: an existing checkout to build (default: clone into --work)")
    p.add_argument("--print-env", action="store_true",
                   help="with --native: print the variables the build would set (arch knob, MAX_JOBS, ...) as JSON; build nothing")
    p.add_argument("--python-exe", help="with --native: the interpreter whose torch to build against (default: this one)")
    p.add_argument("--verbose-build", action="store_true", help="with --native: run pip wheel -v, printing every"
                   " compiler line as it comes (slows down chatty builds; without it pip prints them when the build fails)")
    p.add_argument("--no-audit", action="store_true", help="skip the gencode audit before compiling (the package's"
                   " own build run with stand-in compilers, which refuses a cell whose build would fail or miss an arch)")
    _add_common(p)

    p = sub.add_parser("verify", help="check that a wheel carries the requested SASS/PTX", description=(
        "Check a wheel: its file name parses, and every CUDA extension (.so) in it carries SASS for each"
        " requested arch and PTX where +PTX was asked (read from the .nv_fatbin section; cuobjdump is used"
        " too when installed). Each extension's archs are listed once. Archs present but not requested"
        " (the build ignored --arch or compiles a hard-coded list) are a warning, exit 0; with --strict a"
        " failure. A missing arch fails (exit 6)."))
    p.add_argument("wheels", nargs="+", type=Path, help="wheel files")
    p.add_argument("--arch", required=True, help="the archs the wheel must carry, e.g. '8.0;9.0a+PTX'")
    p.add_argument("--python-exe", help="also import the wheel's modules with this interpreter (it must have the"
                   " torch the wheel was built for); imports that need a GPU driver are reported as skipped")
    p.add_argument("--strict", action="store_true", help="fail (exit 6) when an extension carries archs not requested")
    p.add_argument("--gpu", action="store_true", help="then run the recipe's numerical GPU check (imagegen check)"
                   " on each wheel that passed, with --python-exe (default: this Python)")
    p.add_argument("--recipe-dir", type=Path, action="append", default=[], help="with --gpu: extra directory of"
                   " recipe YAML files (repeatable)")
    p.add_argument("--json", action="store_true", help="machine-readable output")

    p = sub.add_parser("check", help="run the recipe's numerical GPU check against a wheel", description=(
        "Run the recipe's smoke.gpu_check (the kernel against torch SDPA on the GPU) against a wheel: the"
        " recipe is found by the wheel's distribution name, the wheel is unpacked into a temporary folder"
        " (nothing is installed) and the check runs in a fresh interpreter from an empty folder. Exit 0: it"
        " passed; 6: it failed; 8: no torch or no CUDA GPU visible to that interpreter (nothing checked);"
        " 2: bad input (no such wheel, unknown distribution, a recipe without a gpu_check)."))
    p.add_argument("wheel", type=Path, help="wheel file")
    p.add_argument("--recipe", help="recipe whose gpu_check to run (default: the one for the wheel's distribution)")
    p.add_argument("--python", "--python-exe", dest="python_exe", metavar="EXE", help="interpreter to run the check"
                   " with (it must have the torch the wheel was built for; default: this one)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds the check may take (default: 600)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    _add_common(p)

    p = sub.add_parser("doctor", help="check this machine: torch, nvcc, GPUs, Docker/buildx, disk, RAM", description=(
        "Check what this machine can build and say how to fix each problem: Python, torch and its CUDA, nvcc and"
        " CUDA_HOME (nvcc's major must equal torch's CUDA major), GPUs and their archs, the Docker engine and buildx"
        " (a real bake matrix with local export is tried), disk, RAM/cores and the job settings builds would use."))
    p.add_argument("--python-exe", help="the interpreter whose torch to check (default: this one)")
    p.add_argument("--no-engine", action="store_true", help="skip the Docker checks")
    p.add_argument("--json", action="store_true", help="machine-readable output")

    p = sub.add_parser("recipes", help="list the recipe catalogue", description="List every recipe with its versions, arch knob and supported archs.")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    _add_common(p)

    p = sub.add_parser("archs", help="parse an arch list and show it in every consumer's format", description=(
        "Normalise a GPU arch list and print it as TORCH_CUDA_ARCH_LIST, FLASH_ATTN_CUDA_ARCHS, NATTEN_CUDA_ARCH,"
        " CMAKE_CUDA_ARCHITECTURES and -gencode flags; with --cuda/--torch, check it against them."))
    p.add_argument("arch", help="arch list, e.g. '8.0 9.0a 12.0+PTX' or Hopper")
    p.add_argument("--cuda", help="check against this nvcc version")
    p.add_argument("--torch", help="check against this torch's TORCH_CUDA_ARCH_LIST parser")
    p = sub.add_parser("push", help="build and push prebuilt builder images for a matrix", description=(
        "Bake each cell's builder stage (OS packages, torch, build requirements, the pinned and patched source;"
        " no arch) and push it as REGISTRY/imagegen-<recipe>:<ver>-torch<X.Y>-cu<XYZ>-py<XY>[-<flavor>], with OCI"
        " labels. The pushed digests are written to the lock file, which pull then uses."))
    p.add_argument("recipes", nargs="*", help="recipes (default: the config's matrix, else every recipe)")
    _add_cell_args(p, many=True)
    _add_registry_args(p)
    p.add_argument("--work", type=Path, default=Path(".imagegen"), help="bake files and logs (default: .imagegen)")
    p.add_argument("--builder", help="buildx builder to run on (default: the current one)")
    _add_cache_args(p)
    p.add_argument("--ca-bundle", help="CA bundle for PyPI/git inside builds (a BuildKit secret, never in a layer)")
    _add_common(p)

    p = sub.add_parser("pull", help="pull prebuilt builder images and run them to produce wheels", description=(
        "For each cell: pull its builder image (pinned by the lock file when it has it), run it with the GPUs"
        " visible when this host has any, verify the wheel and publish it into OUT like build. A missing image"
        " is built locally from the same Dockerfile; wrong credentials or an unreachable registry stop."))
    p.add_argument("recipes", nargs="*", help="recipes (default: the config's matrix, else every recipe)")
    _add_cell_args(p, many=True)
    _add_registry_args(p)
    p.add_argument("--out", type=Path, help="output folder (default: config out, else wheelhouse)")
    p.add_argument("--work", type=Path, default=Path(".imagegen"), help="staging and logs (default: .imagegen)")
    p.add_argument("--gpus", choices=("auto", "all", "none"), default="auto",
                   help="give the container the GPUs (auto: when nvidia-smi works here and Docker has the NVIDIA"
                   " Container Toolkit)")
    p.add_argument("--no-fallback", action="store_true", help="fail when the image is missing instead of building it locally")
    p.add_argument("--no-audit", action="store_true", help="skip the gencode audit the image runs before compiling"
                   " (the package's own build with stand-in compilers, which refuses a cell whose build would fail or miss an arch)")
    p.add_argument("--force", action="store_true", help="rebuild cells whose wheel is up to date")
    p.add_argument("--max-jobs", type=int, help="MAX_JOBS per cell (default: from RAM and cores)")
    p.add_argument("--nvcc-threads", type=int, help="nvcc --threads per job (default: the recipe's)")
    p.add_argument("--ca-bundle", help="CA bundle for a local fallback build")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    _add_common(p)

    p = sub.add_parser("lock", help="pin every base image of a matrix to its registry digest", description=(
        "Resolve the base image of every buildable cell to the digest its registry serves now and write the lock"
        " file; render, bake, build and pull then use FROM image@sha256:..., so a moved tag cannot change a build."))
    p.add_argument("recipes", nargs="*", help="recipes (default: the config's matrix, else every recipe)")
    _add_cell_args(p, many=True)
    _add_common(p)

    ci.add_parser(sub)
    return parser


# --------------------------------------------------------------------------------------------


def _config(args: argparse.Namespace) -> Config:
    return load_config(args.config, search_from=Path.cwd()) if args.config else load_config(search_from=Path.cwd())


def _catalogue(args: argparse.Namespace, config: Config) -> Catalogue:
    return load_catalogue(tuple(config.recipe_dirs) + tuple(args.recipe_dir))


def _resolve(cat: Catalogue, name: str | None, source: Path | None, wanted_version: str | None,
             fetch: str | None = None) -> tuple[Recipe, RecipeVersion]:
    if source is not None and name is not None:
        raise UsageError(f"name a recipe ({shown(name, 60)}) or give --source {shown(source, 60)}, not both")
    if source is not None:
        recipe = recipe_from_source_tree(source)
    elif name is None:
        raise UsageError("name a recipe (imagegen recipes lists them) or give --source PATH")
    elif looks_like_path(name):
        recipe = recipe_from_source_tree(Path(name))
    else:
        recipe = cat.get(name)
    return fetched_from(recipe, recipe.version(wanted_version), fetch)


def _lock(args: argparse.Namespace):
    from imagegen.registry import LOCK_FILE, Lock

    path = getattr(args, "lock", None)
    if path is not None and not str(path).strip():
        raise UsageError("--lock: give the lock file's path")
    if path is not None and not _is_file(path) and args.command not in ("lock", "push"):
        raise UsageError(f"--lock {shown(path)}: no such file (imagegen lock writes it)")
    return Lock.load(path or Path(LOCK_FILE))


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except (OSError, ValueError):  # a name too long, a NUL
        return False


def _planned(args: argparse.Namespace, config: Config, cat: Catalogue):
    """The matrix expanded, with locked base images pinned to their digests; a cell asked twice
    (``sage SAGE``, ``--torch 2.8 --torch 2.8.0``, ``--cuda 12.8 --cuda cu128``) is there once."""
    return _lock(args).pin_bases(_unique_cells(expand(_matrix(args, config, cat))))


def _unique_cells(plan: Plan) -> Plan:
    import dataclasses

    seen: set = set()
    cells = []
    for c in plan.cells:
        key = (c.name, str(c.archs), c.status)
        if key not in seen:
            seen.add(key)
            cells.append(c)
    return dataclasses.replace(plan, cells=cells)


def _one_target_per_cell(plan: Plan) -> Plan:
    """bake/build/pull make one bake target per cell, named by the cell: two arch lists of one cell
    would be two targets of one name (bake keeps one of them, or refuses the file)."""
    archs: dict[str, str] = {}
    for c in plan.buildable:
        other = archs.setdefault(c.name, str(c.archs))
        if other != str(c.archs):
            raise UsageError(f"{c.name} is asked for two arch lists ({other} and {c.archs}): a build makes one target"
                             f" per cell; give one --arch list (e.g. --arch '{other};{c.archs}'), or run once per list")
    return plan


def _registry(args: argparse.Namespace, config: Config) -> str:
    from imagegen.registry import check_registry

    value = options.resolve(args, config).registry
    if not value:
        raise UsageError("no registry: pass --registry HOST[:PORT]/NAMESPACE or set registry in imagegen.toml")
    return check_registry(value)


_BUILDER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,99}")


def _check_builders(values: Sequence[str] | str | None) -> None:
    for v in [values] if isinstance(values, str) else values or []:
        if not _BUILDER.fullmatch(v):
            raise UsageError(f"--builder {v!r}: not a buildx builder name (letters, digits, '.', '_', '+', '-')")


def _ca_bundle(value: str | None) -> str | None:
    if value is not None and not _is_file(Path(value)):
        raise UsageError(f"--ca-bundle {shown(value)}: no such file (a PEM bundle, e.g. /etc/ssl/certs/ca-certificates.crt)")
    return value


def _check_cache_specs(values: Sequence[str]) -> list[str]:
    for v in values:
        if not _CACHE_SPEC.fullmatch(v):
            raise UsageError(f"cache spec {v!r}: expected buildx's key=value,... form, e.g. type=registry,ref=HOST/NS/cache:TAG")
    return list(values)


_CACHE_SPEC = re.compile(r"type=[a-z]+(,[a-z-]+=[A-Za-z0-9._:/@=-]+)*|[a-z0-9.-]+(:[0-9]+)?/[A-Za-z0-9._/:@-]+")


def _command_line(argv: Sequence[str]) -> str:
    """The command line as one line (it becomes a comment in generated files): an argument with a
    newline or another control character is written in bash's $'...' form."""
    return "imagegen " + " ".join(_quote_arg(a) for a in argv)


def _quote_arg(arg: str) -> str:
    if all(c.isprintable() for c in arg):
        return shlex.quote(arg)
    return "$'" + "".join(c if c.isprintable() and c not in "\\'" else
                          ("\\" + c if c in "\\'" else c.encode("unicode_escape").decode("ascii")) for c in arg) + "'"


def _check_exe(value: str | None, flag: str) -> str | None:
    """A --python-exe here: an existing, executable regular file (or a name on PATH), else one line (exit 2)."""
    if value is None:
        return None
    if not value.strip() or len(value) > 4096 or not all(c.isprintable() for c in value):
        raise UsageError(f"{flag} {shown(value, 80)}: not a usable interpreter path")
    exe = value if (os.sep in value or (os.altsep and os.altsep in value)) else shutil.which(value)
    if exe is None:
        raise UsageError(f"{flag} {shown(value, 80)}: no such interpreter on PATH")
    try:
        st = os.stat(exe)
    except OSError as exc:
        why = {errno.ELOOP: "a symlink loop", errno.ENAMETOOLONG: "the name is too long",
               errno.ENOENT: "no such file"}.get(exc.errno or 0, exc.strerror)
        raise UsageError(f"{flag} {shown(value, 80)}: {why}") from None
    if not stat.S_ISREG(st.st_mode):
        raise UsageError(f"{flag} {shown(value, 80)}: not a file")
    if not os.access(exe, os.X_OK):
        raise UsageError(f"{flag} {shown(value, 80)}: not executable (permission denied)")
    return value


def cmd_render(args: argparse.Namespace, argv: Sequence[str]) -> int:
    config = _config(args)
    cat = _catalogue(args, config)
    _render_flags(args)
    recipe, version = _resolve(cat, args.recipe, args.source, args.recipe_version, args.fetch)
    opts = options.resolve(args, config)
    archs = parse_arch_list(opts.arch_configured or defaults()["matrix"]["arch"])
    if args.shell:
        return _render_windows(args, argv, recipe, version, archs)
    # A config matrix narrows render's choice; its last entry (the newest listed) wins.
    cell = choose_cell(recipe, version, archs, torch=opts.torch_one, cuda=opts.cuda_one, python=opts.python_one,
                       flavor=opts.flavor, base_image=opts.base_image, torch_index_override=opts.torch_index_url)
    cell = _lock(args).pin_bases(Plan(cells=[cell])).cells[0]
    rendered = render_dockerfile(cell, command=_command_line(argv))
    write_output(rendered.dockerfile, args.output)
    if args.output not in (None, "-"):
        # The build steps beside it, as the Dockerfile's header builds it: --build-context imagegen-scripts=...
        from imagegen.render import SCRIPTS_CONTEXT, write_scripts
        folder = Path(args.output).parent / SCRIPTS_CONTEXT  # beside the name given (a symlink's too)
        write_scripts(folder)
        print(f"wrote {args.output} and {folder}/: {cell.describe()} on {cell.base.ref}", file=sys.stderr)
    return 0


def _render_flags(args: argparse.Namespace) -> None:
    """render makes a Dockerfile or (--shell) a Windows script: a flag the chosen one ignores is refused."""
    if args.shell:
        for flag, value in (("--python", args.python), ("--flavor", args.flavor), ("--base-image", args.base_image),
                            ("--lock", args.lock)):
            if value is not None:
                raise UsageError(f"{flag} does not apply to --shell (a native script uses the host's"
                                 f" {'interpreter: give --python-exe' if flag == '--python' else 'toolchain, no image'})")
        if bool(args.torch) != bool(args.cuda):
            raise UsageError("with --shell, --torch and --cuda go together (they name the wheel's local version,"
                             " e.g. +cu128torch2.8; the script builds against the torch --python-exe has)")
    else:
        for flag, value in (("--src-dir", args.src_dir), ("--python-exe", args.python_exe), ("--vcvars", args.vcvars),
                            ("--max-jobs", args.max_jobs), ("--nvcc-threads", args.nvcc_threads)):
            if value is not None:
                raise UsageError(f"{flag} goes with --shell cmd|powershell (a Dockerfile takes MAX_JOBS and"
                                 " NVCC_THREADS as build args at bake time)")


def _render_windows(args, argv, recipe, version, archs) -> int:
    from imagegen import windows

    if version.arch.style != "fixed":
        supported = {a.cc for a in version.archs}
        bad = [a for a in archs if a.cc not in supported]
        if bad:
            raise UsageError(f"{recipe.name} {version.version} does not support {', '.join(a.sm for a in bad)}"
                             f" (it supports {', '.join(sorted(supported))})")
    for flag, value in (("--max-jobs", args.max_jobs), ("--nvcc-threads", args.nvcc_threads)):
        if value is not None and not 1 <= value <= 1024:
            raise UsageError(f"{flag} must be between 1 and 1024")
    local = None
    if args.torch and args.cuda:
        series, _ = compat.torch_series(args.torch)
        local = f"{compat.cuda_variant(args.cuda).name}torch{series.series}"
    text = windows.render_script(
        args.shell, recipe, version, archs, src=args.src_dir or recipe.name, python=args.python_exe or "python",
        vcvars=args.vcvars or windows.DEFAULT_VCVARS, max_jobs=args.max_jobs or 1, nvcc_threads=args.nvcc_threads or 1,
        local_version=local, command=_command_line(argv))
    write_output(text, args.output)
    return 0


def _matrix(args: argparse.Namespace, config: Config, cat: Catalogue) -> MatrixRequest:
    opts = options.resolve(args, config)
    # --source alone means just that project; otherwise the named recipes, the config's, or all.
    sources = args.source or []
    names = args.recipes or ([] if sources else list(opts.recipes) or cat.names())
    pairs, seen = [], set()
    # A recipe named twice (sage SAGE sageattention) or one project given twice is built once.
    for recipe, version in [_resolve(cat, n, None, args.recipe_version, args.fetch) for n in names] \
            + [_resolve(cat, None, source, None, args.fetch) for source in sources]:
        key = (recipe.name, version.version, str(recipe.source_path) if recipe.source_path else None)
        if key not in seen:
            seen.add(key)
            pairs.append((recipe, version))
    archs = []
    for a in opts.archs:
        parsed = parse_arch_list(a)
        if str(parsed) not in {str(x) for x in archs}:
            archs.append(parsed)
    return MatrixRequest(
        recipes=pairs,
        torch=list(opts.torch),
        cuda=list(opts.cuda),
        python=list(opts.python),
        archs=archs,
        flavor=opts.flavor,
        base_image=opts.base_image,
        torch_index_override=opts.torch_index_url,
    )


def _cell_record(cell) -> dict:
    return {
        "name": cell.name,
        "status": cell.status,
        "recipe": cell.recipe.name,
        "version": cell.version.version,
        "torch": cell.torch_version,
        "cuda": cell.cuda.name,
        "python": cell.python,
        "archs": str(cell.archs),
        # What was asked, where the package compiles something else for it (flash-attn: 8.6 -> 8.0).
        "requested_archs": str(cell.requested_archs or cell.archs),
        "expected_archs": str(cell.expected_archs) if cell.status == BUILDABLE else None,
        "flavor": cell.flavor,
        "base_image": cell.base.ref if cell.base else None,
        "reasons": list(cell.problems),
        "notes": list(cell.notes),
        "wheel_dir": cell.wheel_dir,
    }


def _print_plan(plan: Plan, only: str | None) -> None:
    cells = [c for c in plan.cells if only is None or c.status == only]
    rows = [("STATUS", "RECIPE", "VERSION", "TORCH", "CUDA", "PY", "ARCHS", "WHY")]
    for c in cells:
        why = "; ".join(c.problems) if c.problems else "; ".join(c.notes) or (c.base.ref if c.base else "")
        rows.append((c.status, c.recipe.name, c.version.version, c.torch.series, c.cuda.name, c.python, str(c.archs), why))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    out = sys.stdout
    for r in rows:
        out.write("  ".join(v.ljust(w) for v, w in zip(r, widths)) + "  " + r[-1] + "\n")
    out.write(f"\n{len(plan.buildable)} buildable, {len(plan.rejected)} rejected, {len(plan.skipped)} skipped"
              f" of {len(plan.cells)} cells\n")


def cmd_plan(args: argparse.Namespace, argv: Sequence[str]) -> int:
    config = _config(args)
    cat = _catalogue(args, config)
    if args.audit:
        args.work = args.work or Path(".imagegen")
        return _plan_audit(args, config, cat)
    for flag, value in (("--native", args.native), ("--python-exe", args.python_exe), ("--src-dir", args.src_dir),
                        ("--work", args.work)):
        if value:
            raise UsageError(f"{flag} goes with --audit (plan the host's build with `imagegen plan --audit --native`)")
    plan = _planned(args, config, cat)
    if args.json:
        json.dump({"cells": [_cell_record(c) for c in plan.cells],
                   "summary": {"buildable": len(plan.buildable), "rejected": len(plan.rejected),
                               "skipped": len(plan.skipped), "total": len(plan.cells)}}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        _print_plan(plan, args.only)
    if not plan.buildable:
        raise NothingToDoError("no cell of this matrix can build; the reasons are listed above")
    return 0


def cmd_recipes(args: argparse.Namespace, argv: Sequence[str]) -> int:
    if args.lock is not None:
        _lock(args)  # recipes uses no image, but a --lock that is not a lock file is a mistake worth saying
    config = _config(args)
    cat = _catalogue(args, config)
    records = []
    for name in cat.names():
        r = cat.recipes[name]
        records.append({
            "name": r.name, "aliases": list(r.aliases), "description": r.description, "source": r.source_url or str(r.source_path),
            "default_version": r.default_version,
            "versions": {k: {"ref": v.ref, "commit": v.commit, "archs": str(v.archs), "arch_env": v.arch.env,
                             "arch_style": v.arch.style, "ptx": v.arch.ptx, "notes": v.notes} for k, v in r.versions.items()},
            "force_env": dict(r.force_env), "local_version_env": r.local_version_env, "path": r.path,
        })
    if args.json:
        json.dump(records, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    for rec in records:
        aliases = f" (aliases: {', '.join(rec['aliases'])})" if rec["aliases"] else ""
        print(f"{rec['name']}{aliases}: {rec['description']}")
        for k, v in rec["versions"].items():
            default = " [default]" if k == rec["default_version"] else ""
            knob = f"{v['arch_env']} ({v['arch_style']})" if v["arch_env"] else "fixed list"
            print(f"  {k}{default}: archs {v['archs']}; knob {knob}; PTX {v['ptx']}")
    return 0


def cmd_archs(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from imagegen import arch as A

    archs: ArchList = A.parse_arch_list(args.arch)
    problems: list[str] = []
    if args.cuda:
        cuda = compat.cuda_variant(args.cuda) if not args.cuda.count(".") == 2 else None
        problems += A.nvcc_problems(archs, A.parse_cuda_version(args.cuda) if cuda is None else cuda.version)
    if args.torch:
        series, tv = compat.torch_series(args.torch)
        problems += A.torch_problems(archs, tv)
    print(f"normalised               {archs}")
    print(f"TORCH_CUDA_ARCH_LIST     {_try(lambda: A.to_torch_arch_list(archs))}")
    for line in _numeric_knob_lines(archs):
        print(line)
    print(f"NATTEN_CUDA_ARCH         {A.to_dotted_list(archs)}")
    print(f"CMAKE_CUDA_ARCHITECTURES {A.to_cmake(archs)}")
    print(f"nvcc                     {' '.join(A.to_gencode(archs))}")
    print(f"minimum CUDA             {A.min_cuda_for(archs)}")
    for p in problems:
        print(f"problem: {p}", file=sys.stderr)
    return 3 if problems else 0


def _numeric_knob_lines(archs: ArchList) -> list[str]:
    """FLASH_ATTN_CUDA_ARCHS / BLOCK_SPARSE_ATTN_CUDA_ARCHS as the package really gets them.

    Those knobs take 80 but not 86/89 (silently ignored); the plan maps such a request to the arch
    whose cubin runs on it, so show that value (80;90 for 80;86;89;90) and say why.
    """
    from imagegen.arch import to_numeric_list
    from imagegen.plan import compiled_archs

    knobs: dict[str, tuple[Recipe, RecipeVersion]] = {}
    for recipe in load_catalogue().recipes.values():
        version = recipe.version(None)
        knob = version.arch
        if knob.style == "numeric" and knob.env:
            knobs.setdefault(knob.env, (recipe, version))
    lines = []
    for env, (recipe, version) in sorted(knobs.items()):
        compiled, mapped = compiled_archs(version, archs)
        extra = [mapped] if mapped else []
        supported = {a.cc for a in version.archs}
        missing = [a.cc for a in compiled if a.cc not in supported]
        if missing:
            extra.append(f"does not build {', '.join(missing)}: imagegen plan rejects such a cell")
        about = f"  ({recipe.name} {version.version}: {'; '.join(extra)})" if extra else ""
        lines.append(f"{env:<24} {to_numeric_list(compiled, keep_variant=version.arch.keep_variant)}{about}")
    return lines


def _try(fn) -> str:
    try:
        return fn()
    except ImagegenError as exc:
        return f"(cannot express: {exc})"


def cmd_bake(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from imagegen import bakefiles

    config = _config(args)
    cat = _catalogue(args, config)
    if args.repo:
        written = bakefiles.write_repo_files(Path.cwd(), cat)
        for path in written:
            print(f"wrote {path}", file=sys.stderr)
        return 0
    plan = _one_target_per_cell(_planned(args, config, cat))
    for c in plan.rejected:
        print(f"skipping {c.name}: {'; '.join(c.problems)}", file=sys.stderr)
    if not plan.buildable:
        raise NothingToDoError("no cell of this matrix can build (imagegen plan explains each)")
    out = args.out or (os.path.relpath(config.out) if config.path else "wheelhouse")
    if os.path.lexists(out) and not os.path.isdir(out):
        raise UsageError(f"--out {shown(out)}: exists and is not a folder (the wheels go into folders under it)")
    written, printed = bakefiles.write_bake(plan, Path.cwd(), Path(args.file), out_dir=str(out),
                                            dockerfiles_dir=args.dockerfiles, command=_command_line(argv),
                                            check=args.show)
    for path in written:
        print(f"wrote {path}", file=sys.stderr)
    if args.show and printed is not None:
        json.dump(printed, sys.stdout, indent=2)
        sys.stdout.write("\n")
    return 0


def cmd_build(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from imagegen import execute
    from imagegen.errors import BuildError

    config = _config(args)
    cat = _catalogue(args, config)
    if args.native:
        return _build_native(args, config, cat)
    if args.print_env:
        raise UsageError("--print-env goes with --native (a container build prints its variables in its log)")
    if args.verbose_build:
        raise UsageError("--verbose-build goes with --native (a container build prints the compiler output when it fails)")
    for flag, value in (("--flat", args.flat), ("--src-dir", args.src_dir), ("--python-exe", args.python_exe)):
        if value:
            raise UsageError(f"{flag} goes with --native (a container build has its own source and Python)")
    _check_builders(args.builder)
    plan = _one_target_per_cell(_planned(args, config, cat))
    for c in plan.rejected:
        print(f"[{c.name}] rejected: {'; '.join(c.problems)}", file=sys.stderr)
    if not plan.buildable:
        raise NothingToDoError("no cell of this matrix can build (imagegen plan explains each)")
    for flag, value in (("--max-jobs", args.max_jobs), ("--nvcc-threads", args.nvcc_threads)):
        if value is not None and not 1 <= value <= 1024:
            raise UsageError(f"{flag} must be between 1 and 1024")
    _ca_bundle(args.ca_bundle)
    out = options.resolve(args, config).out
    from imagegen.finish import finish

    results = execute.build(plan, out=out, work=args.work, finish=finish, force=args.force, max_jobs=args.max_jobs,
                            nvcc_threads=args.nvcc_threads, builders=args.builder, ca_bundle=args.ca_bundle,
                            cache_from=_check_cache_specs(args.cache_from), cache_to=_check_cache_specs(args.cache_to),
                            audit=not args.no_audit)
    if args.json:
        print(execute.results_json(results))
    else:
        print(execute.summary(results))
    failed = [r for r in results if r.status == "failed"]
    if failed:
        raise BuildError(f"{len(failed)} of {len(results)} cells failed: "
                         + ", ".join(f"{r.cell.name} (log: {r.log})" for r in failed))
    return 0


def _plan_audit(args: argparse.Namespace, config: Config, cat: Catalogue) -> int:
    """plan --audit: what each cell's own build would compile, judged before anything compiles; on
    this host (--native) or in each cell's builder image (the engine), where `imagegen build` runs it."""
    from imagegen import native
    from imagegen.audit import refuse

    if args.native:
        cell, host = _native_cell(args, config, cat)
        verdict = native.audit_native(cell, host, work=args.work, src_dir=args.src_dir, say=lambda m: None)
        audited = [(cell, verdict, "")]
    else:
        for flag, value in (("--python-exe", args.python_exe), ("--src-dir", args.src_dir)):
            if value:
                raise UsageError(f"{flag} goes with --native (the builder image has its own Python and source)")
        from imagegen import execute

        plan = _planned(args, config, cat)
        for c in plan.rejected:
            print(f"[{c.name}] rejected: {'; '.join(c.problems)}", file=sys.stderr)
        if not plan.buildable:
            raise NothingToDoError("no cell of this matrix can build, so there is nothing to audit (imagegen plan explains each)")
        audited = [(o.cell, o.verdict, o.error + (f" (log: {o.log})" if o.log else ""))
                   for o in execute.audit(plan, work=args.work, say=lambda m: print(m, file=sys.stderr, flush=True))]
    if args.json:
        records = [{"cell": _cell_record(cell), "audit": verdict.as_dict() if verdict else None,
                    **({"error": error} if verdict is None else {})} for cell, verdict, error in audited]
        json.dump(records[0] if args.native else records, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for cell, verdict, error in audited:
            if verdict is None:
                print(f"{cell.describe()}: AUDIT FAILED: {error}")
                continue
            print(f"{cell.describe()}: {'buildable' if verdict.ok else 'REFUSED'} (audit {verdict.report.seconds:.1f} s)")
            for line in (*verdict.table().splitlines(), *verdict.findings()):
                print(f"  {line}")
    refused = [(cell, verdict) for cell, verdict, _ in audited if verdict is not None and not verdict.ok]
    failed = [cell for cell, verdict, _ in audited if verdict is None]
    if len(audited) == 1 and refused:
        raise refuse(*refused[0])
    if refused or failed:
        raise CompatError(f"the gencode audit refuses {len(refused)} and could not run {len(failed)} of {len(audited)}"
                          f" cell(s): {', '.join(c.name for c, _ in refused)}{', ' if refused and failed else ''}"
                          f"{', '.join(c.name for c in failed)}")
    return 0


def _native_cell(args: argparse.Namespace, config: Config, cat: Catalogue):
    """The one cell a native build (or audit) makes on this host, checked like plan's cells."""
    from imagegen import native

    sources = getattr(args, "source", None) or []
    if len(args.recipes) + len(sources) != 1:
        raise UsageError("--native builds one recipe (or one --source) at a time, for this host's torch")
    if len(args.arch or []) > 1:
        raise UsageError("--native takes one --arch list")
    recipe, version = _resolve(cat, args.recipes[0] if args.recipes else None, sources[0] if sources else None,
                               args.recipe_version, args.fetch)
    host = native.probe(_check_exe(args.python_exe, "--python-exe"))
    # --torch/--cuda/--python describe the host here: refuse a mismatch instead of building the wrong thing.
    for flag, wanted, have in (("--torch", args.torch, host.torch), ("--cuda", args.cuda, host.torch_cuda),
                               ("--python", args.python, host.python)):
        for w in wanted or []:
            if have is None or not (have == w or have.startswith(w + ".") or compat.cuda_variant(w).dotted == have
                                    if flag == "--cuda" else have == w or have.startswith(w + ".")):
                raise UsageError(f"{flag} {w} asked, but this host has {have}: a native build uses the host's;"
                                 " install the one you want, or build in a container")
    # With no --arch: the GPUs this host has (seed 000 builds for the Colab GPU it runs on).
    archs = parse_arch_list(options.resolve(args, config).arch_configured or ";".join(host.ccs)
                            or defaults()["matrix"]["arch"])
    return native.preflight(recipe, version, archs, host), host


def _build_native(args: argparse.Namespace, config: Config, cat: Catalogue) -> int:
    from imagegen import native

    cell, host = _native_cell(args, config, cat)
    if args.print_env:
        # With the audit, the MAX_JOBS printed is the one the build will use (sized from the audit).
        print(json.dumps(native.build_env_native(cell, host, work=args.work, max_jobs=args.max_jobs,
                                                 nvcc_threads=args.nvcc_threads, src_dir=args.src_dir,
                                                 audit=not args.no_audit)))
        return 0
    out = options.resolve(args, config).out
    if not args.flat:
        from imagegen import wheelhouse

        refused = wheelhouse.replacement_refused(Path(out), cell, force=args.force,
                                              say=lambda m: print(m, file=sys.stderr))
        if refused:
            raise UsageError(refused)
    from imagegen.finish import finish
    from imagegen.interrupt import stopping_children

    with stopping_children():  # a signal to imagegen ends the compile it started
        dest = native.build_native(cell, host, out=out, work=args.work, finish=finish, flat=args.flat,
                                   max_jobs=args.max_jobs,
                                   nvcc_threads=args.nvcc_threads, src_dir=args.src_dir,
                                   verbose_build=args.verbose_build, audit=not args.no_audit)
    print(dest)
    return 0


def cmd_doctor(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from imagegen import doctor

    report = doctor.run(_check_exe(args.python_exe, "--python-exe"), Path.cwd(), engine=not args.no_engine)
    print(report.as_json() if args.json else report.text())
    if report.failed:
        raise ImagegenError(f"{len(report.failed)} problem(s): " + "; ".join(f"{c.name}: {c.fix or c.detail}" for c in report.failed))
    return 0


def cmd_verify(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from imagegen.verify import VerifyError, verify_wheel

    archs = parse_arch_list(args.arch)
    _check_exe(args.python_exe, "--python-exe")
    reports = []
    try:  # the recipes tell how a package compiles a request; --gpu needs them, plain verify does without
        cat: Catalogue | None = load_catalogue(tuple(load_config(search_from=Path.cwd()).recipe_dirs) + tuple(args.recipe_dir))
    except ImagegenError:
        if args.gpu:
            raise
        cat = None
    for wheel in args.wheels:
        try:
            is_file = wheel.is_file()
        except OSError as exc:  # a 5000-character name
            raise UsageError(f"{shown(wheel)}: {exc.strerror or 'not a usable path'}") from None
        if not is_file:
            raise UsageError(f"{shown(wheel)}: no such wheel file")
        expected, knowledge = _recipe_view(cat, wheel, archs)
        report = verify_wheel(wheel, expected, strict=args.strict, extension_archs=knowledge)
        if args.python_exe:
            from imagegen.native import import_test, wheel_modules

            try:
                report.imports = import_test(wheel, wheel_modules(wheel), args.python_exe)
            except ImagegenError as exc:
                report.problems.append(str(exc))
        reports.append(report)
    no_gpu = _verify_gpu(args, cat, reports) if args.gpu and cat is not None else None
    if args.json:
        json.dump([r.as_dict() for r in reports], sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for r in reports:
            print(f"{'ok  ' if r.ok else 'FAIL'} {r.wheel}")
            for so in r.extensions:
                print(f"     {so.name}: {so.summary()}")
            for w in r.warnings:
                print(f"     warning: {w}")
            for module, result in (r.imports or {}).items():
                print(f"     import {module}: {result}")
            if r.gpu_check and r.gpu_check.get("status") == "passed":
                for line in r.gpu_check["output"]:
                    print(f"     gpu_check: {line}")
                print(f"     gpu_check passed on {r.gpu_check['device']} in {r.gpu_check['seconds']:.1f} s")
            for p in r.problems:
                print(f"     problem: {p}")
    bad = [r for r in reports if not r.ok]
    if bad:
        raise VerifyError(f"{len(bad)} of {len(reports)} wheels failed verification: " + "; ".join(bad[0].problems))
    if no_gpu is not None:
        raise no_gpu
    warned = [r for r in reports if r.warnings]
    if warned:
        print(f"imagegen: warning: {len(warned)} of {len(reports)} wheels carry archs not requested"
              " (--strict makes that a failure)", file=sys.stderr)
    return 0


def _recipe_view(cat: Catalogue | None, wheel: Path, archs: ArchList) -> tuple[ArchList, dict]:
    """What ``wheel`` must carry for the request ``archs``, seen through the recipe that builds its
    distribution (the version whose label is the wheel's version, else the default one): the
    request mapped the way the package compiles it (SageAttention builds 9.0 as sm_90a; flash-attn's
    8.6 runs the sm_80 cubin), and the per-extension knowledge (_qattn_sm90: 9.0a only). A wheel no
    recipe knows is held to the request as written, in every extension."""
    from packaging.utils import parse_wheel_filename
    from packaging.version import Version

    from imagegen import check
    from imagegen.plan import compiled_archs, expected_archs

    if cat is None:
        return archs, {}
    try:
        dist, version, _, _ = parse_wheel_filename(wheel.name)
        recipe = check.recipe_for(cat, str(dist))
    except (ImagegenError, ValueError):
        return archs, {}
    chosen = next((v for k, v in recipe.versions.items() if k == version.public), recipe.version(None))
    if chosen.arch.style == "fixed":  # what it compiles depends on the nvcc that built it: take the request
        return archs, dict(chosen.extensions)
    compiled, _ = compiled_archs(chosen, archs)
    return expected_archs(chosen, compiled, Version("99.0")), dict(chosen.extensions)


def _verify_gpu(args: argparse.Namespace, cat: Catalogue, reports: list) -> ImagegenError | None:
    """verify --gpu: `imagegen check` on each wheel that passed. Returns the NoGpuError (exit 8) to
    raise once the reports are printed; a failed check is a problem of its wheel."""
    from imagegen import check

    for wheel, report in zip(args.wheels, reports):
        if not report.ok:
            continue
        try:
            report.gpu_check = check.check_wheel(wheel, cat, python_exe=args.python_exe).as_dict()
        except check.NoGpuError as exc:
            return exc  # the same for every wheel: stop
        except ImagegenError as exc:
            report.gpu_check = {"status": "failed", "error": str(exc)}
            report.problems.append(str(exc))
    return None


def cmd_check(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from imagegen import check

    try:
        args.wheel.stat()
    except FileNotFoundError:
        pass  # check says so, with the hint
    except (OSError, ValueError) as exc:  # a name too long, a loop
        raise UsageError(f"{shown(args.wheel)}: {getattr(exc, 'strerror', None) or 'not a usable path'}") from None
    _lock(args)  # a given lock file must at least be one (check runs no image)
    cat = _catalogue(args, _config(args))
    result = check.check_wheel(args.wheel, cat, recipe=args.recipe, python_exe=args.python_exe, timeout=args.timeout)
    if args.json:
        json.dump(result.as_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for line in result.output:
            print(line)
        print(result.summary(), file=sys.stderr)
    return 0


def _buildable(args, config, cat, *, arch_free: bool = False):
    """The plan's buildable cells (one per target name: a builder image, ``arch_free``, is one per cell
    whatever the arch lists)."""
    plan = _planned(args, config, cat)
    if arch_free:
        import dataclasses

        names: set[str] = set()
        plan = dataclasses.replace(plan, cells=[c for c in plan.cells if not (c.status == BUILDABLE and (
            c.name in names or names.add(c.name)))])
    else:
        plan = _one_target_per_cell(plan)
    for c in plan.rejected:
        print(f"[{c.name}] rejected: {'; '.join(c.problems)}", file=sys.stderr)
    if not plan.buildable:
        raise NothingToDoError("no cell of this matrix can build (imagegen plan explains each)")
    return plan


def cmd_push(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from imagegen import prebuilt

    config = _config(args)
    cat = _catalogue(args, config)
    registry = _registry(args, config)
    plan = _buildable(args, config, cat, arch_free=True)
    from imagegen.outputs import resolve_target
    from imagegen.registry import probe

    # Everything the user gave is checked first; then the registry, before anything is built.
    lock = _lock(args)
    resolve_target(lock.path, "lock file")  # push writes the pushed digests there
    _check_builders(args.builder)
    cache_from, cache_to = _check_cache_specs(args.cache_from), _check_cache_specs(args.cache_to)
    ca = _ca_bundle(args.ca_bundle)
    probe(registry)  # unreachable, not a registry, wrong password: said now
    results = prebuilt.push(plan, registry, work=args.work, lock=lock, ca_bundle=ca,
                            builder=args.builder, cache_from=cache_from, cache_to=cache_to)
    for r in results:
        print(f"{r.ref}@{r.digest}" if r.digest else r.ref)
    return 0


def cmd_pull(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from imagegen import execute, prebuilt

    config = _config(args)
    cat = _catalogue(args, config)
    registry = _registry(args, config)
    plan = _buildable(args, config, cat)
    for flag, value in (("--max-jobs", args.max_jobs), ("--nvcc-threads", args.nvcc_threads)):
        if value is not None and not 1 <= value <= 1024:
            raise UsageError(f"{flag} must be between 1 and 1024")
    results = prebuilt.pull(plan, registry, out=options.resolve(args, config).out, work=args.work, lock=_lock(args),
                            gpus=args.gpus, fallback=not args.no_fallback, max_jobs=args.max_jobs,
                            nvcc_threads=args.nvcc_threads, ca_bundle=_ca_bundle(args.ca_bundle), force=args.force,
                            audit=not args.no_audit)
    print(execute.results_json(results) if args.json else execute.summary(results))
    failed = [r for r in results if r.status == "failed"]
    if failed:
        raise BuildError(f"{len(failed)} of {len(results)} cells failed: "
                         + ", ".join(f"{r.cell.name} (log: {r.log})" for r in failed))
    return 0


def cmd_lock(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from imagegen.registry import lock_bases

    config = _config(args)
    cat = _catalogue(args, config)
    plan = expand(_matrix(args, config, cat))
    if not plan.buildable:
        raise NothingToDoError("no cell of this matrix can build (imagegen plan explains each)")
    from imagegen.outputs import resolve_target

    lock = _lock(args)
    resolve_target(lock.path, "lock file")  # a device or folder: refused before any pull
    lock = lock_bases(plan, lock, say=lambda m: print(m, file=sys.stderr))
    lock.save()
    print(f"wrote {lock.path}: {len(lock.base_images)} base image(s), {len(lock.builder_images)} builder image(s)")
    return 0


COMMANDS = {"render": cmd_render, "push": cmd_push, "pull": cmd_pull, "lock": cmd_lock, "plan": cmd_plan, "bake": cmd_bake, "build": cmd_build, "verify": cmd_verify, "check": cmd_check,
            "doctor": cmd_doctor, "ci": ci.run,
            "recipes": cmd_recipes,
            "archs": cmd_archs}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        for a in argv:  # argparse drops a value of '--' (`--torch=--` becomes an empty list): refuse it
            if a.startswith("-") and a.endswith("=--"):
                raise UsageError(f"{a.split('=', 1)[0]}: '--' is not a value")
        args = build_parser().parse_args(argv)
        return COMMANDS[args.command](args, argv)
    except ImagegenError as exc:
        print(f"imagegen: error: {error_line(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("imagegen: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # a bug: still one line, with a way to get the details
        if os.environ.get("IMAGEGEN_DEBUG"):
            raise
        print("imagegen: internal error: " + error_line(f"{exc.__class__.__name__}: {exc}", MAX_ERROR - 100)
              + " (re-run with IMAGEGEN_DEBUG=1 for the traceback, and please report it)", file=sys.stderr)
        return 70


MAX_ERROR = 380  # characters of a message after "imagegen: error: " (the whole line stays under 400)


def error_line(message: str, limit: int = MAX_ERROR) -> str:
    """``message`` as one terminal-safe line: whitespace runs become one space, every other control
    or format character (ESC, NUL, U+202E right-to-left override, ...) is shown escaped, and the
    whole is cut to ``limit`` characters (a 100 kB argument is not echoed back)."""
    out = []
    for c in " ".join(message.split()):
        if c.isprintable() or c == " ":
            out.append(c)
        elif unicodedata.category(c) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"):
            out.append(c.encode("unicode_escape").decode("ascii"))
        else:
            out.append(c)
        if len(out) > limit:
            break
    text = "".join(out)
    return text if len(text) <= limit else text[:limit - 3].rstrip() + "..."
