"""The options several commands share, as data (see cli_spec): the config and recipe sources, a cell's
axes (repeatable in the matrix commands, once in render), the wheelhouse and job flags of the commands
that compile, the GPU check inside a build, the layer cache. Options of one command only are in
cli_commands, beside it."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from imagegen.commands.cli_spec import Group, Later, Opt
from imagegen.model import base_images
from imagegen.model.recipes import FETCH_KINDS
from imagegen.plan.matrix import default_policy, defaults
from imagegen.safety import describe, redact

# A URL (scheme://...) where a local path is asked for: refused, not taken as the folders "https:/host/..."
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]{0,30}://")


def path_text(text: str) -> str:
    """A local path (or a program name, or '-' for stdout), as given; a URL is refused: no option reads
    or writes one, and taken as a path it would make the folders ``https:/host/...`` here."""
    if _URL.match(text):
        raise argparse.ArgumentTypeError(f"takes a local path, not a URL ({describe(redact(text), 60)})")
    return text


def local_path(text: str) -> Path:
    """path_text as a Path."""
    return Path(path_text(text))


CONFIG = Opt(("--config",), type=local_path, help="imagegen.toml or pyproject.toml to read (default: searched from the"
             " current directory)")
RECIPE_DIR = Opt(("--recipe-dir",), type=local_path, action="append", default=[], help="extra directory of recipe YAML"
                 " files (repeatable)")
COMMON = Group((
    Opt(("--lock",), type=local_path,
        help="lock file pinning images to digests (default: imagegen.lock here, if present)"),
    CONFIG,
    RECIPE_DIR,
))

JSON = Opt(("--json",), action="store_true", help="machine-readable output")
JSON_RESULTS = JSON.but(help="print the results as JSON")

# The positionals of the commands that take wheels, or a wheelhouse, after a build.
WHEELS = Opt(("wheels",), nargs="+", type=local_path, help="wheel files")
WHEELHOUSE = Opt(("out",), type=local_path, help="the wheelhouse (imagegen build's --out)")

# --------------------------------------------------------------------------------------------
# A cell's axes

# What render says when one of its cell flags is given twice (the matrix commands take each of them repeated).
_ONE_CELL = ("; render makes one cell (a Dockerfile; --shell takes a list in one value, e.g. --torch '2.8 2.9');"
             " plan, bake and build take several")
_CELLS_EPILOG = Later(lambda: f"Cells: {default_policy()}; a plan's notes say what was passed over and why.")


def _flavor_help() -> str:
    d = defaults()
    return (f"builder base-image family (default: {d['flavor']}, else"
            f" {' or '.join(d.get('flavor_fallbacks') or ['none'])} where {d['flavor']} has no image for the cell's"
            " CUDA; imagegen/resources/compat/base_images.yaml lists them)")


CELL_OPTIONS = (
    Opt(("--arch",), many=" (repeat for several arch sets)",
        help="GPU archs: 12.0+PTX, 8.0;9.0, sm_90a, Hopper, H100 ...{many}"),
    Opt(("--torch",), many=" (repeatable)",
        help="torch series or release: 2.8 or 2.8.0{many}; default: the newest torch the recipe can build"),
    Opt(("--cuda",), many=" (repeatable)", help="CUDA variant: 12.8 or cu128{many}; default: the torch's PyPI CUDA"),
    Opt(("--python",), many=" (repeatable)",
        help=Later(lambda: "CPython version: 3.12{many}" + f"; default: {defaults()['python']} where the torch has it")),
    Opt(("--env",), action="append", default=[], metavar="NAME=VALUE", help="a package's own build variable, e.g."
        " FLASH_ATTENTION_DISABLE_BACKWARD=TRUE (repeatable; the ones imagegen sets are refused)"),
    Opt(("--flavor",), choices=Later(base_images.container_flavors), help=Later(_flavor_help)),
    Opt(("--base-image",), metavar="[CUDA=]IMAGE[,FALLBACK]", many=" (repeatable)", help="use this base image"
        " instead of the flavor's catalogue image; CUDA=IMAGE for the cells of one CUDA version (12.8=IMAGE);"
        " IMAGE,FALLBACK tries FALLBACK (same CUDA) when IMAGE cannot be pulled{many}"),
    Opt(("--offline",), action="store_true", help="no build step reaches a network (RUN --network=none, pip without"
        " an index): the source is a tree on this machine, and torch, nvcc and the build requirements are in the"
        " base image; a cell that would download something is refused, naming it"),
    Opt(("--version",), dest="recipe_version", many="; repeatable or a list (--version '2.8.2 2.8.3'): each"
        " version's cells", help="recipe version to build (default: the recipe's default){many}; with --ref/--git:"
        " the version that source is, whose recipe rules apply"),
    Opt(("--ref",), help="build this tag, branch or commit of the recipe's repository (resolved to a commit with"
        " git ls-remote before planning); the recipe's rules for its version apply"),
    Opt(("--git",), metavar="URL[@REF]", help="build a fork: this repository (at REF, default its HEAD) with the"
        " recipe's rules for its version"),
    Opt(("--fetch",), choices=FETCH_KINDS, help="where the source comes from: git (default) or the version's sdist"
        " pinned by sha256 (PyPI, where the git host cannot be reached)"),
    Opt(("--source",), type=local_path, many=" (repeatable)", help="build a local project tree (setup.py /"
        " pyproject.toml) as a recipe{many}; after a recipe name (sage --source TREE): that recipe built from the"
        " tree, one cell, with the recipe's rules for the tree's version"),
    Opt(("--platform",), metavar="PLATFORM", many="; a list builds one cell per platform", help="the host platform"
        " the wheel is for: linux/amd64 (default) or linux/arm64 (GH200, GB200, DGX Spark, Jetson; built in the"
        " image's arm64 variant, under QEMU on an x86_64 builder){many}"),
)
ONE_CELL = Group(CELL_OPTIONS, many=False, once_hint=_ONE_CELL, epilog=_CELLS_EPILOG)
CELLS = Group(CELL_OPTIONS, many=True, epilog=_CELLS_EPILOG)

# The recipes and the matrix axes of a command that plans several cells.
MATRIX = Group((
    Opt(("recipes",), nargs="*", help="recipes (default: the config's matrix, else every recipe)"),
    CELLS,
    Opt(("--layout",), help="wheelhouse folders below the output folder, from {package} {short} {version} {torch}"
        " {cuda} {python} {py} (default: {package}-{version}/torch{torch}/{cuda}; a team's flash-attn matrix:"
        " fa{version}/torch{torch}/{cuda}; '.' or '': flat, every wheel directly in the output folder beside one"
        " manifest.json)"),
))

# --------------------------------------------------------------------------------------------
# Builds

NETRC = Opt(("--netrc",), type=path_text, metavar="FILE",
    help="a netrc file (e.g. ~/.netrc) for private git hosts and package"
            " indexes, handed to the builds' fetch, toolchain and deps steps as the BuildKit secret netrc (mounted"
            " for one step, never in a layer; the bake file holds its path only). No default: only given")
REGISTRY = Opt(("--registry",), help="HOST[:PORT]/NAMESPACE of the builder images (default: config registry)")
OUT_FOLDER = Opt(("--out",), type=local_path, help="output folder (default: config out, else wheelhouse)")

# What a command that compiles (build, pull) takes about the wheelhouse and the jobs.
COMPILE = Group((
    Opt(("--force",), action="store_true", help="rebuild cells whose wheel is up to date; replace a wheel of the"
        " same cell built for other archs (same file name; without --force such a cell is refused, exit 10, before"
        " it builds or when its wheel is placed)"),
    Opt(("--max-jobs",), type=int, help="MAX_JOBS per cell (default: from RAM and cores)"),
    Opt(("--nvcc-threads",), type=int, help="nvcc --threads per job (default: the recipe's)"),
))

# A Dockerfile build that runs the recipe's GPU check inside it (BuildKit CDI, `RUN --device`).
GPU_CHECK = Group((
    Opt(("--gpu-check-device",), metavar="CDI_DEVICE", help="run the recipe's numerical GPU check inside the build,"
        " on this CDI device (e.g. nvidia.com/gpu=all): a wheel that fails it is not exported. Needs Docker 27+ with"
        " CDI on, buildx 0.22+, a CDI spec for the device (`imagegen cdi-spec`) and a Dockerfile frontend with RUN"
        " --device (--dockerfile-frontend)"),
    Opt(("--dockerfile-frontend",), metavar="IMAGE", help="with --gpu-check-device: the Dockerfile frontend image"
        " named by the Dockerfile's syntax line (default: docker/dockerfile:1.19-labs; RUN --device is in the labs"
        " channel only)"),
))

CACHE = Group((
    Opt(("--cache-from",), action="append", default=[], help="layer cache to import, as for buildx:"
        " type=registry,ref=HOST/NS/cache:TAG (repeatable)"),
    Opt(("--cache-to",), action="append", default=[], help="layer cache to export: type=inline on the docker driver;"
        " type=registry,ref=...,mode=max on docker-container / remote / kubernetes builders"),
))


def budget_seconds(text: str) -> int:
    """A duration: 330m, 5h30m, 90s, or plain seconds; whole seconds > 0."""
    m = re.fullmatch(r"(?:(\d{1,4})h)?(?:(\d{1,6})m)?(?:(\d{1,8})s?)?", text.strip())
    seconds = int(m.group(1) or 0) * 3600 + int(m.group(2) or 0) * 60 + int(m.group(3) or 0) if m else 0
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is no duration: say e.g. 330m, 5h30m or 19800 (seconds)")
    return seconds
