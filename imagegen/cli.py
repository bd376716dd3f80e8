"""Command line: argparse and dispatch to imagegen.commands (one module per group of commands).

Every known failure is an :class:`~imagegen.errors.ImagegenError` and ends as one line on stderr
with its exit code; an unexpected exception is reported the same way (with a hint to re-run with
IMAGEGEN_DEBUG=1 for the traceback) so a user never gets a wall of Python.
"""

from __future__ import annotations

import argparse
import os
import sys
import unicodedata
from pathlib import Path
from typing import Sequence

from imagegen import __version__
from imagegen.commands import building, checking, ci, images, planning, rendering
from imagegen.errors import ImagegenError, UsageError
from imagegen.model import base_images
from imagegen.model.recipes import FETCH_KINDS
from imagegen.plan.matrix import default_policy, defaults


class _Once(argparse._StoreAction):
    """A single-valued option (argparse's plain ``store``): given twice with different values it is a
    usage error, where argparse would keep the last one and drop the first without a word."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = parser.given_once.setdefault(id(namespace), {})
        if option_string is not None and self.dest in given and given[self.dest] != values:
            first = given[self.dest]
            parser.error(f"{option_string} given twice ({first} and {values}): it takes one value"
                         + getattr(parser, "once_hints", {}).get(self.dest, ""))
        given[self.dest] = values
        super().__call__(parser, namespace, values, option_string)


class _Parser(argparse.ArgumentParser):
    """argparse, but usage errors are one line (plus exit code 2) like every other error, and an option
    that takes one value refuses a second one (_Once) instead of keeping the last."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # Every option of this parser and its groups without an explicit action is a _Once.
        self.register("action", None, _Once)
        self.register("action", "store", _Once)
        self.given_once: dict[int, dict[str, object]] = {}
        self.once_hints: dict[str, str] = {}

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        self.given_once = {}
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lock", type=Path, help="lock file pinning images to digests (default: imagegen.lock here, if present)")
    p.add_argument("--config", type=Path, help="imagegen.toml or pyproject.toml to read (default: searched from the current directory)")
    p.add_argument("--recipe-dir", type=Path, action="append", default=[], help="extra directory of recipe YAML files (repeatable)")


# What render says when one of its cell flags is given twice (the matrix commands take each of them repeated).
_ONE_CELL = ("; render makes one cell (a Dockerfile; --shell takes a list in one value, e.g. --torch '2.8 2.9');"
             " plan, bake and build take several")


def _add_cell_args(p: argparse.ArgumentParser, *, many: bool) -> None:
    kw = {"action": "append"} if many else {}
    p.epilog = f"Cells: {default_policy()}; a plan's notes say what was passed over and why."
    p.add_argument("--arch", **kw, help="GPU archs: 12.0+PTX, 8.0;9.0, sm_90a, Hopper, H100 ... " + ("(repeat for several arch sets)" if many else ""))
    p.add_argument("--torch", **kw, help="torch series or release: 2.8 or 2.8.0" + (" (repeatable)" if many else "")
                   + "; default: the newest torch the recipe can build")
    p.add_argument("--cuda", **kw, help="CUDA variant: 12.8 or cu128" + (" (repeatable)" if many else "")
                   + "; default: the torch's PyPI CUDA")
    p.add_argument("--python", **kw, help="CPython version: 3.12" + (" (repeatable)" if many else "")
                   + f"; default: {defaults()['python']} where the torch has it")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="a package's own build"
                   " variable, e.g. FLASH_ATTENTION_DISABLE_BACKWARD=TRUE (repeatable; the ones imagegen sets are refused)")
    p.add_argument("--flavor", choices=base_images.container_flavors(), help="builder base-image family (default:"
                   f" {defaults()['flavor']}, else {' or '.join(defaults().get('flavor_fallbacks') or ['none'])} where"
                   f" {defaults()['flavor']} has no image for the cell's CUDA;"
                   " imagegen/resources/compat/base_images.yaml lists them)")
    p.add_argument("--base-image", **kw, metavar="[CUDA=]IMAGE[,FALLBACK]", help="use this base image instead of the"
                   " flavor's catalogue image; CUDA=IMAGE for the cells of one CUDA version (12.8=IMAGE); IMAGE,FALLBACK"
                   " tries FALLBACK (same CUDA) when IMAGE cannot be pulled"
                   + (" (repeatable)" if many else ""))
    p.add_argument("--offline", action="store_true", help="no build step reaches a network (RUN --network=none, pip"
                   " without an index): the source is a tree on this machine, and torch, nvcc and the build requirements"
                   " are in the base image; a cell that would download something is refused, naming it")
    p.add_argument("--version", dest="recipe_version", **kw, help="recipe version to build (default: the recipe's"
                   " default)" + ("; repeatable or a list (--version '2.8.2 2.8.3'): each version's cells" if many else "")
                   + "; with --ref/--git: the version that source is, whose recipe rules apply")
    p.add_argument("--ref", help="build this tag, branch or commit of the recipe's repository (resolved to a commit"
                   " with git ls-remote before planning); the recipe's rules for its version apply")
    p.add_argument("--git", metavar="URL[@REF]", help="build a fork: this repository (at REF, default its HEAD)"
                   " with the recipe's rules for its version")
    p.add_argument("--fetch", choices=FETCH_KINDS, help="where the source comes from: git (default) or the version's"
                   " sdist pinned by sha256 (PyPI, where the git host cannot be reached)")
    p.add_argument("--source", type=Path, **kw, help="build a local project tree (setup.py / pyproject.toml) as a recipe"
                   + (" (repeatable)" if many else ""))
    p.add_argument("--platform", **kw, metavar="PLATFORM", help="the host platform the wheel is for: linux/amd64"
                   " (default) or linux/arm64 (GH200, GB200, DGX Spark, Jetson; built in the image's arm64 variant, under"
                   " QEMU on an x86_64 builder)" + ("; a list builds one cell per platform" if many else ""))
    if not many and isinstance(p, _Parser):
        p.once_hints.update({dest: _ONE_CELL for dest in ("arch", "torch", "cuda", "python", "base_image",
                                                            "recipe_version", "source", "platform")})


def _add_matrix_args(p: argparse.ArgumentParser) -> None:
    """The recipes and the matrix axes of a command that plans several cells."""
    p.add_argument("recipes", nargs="*", help="recipes (default: the config's matrix, else every recipe)")
    _add_cell_args(p, many=True)
    p.add_argument("--layout", help="wheelhouse folders below the output folder, from {package} {short} {version}"
                   " {torch} {cuda} {python} {py} (default: {package}-{version}/torch{torch}/{cuda}; seed 001's:"
                   " fa{version}/torch{torch}/{cuda})")


def _add_netrc(p: argparse.ArgumentParser) -> None:
    p.add_argument("--netrc", metavar="FILE", help="a netrc file (e.g. ~/.netrc) for private git hosts and package"
                   " indexes, handed to the builds' fetch, toolchain and deps steps as the BuildKit secret netrc (mounted"
                   " for one step, never in a layer; the bake file holds its path only). No default: only given")


def _add_compile_args(p: argparse.ArgumentParser) -> None:
    """What a command that compiles (build, pull) takes about the wheelhouse and the jobs."""
    p.add_argument("--force", action="store_true", help="rebuild cells whose wheel is up to date; replace a wheel of"
                   " the same cell built for other archs (same file name; without --force such a cell is refused,"
                   " exit 10, before it builds or when its wheel is placed)")
    p.add_argument("--max-jobs", type=int, help="MAX_JOBS per cell (default: from RAM and cores)")
    p.add_argument("--nvcc-threads", type=int, help="nvcc --threads per job (default: the recipe's)")


def budget_seconds(text: str) -> int:
    """A duration: 330m, 5h30m, 90s, or plain seconds; whole seconds > 0."""
    import re

    m = re.fullmatch(r"(?:(\d{1,4})h)?(?:(\d{1,6})m)?(?:(\d{1,8})s?)?", text.strip())
    seconds = int(m.group(1) or 0) * 3600 + int(m.group(2) or 0) * 60 + int(m.group(3) or 0) if m else 0
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is no duration: say e.g. 330m, 5h30m or 19800 (seconds)")
    return seconds


def _add_gpu_check_args(p: argparse.ArgumentParser) -> None:
    """A Dockerfile build that runs the recipe's GPU check inside it (BuildKit CDI, `RUN --device`)."""
    p.add_argument("--gpu-check-device", metavar="CDI_DEVICE", help="run the recipe's numerical GPU check inside"
                   " the build, on this CDI device (e.g. nvidia.com/gpu=all): a wheel that fails it is not exported."
                   " Needs Docker 27+ with CDI on, buildx 0.22+, a CDI spec for the device (`imagegen cdi-spec`) and a"
                   " Dockerfile frontend with RUN --device (--dockerfile-frontend)")
    p.add_argument("--dockerfile-frontend", metavar="IMAGE", help="with --gpu-check-device: the Dockerfile frontend"
                   " image named by the Dockerfile's syntax line (default: docker/dockerfile:1.19-labs; RUN --device is"
                   " in the labs channel only)")


def _add_cache_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cache-from", action="append", default=[], help="layer cache to import, as for buildx:"
                   " type=registry,ref=HOST/NS/cache:TAG (repeatable)")
    p.add_argument("--cache-to", action="append", default=[], help="layer cache to export: type=inline on the docker"
                   " driver; type=registry,ref=...,mode=max on docker-container / remote / kubernetes builders")


def _add_json(p: argparse.ArgumentParser, help: str = "machine-readable output") -> None:
    p.add_argument("--json", action="store_true", help=help)


def _add_registry_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--registry", help="HOST[:PORT]/NAMESPACE of the builder images (default: config registry)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="imagegen", description="Build CUDA-extension wheels for exact torch x CUDA x Python x GPU-arch cells.")
    parser.add_argument("--version", action="version", version=f"imagegen {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    p = sub.add_parser("render", help="print a builder Dockerfile for one cell", description=(
        "Render the builder Dockerfile for one recipe and cell: the one cell plan, bake and build make of the"
        " same flags."))
    p.add_argument("recipe", nargs="?", help="recipe name or alias (sage, flash-attn, ...) or a path to a local project")
    _add_cell_args(p, many=False)
    p.add_argument("-o", "--output", help="write to this file instead of stdout")
    p.add_argument("--shell", choices=("cmd", "powershell"), help="print a native Windows build script instead of a"
                   " Dockerfile: one or many cells (--torch 2.8,2.9 --cuda 12.8 --python 3.12: lists), each with its CUDA"
                   " toolkit (CUDA_PATH_V12_8), a venv (py -3.12) with its torch, the recipe's patches, vcvarsall, pip wheel,"
                   " the local version, a cuobjdump arch check and an import test; wheels into the wheelhouse layout")
    p.add_argument("--src-dir", help="with --shell: where the source is (cloned there if missing); a checkout of"
                   " your own (a fork, local fixes) that is here already builds as it is, as a local tree with the"
                   " recipe's rules for its version, as --native --src-dir does on Linux")
    p.add_argument("--python-exe", help="with --shell: build one cell with this Python and the torch it has, e.g."
                   " ..\\.venv\\Scripts\\python.exe (default: a venv per cell made with the py launcher); its torch,"
                   " CUDA and Python are the cell's where --torch, --cuda, --python are not given (read by running it"
                   " here, from where the script will run); the script never installs a torch into it unless"
                   " --install-torch")
    p.add_argument("--install-torch", action="store_true", help="with --shell --python-exe: the script installs the"
                   " cell's torch into that interpreter (default: it uses and checks the torch already there)")
    p.add_argument("--out", help="with --shell: the wheelhouse the script writes to (default: config out, else"
                   " wheelhouse; the script's -Wheelhouse / first argument overrides it)")
    p.add_argument("--audit", action="store_true", help="with --shell: says why the gencode audit cannot run for a"
                   " Windows cell (the script checks the built archs with cuobjdump)")
    p.add_argument("--vcvars", help="with --shell: path of vcvarsall.bat (default: VS 2022 Community)")
    p.add_argument("--max-jobs", type=int, default=None, help="with --shell: MAX_JOBS (default 1: no OOM)")
    p.add_argument("--nvcc-threads", type=int, default=None, help="with --shell: NVCC_THREADS (default 1)")
    _add_gpu_check_args(p)
    _add_common(p)

    p = sub.add_parser("plan", help="expand the matrix and explain every cell", description=(
        "Expand recipes x the torch, CUDA, Python and arch values given into cells and say, for each, whether it"
        " can build and why not."))
    _add_matrix_args(p)
    _add_json(p)
    p.add_argument("--only", choices=("buildable", "rejected", "skipped"), help="show only cells with this status")
    p.add_argument("--audit", action="store_true", help="run each buildable cell's own build with stand-in compilers"
                   " (nothing compiles) and show what it would really compile: SASS/PTX per extension and"
                   " the nvcc flags; refuse what would fail, warn about missing or unrequested archs. Runs in each"
                   " cell's builder image on the Docker engine (its base layers are the build's: minutes the first"
                   " time, seconds after), or with --native on this host")
    p.add_argument("--resolve", action="store_true", help="resolve each buildable cell's pip installs (torch from its"
                   " index, the PyPI CUDA toolkit, the build requirements) for the cell's platform and Python with uv,"
                   " metadata only, building nothing: refuse a cell whose installs do not resolve or whose torch is a"
                   " CPU-only build there (torch < 2.11 on linux/arm64 from PyPI). Needs uv (pip install uv)")
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
    _add_matrix_args(p)
    p.add_argument("-f", "--file", default="docker-bake.hcl", help="bake file to write: .hcl or .json (default: docker-bake.hcl)")
    p.add_argument("--out", help="wheel output folder (default: config out, else wheelhouse)")
    p.add_argument("--dockerfiles", default="dockerfiles", help="folder for the rendered Dockerfiles (default: dockerfiles)")
    p.add_argument("--print", dest="show", action="store_true", help="check the file with `docker buildx bake --print` and show what buildx will run")
    p.add_argument("--repo", action="store_true", help="regenerate this repository's committed dockerfiles/, bake/ and docker-bake.hcl")
    _add_gpu_check_args(p)
    _add_common(p)

    p = sub.add_parser("build", help="build wheels for a matrix (bake), collect and verify them", description=(
        "Plan, render and bake every buildable cell, in batches sized by RAM and cores; keep going past"
        " failures; verify each wheel's SASS/PTX and install+import it; publish wheels atomically into"
        " OUT/<pkg>-<ver>/torch<X.Y>/cu<XYZ>/ with manifest.json. Unchanged cells are skipped."))
    _add_matrix_args(p)
    p.add_argument("--out", type=Path, help="output folder (default: config out, else wheelhouse)")
    p.add_argument("--work", type=Path, default=Path(".imagegen"), help="staging, logs and bake files (default: .imagegen)")
    _add_compile_args(p)
    p.add_argument("--budget", type=budget_seconds, metavar="DURATION", help="stop a cell's compile after this long"
                   " (e.g. 330m, under a CI runner's 6 hours) and keep its build tree in the builder's cache (keyed by"
                   " the cell's inputs hash): the same build again compiles only what is left (exit 5 with the"
                   " cell's row saying so)")
    p.add_argument("--compile-cache", metavar="URL", default=os.environ.get("IMAGEGEN_COMPILE_CACHE") or None,
                   help="a compile cache shared by every builder (ccache remote storage: redis://[[USER:]PASSWORD@]HOST:PORT"
                   " or http://HOST:PORT/PATH; default: $IMAGEGEN_COMPILE_CACHE, the place for a password): every"
                   " compile reads and fills it, so a cell built on another machine compiles only what changed."
                   " It reaches the builds as a BuildKit secret, never a layer, log or the bake file (a --native"
                   " build: the in-build script's environment; ccache 4.4+ on PATH)")
    p.add_argument("--builder", action="append", default=[], help="buildx builder to run on (default: the current"
                   " one); repeat to split the matrix across several builders (bake sends all of one run to one node)")
    _add_cache_args(p)
    _add_netrc(p)
    p.add_argument("--ca-bundle", help="CA bundle for PyPI/git inside builds, passed as a BuildKit secret"
                   " (default: PIP_CERT / REQUESTS_CA_BUNDLE / SSL_CERT_FILE, else the system bundle)")
    _add_json(p, "print the results as JSON")
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
    p.add_argument("--repair", action="store_true", help="give each new wheel a manylinux tag (auditwheel, torch's"
                   " libraries excluded; imagegen repair), verified and imported again")
    p.add_argument("--index", action="store_true", help="then bring OUT's pip index up to date (imagegen index):"
                   " pip install --index-url OUT/simple/ or --find-links OUT/index.html")
    _add_gpu_check_args(p)
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
    _add_json(p)

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
    _add_json(p, "print the result as JSON")
    _add_common(p)

    p = sub.add_parser("doctor", help="check this machine: torch, nvcc, GPUs, Docker/buildx, disk, RAM", description=(
        "Check what this machine can build and say how to fix each problem: Python, torch and its CUDA, nvcc and"
        " CUDA_HOME (nvcc's major must equal torch's CUDA major), GPUs and their archs, the Docker engine and buildx"
        " (a real bake matrix with local export is tried), disk, RAM/cores and the job settings builds would use."))
    p.add_argument("--python-exe", help="the interpreter whose torch to check (default: this one)")
    p.add_argument("--no-engine", action="store_true", help="skip the Docker checks")
    _add_json(p)

    p = sub.add_parser("cdi-spec", help="write a CDI spec for this host's GPUs (builds and containers without the toolkit)",
                       description=(
        "Write a Container Device Interface spec declaring nvidia.com/gpu=all from this host's NVIDIA device nodes"
        " and the running driver's libraries (found as imagegen doctor finds them), for hosts without the NVIDIA"
        " Container Toolkit (where it exists, `nvidia-ctk cdi generate` writes one). Docker 25+ with CDI on reads it"
        " for `docker run --device nvidia.com/gpu=all`, and BuildKit for `RUN --device` (imagegen build"
        " --gpu-check-device nvidia.com/gpu=all); it carries the annotation that lets builds use it without the"
        " `device` entitlement. Exit 8 when this host has no NVIDIA devices and driver."))
    p.add_argument("-o", "--output", help="write to this file (e.g. /etc/cdi/imagegen-nvidia.json) instead of stdout")

    p = sub.add_parser("refresh", help="add new torch series and CUDA toolkits from PyPI to your compatibility tables",
                       description=(
        "Read PyPI (torch's wheels and their metadata, cuda-toolkit) and add what imagegen's tables lack: new torch"
        " series (newest release, Python range, the CUDA variant of its PyPI wheel) and CUDA toolkits; update the"
        " PyPI-derived facts of known series. Written to a user-level overlay ($IMAGEGEN_COMPAT_DIR, else"
        " ~/.config/imagegen/compat), never into the installed package. Refuses an answer that looks broken"
        " (a release going backwards, lost series or Pythons, an unknown CUDA). The cuXYZ builds of"
        " download.pytorch.org cannot be read from PyPI: a new series lists only its PyPI variant."))
    p.add_argument("--index-url", help="a PyPI-compatible simple index with the JSON API (default: https://pypi.org/simple/)")
    p.add_argument("--dry-run", action="store_true", help="show what would change; write nothing")

    p = sub.add_parser("recipes", help="list the recipe catalogue", description="List every recipe with its versions, arch knob and supported archs.")
    _add_json(p)
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
    _add_matrix_args(p)
    _add_registry_args(p)
    p.add_argument("--work", type=Path, default=Path(".imagegen"), help="bake files and logs (default: .imagegen)")
    p.add_argument("--builder", help="buildx builder to run on (default: the current one)")
    _add_cache_args(p)
    p.add_argument("--ca-bundle", help="CA bundle for PyPI/git inside builds (a BuildKit secret, never in a layer)")
    _add_netrc(p)
    _add_common(p)

    p = sub.add_parser("pull", help="pull prebuilt builder images and run them to produce wheels", description=(
        "For each cell: pull its builder image (pinned by the lock file when it has it), run it with the GPUs"
        " visible when this host has any, verify the wheel and publish it into OUT like build. A missing image"
        " is built locally from the same Dockerfile; wrong credentials or an unreachable registry stop."))
    _add_matrix_args(p)
    _add_registry_args(p)
    p.add_argument("--out", type=Path, help="output folder (default: config out, else wheelhouse)")
    p.add_argument("--work", type=Path, default=Path(".imagegen"), help="staging and logs (default: .imagegen)")
    p.add_argument("--gpus", choices=("auto", "all", "toolkit", "cdi", "devices", "none"), default="auto",
                   help="give the container the GPUs: toolkit (--gpus all, the NVIDIA Container Toolkit), cdi (--device"
                   " nvidia.com/gpu=all, a CDI spec), devices (the /dev/nvidia* nodes and the driver's libraries, passed"
                   " by hand: no toolkit needed); auto: the first of them this host supports, when nvidia-smi works"
                   " here (imagegen doctor says which); all: --gpus all as it is")
    p.add_argument("--no-fallback", action="store_true", help="fail when the image is missing instead of building it locally")
    p.add_argument("--no-audit", action="store_true", help="skip the gencode audit the image runs before compiling"
                   " (the package's own build with stand-in compilers, which refuses a cell whose build would fail or miss an arch)")
    _add_compile_args(p)
    p.add_argument("--ca-bundle", help="CA bundle for a local fallback build")
    _add_netrc(p)
    _add_json(p, "print the results as JSON")
    _add_common(p)

    p = sub.add_parser("lock", help="pin every base image of a matrix to its registry digest", description=(
        "Resolve the base image of every buildable cell to the digest its registry serves now and write the lock"
        " file; render, bake, build and pull then use FROM image@sha256:..., so a moved tag cannot change a build."))
    _add_matrix_args(p)
    _add_common(p)

    p = sub.add_parser("collect", help="verify and record the wheels a builder image exported (docker buildx bake,"
                       " docker run -v OUT:/out)", description=(
        "Take into the wheelhouse the wheels that builder images made outside `imagegen build`: a plain"
        " `docker buildx bake` of the generated bake file, a `docker run -v OUT:/out` of a builder image, the"
        " build jobs of `imagegen ci github`. Each such wheel has a build record beside it (<wheel>.imagegen.json);"
        " a wheel whose sha256 and passed smoke test match its record and whose .so files carry the SASS/PTX its"
        " requested archs need (as its recipe compiles them) is recorded in its folder's manifest.json, which"
        " `imagegen index` and `imagegen publish` read. Exit 6 when a wheel fails; it is left out, the others"
        " are recorded."))
    p.add_argument("out", type=Path, help="the folder the builds exported to (searched for build records)")
    p.add_argument("--strict", action="store_true", help="fail a wheel whose extensions carry archs not requested")
    p.add_argument("--recipe-dir", type=Path, action="append", default=[], help="extra directory of recipe YAML"
                   " files (repeatable), for wheels of your own recipes")
    p.add_argument("--config", type=Path, help="imagegen.toml or pyproject.toml to read (default: searched from the"
                   " current directory)")
    _add_json(p)

    p = sub.add_parser("index", help="write a pip index (PEP 503 simple + find-links page) for a wheelhouse", description=(
        "Write a static package index for the verified wheels of a wheelhouse (those its manifest.json files list):"
        " OUT/simple/<project>/ pages with #sha256= fragments and data-requires-python (PEP 503; PEP 691 JSON beside"
        " them) and OUT/index.html for pip --find-links. Servable by any web server, S3 or GitHub Pages."
        " Rewritten atomically: a reader never sees a half-written index."))
    p.add_argument("out", type=Path, help="the wheelhouse (imagegen build's --out)")
    p.add_argument("--base-url", help="absolute URL the wheelhouse is served from (default: links relative to the"
                   " index, which works wherever the folder is served)")
    p.add_argument("--variants", action=argparse.BooleanOptionalAction, default=None, help=(
        "also list each wheel as a wheel variant (PEP 817/825: a copy with its CUDA version and GPU archs as variant"
        " properties, and each version's variants.json) for a variant-aware installer; plain pip ignores them. Costs a"
        " copy of every wheel; later runs (build --index too) keep them until --no-variants removes them"
        " (default: as the index has them)"))
    p.add_argument("--merge", metavar="URL", help=(
        "the URL this wheelhouse's index is published at (an earlier run's): list the wheels served there beside"
        " these, flat and per CUDA, and write each cell folder's manifest.served.json (its published cells and this"
        " run's), for imagegen publish --to s3://BUCKET/PREFIX,layout=wheelhouse to upload; nothing published yet"
        " (404) merges nothing; a wheel name served with another sha256 is refused"))
    _add_json(p)

    p = sub.add_parser("repair", help="give wheels a manylinux tag with auditwheel (torch's libraries excluded)",
                       description=(
        "Run auditwheel repair on each wheel with the libraries torch provides excluded (libtorch, libc10,"
        " libcudart, libcuda, ...), so the wheel gets the manylinux tag its glibc needs and no copy of torch;"
        " print the glibc ceiling; verify and import the repaired wheel again."))
    p.add_argument("wheels", nargs="+", type=Path, help="wheel files")
    p.add_argument("--out", type=Path, help="where the repaired wheels go (default: beside each wheel, which replaces it"
                   " in its wheelhouse folder and manifest)")
    p.add_argument("--plat", help="manylinux tag to ask for (default: the lowest the wheel's symbols allow)")
    p.add_argument("--python-exe", help="import the repaired wheel with this interpreter (it must have the torch the"
                   " wheel was built for; default: skip the import test when this one has no torch)")
    _add_json(p)

    p = sub.add_parser("publish", help="upload a wheelhouse's verified wheels (PyPI-compatible, Hugging Face Hub,"
                       " GitHub release, S3)", description=(
        "Upload the verified wheels of a wheelhouse: a wheel already there with the same sha256 is skipped, one"
        " that differs under the same name is refused. Credentials come from the environment (TWINE_USERNAME /"
        " TWINE_PASSWORD, HF_TOKEN, GITHUB_TOKEN, AWS_*), ~/.netrc or the token `huggingface-cli login` stored,"
        " never from the command line. Each exchange with a destination has a total deadline:"
        " $IMAGEGEN_PUBLISH_DEADLINE seconds (default 300), plus one per MiB uploaded."))
    p.add_argument("out", type=Path, help="the wheelhouse (imagegen build's --out)")
    p.add_argument("--to", required=True, action="append", metavar="DEST", help="pypi:URL (a PyPI-compatible upload"
                   " endpoint, e.g. pypi:https://upload.pypi.org/legacy/), hf:OWNER/REPO[@REVISION][:PATH],"
                   " github:OWNER/REPO@TAG, s3://BUCKET[/PREFIX] (repeatable)")
    p.add_argument("--dry-run", action="store_true", help="say what would be uploaded or skipped; upload nothing")
    _add_json(p)

    ci.add_parser(sub)
    return parser


def _lazy(module: str, name: str):
    """A command from a module imported only when it runs (its client libraries are heavy)."""
    def run(args: argparse.Namespace, argv: Sequence[str]) -> int:
        import importlib
        return getattr(importlib.import_module(f"imagegen.commands.{module}"), name)(args, argv)
    return run


# --------------------------------------------------------------------------------------------


# Each command is a function (args, argv) -> exit code, in imagegen.commands by group.
COMMANDS = {"plan": planning.cmd_plan, "recipes": planning.cmd_recipes, "archs": planning.cmd_archs,
            "render": rendering.cmd_render, "bake": rendering.cmd_bake, "ci": ci.run,
            "build": building.cmd_build,
            "verify": checking.cmd_verify, "check": checking.cmd_check, "doctor": checking.cmd_doctor,
            "cdi-spec": checking.cmd_cdi_spec,
            "push": images.cmd_push, "pull": images.cmd_pull, "lock": images.cmd_lock,
            "refresh": planning.cmd_refresh,
            "collect": _lazy("collecting", "cmd_collect"),
            "index": _lazy("indexing", "cmd_index"), "repair": _lazy("repairing", "cmd_repair"),
            "publish": _lazy("publishing", "cmd_publish")}


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
        if isinstance(exc, FileNotFoundError) and "No usable temporary directory" in str(exc):
            # tempfile found no folder it can write (TMPDIR, /tmp, /var/tmp, the current folder): the
            # machine's, not a bug
            print("imagegen: error: no folder for temporary files can be written here (TMPDIR, /tmp, /var/tmp, the"
                  " current folder): set TMPDIR to a folder of your own", file=sys.stderr)
            return UsageError.exit_code
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
    from imagegen.safety import redact

    out = []
    for c in " ".join(redact(message).split()):
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
