"""Every imagegen command as data (see cli_spec), in the order `imagegen --help` lists them: its help
line, its description, its arguments in --help order (its own, and the groups of cli_options it
shares) and the function it runs."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from imagegen import __version__
from imagegen.commands.cli_ci import CI
from imagegen.commands.cli_options import (CACHE, COMMON, COMPILE, CONFIG, GPU_CHECK, JSON, JSON_RESULTS, MATRIX,
                                           NETRC, ONE_CELL, OUT_FOLDER, RECIPE_DIR, REGISTRY, WHEELHOUSE, WHEELS,
                                           budget_seconds, local_path, path_text)
from imagegen.commands.cli_spec import Command, Later, Opt, Program

PROGRAM = Program("imagegen", "Build CUDA-extension wheels for exact torch x CUDA x Python x GPU-arch cells.",
                  f"imagegen {__version__}")

# Plan's and build's --native (build on this host) reads these the same way.
NATIVE_PYTHON_EXE = Opt(("--python-exe",), type=path_text, help="with --native: the interpreter whose torch to"
                        " build against (default: this one)")

RENDER = Command("render", "rendering.cmd_render", "print a builder Dockerfile for one cell", (
    "Render the builder Dockerfile for one recipe and cell: the one cell plan, bake and build make of the same"
    " flags."), (
    Opt(("recipe",), nargs="?", help="recipe name or alias (sage, flash-attn, ...) or a path to a local project"),
    ONE_CELL,
    Opt(("-o", "--output"), type=path_text, help="write to this file instead of stdout"),
    Opt(("--shell",), choices=("cmd", "powershell"), help="print a native Windows build script instead of a"
        " Dockerfile: one or many cells (--torch 2.8,2.9 --cuda 12.8 --python 3.12: lists), each with its CUDA"
        " toolkit (CUDA_PATH_V12_8), a venv (py -3.12) with its torch, the recipe's patches, vcvarsall, pip wheel,"
        " the local version, a cuobjdump arch check and an import test; wheels into the wheelhouse layout"),
    Opt(("--src-dir",), type=path_text, help="with --shell: where the source is (cloned there if missing); a checkout"
        " of your own (a fork, local fixes) that is here already builds as it is, as a local tree with the recipe's"
        " rules for its version, as --native --src-dir does on Linux"),
    Opt(("--python-exe",), type=path_text,
        help="with --shell: build one cell with this Python and the torch it has, e.g."
        " ..\\.venv\\Scripts\\python.exe (default: a venv per cell made with the py launcher); its torch, CUDA and"
        " Python are the cell's where --torch, --cuda, --python are not given (read by running it here, from where"
        " the script will run); the script never installs a torch into it unless --install-torch"),
    Opt(("--install-torch",), action="store_true", help="with --shell --python-exe: the script installs the cell's"
        " torch into that interpreter (default: it uses and checks the torch already there)"),
    Opt(("--out",), type=path_text, help="with --shell: the wheelhouse the script writes to (default: config out,"
        " else wheelhouse; the script's -Wheelhouse / first argument overrides it)"),
    Opt(("--audit",), action="store_true", help="with --shell: says why the gencode audit cannot run for a Windows"
        " cell (the script checks the built archs with cuobjdump)"),
    Opt(("--vcvars",), type=path_text, help="with --shell: path of vcvarsall.bat (default: VS 2022 Community)"),
    Opt(("--max-jobs",), type=int, default=None, help="with --shell: MAX_JOBS (default 1: no OOM)"),
    Opt(("--nvcc-threads",), type=int, default=None, help="with --shell: NVCC_THREADS (default 1)"),
    GPU_CHECK,
    COMMON,
))

PLAN = Command("plan", "planning.cmd_plan", "expand the matrix and explain every cell", (
    "Expand recipes x the torch, CUDA, Python and arch values given into cells and say, for each, whether it can"
    " build and why not."), (
    MATRIX,
    JSON,
    Opt(("--only",), choices=("buildable", "unchecked", "rejected", "skipped"), help="show only cells with this"
        " status (buildable includes unchecked: a local tree or fork planned on assumed facts, which --audit checks)"),
    Opt(("--audit",), action="store_true", help="run each buildable cell's own build with stand-in compilers"
        " (nothing compiles) and show what it would really compile: SASS/PTX per extension and the nvcc flags;"
        " refuse what would fail, warn about missing or unrequested archs. Runs in each cell's builder image on the"
        " Docker engine (its base layers are the build's: minutes the first time, seconds after), or with --native"
        " on this host"),
    Opt(("--resolve",), action="store_true", help="resolve each buildable cell's pip installs (torch from its"
        " index, the PyPI CUDA toolkit, the build requirements) for the cell's platform and Python with uv,"
        " metadata only, building nothing: refuse a cell whose installs do not resolve or whose torch is a CPU-only"
        " build there (torch < 2.11 on linux/arm64 from PyPI). Needs uv (pip install uv)"),
    Opt(("--native",), action="store_true", help="plan the one cell `imagegen build --native` would build on this"
        " host (its Python, torch and nvcc), unaudited; with --audit, audit that build here"),
    NATIVE_PYTHON_EXE,
    Opt(("--src-dir",), type=local_path, help="with --native: an existing checkout (default: clone into --work)"),
    Opt(("--work",), type=local_path, help="with --audit: where sources and logs go (default: .imagegen)"),
    COMMON,
))

BAKE = Command("bake", "rendering.cmd_bake", "write docker buildx bake definitions for a matrix", (
    "Render every buildable cell of the matrix into a Dockerfile and write a bake file with one target per cell"
    " (local output per cell, CA secret, IMAGEGEN_-prefixed overrides). Paths are relative to the current"
    " directory, where `docker buildx bake` must run."), (
    MATRIX,
    Opt(("-f", "--file"), type=path_text, default="docker-bake.hcl", help="bake file to write: .hcl or .json"
        " (default: docker-bake.hcl)"),
    Opt(("--out",), type=path_text, help="wheel output folder (default: config out, else wheelhouse)"),
    Opt(("--dockerfiles",), type=path_text, default="dockerfiles",
        help="folder for the rendered Dockerfiles (default: dockerfiles)"),
    Opt(("--print",), dest="show", action="store_true", help="check the file with `docker buildx bake --print` and"
        " show what buildx will run"),
    Opt(("--repo",), action="store_true", help="regenerate this repository's committed dockerfiles/, bake/ and"
        " docker-bake.hcl"),
    GPU_CHECK,
    COMMON,
))

BUILD = Command("build", "building.cmd_build", "build wheels for a matrix (bake), collect and verify them", (
    "Plan, render and bake every buildable cell, in batches sized by RAM and cores; keep going past failures;"
    " verify each wheel's SASS/PTX and install+import it; publish wheels atomically into"
    " OUT/<pkg>-<ver>/torch<X.Y>/cu<XYZ>/ with manifest.json. Unchanged cells are skipped."), (
    MATRIX,
    OUT_FOLDER,
    Opt(("--work",), type=local_path, default=Path(".imagegen"),
        help="staging, logs and bake files (default: .imagegen)"),
    COMPILE,
    Opt(("--budget",), type=budget_seconds, metavar="DURATION", help="stop a cell's compile after this long (e.g."
        " 330m, under a CI runner's 6 hours) and keep its build tree in the builder's cache (keyed by the cell's"
        " inputs hash): the same build again compiles only what is left (exit 5 with the cell's row saying so);"
        " with --native it is kept in --work (under a Colab runtime's limit, with --work on Drive)"),
    # Read when the parser is built, as the environment is then; the place for a cache URL with a password.
    Opt(("--compile-cache",), metavar="URL", default=Later(lambda: os.environ.get("IMAGEGEN_COMPILE_CACHE") or None),
        help="a compile cache shared by every builder (ccache remote storage: redis://[[USER:]PASSWORD@]HOST:PORT or"
        " http://HOST:PORT/PATH; default: $IMAGEGEN_COMPILE_CACHE, the place for a password): every compile reads"
        " and fills it, so a cell built on another machine compiles only what changed. It reaches the builds as a"
        " BuildKit secret, never a layer, log or the bake file (a --native build: the in-build script's"
        " environment; ccache 4.4+ on PATH)"),
    Opt(("--builder",), action="append", default=[], help="buildx builder to run on (default: the current one);"
        " repeat to split the matrix across several builders (bake sends all of one run to one node)"),
    CACHE,
    NETRC,
    Opt(("--ca-bundle",), type=path_text,
        help="CA bundle for PyPI/git inside builds, passed as a BuildKit secret (default: PIP_CERT"
        " / REQUESTS_CA_BUNDLE / SSL_CERT_FILE, else the system bundle)"),
    JSON_RESULTS,
    Opt(("--native",), action="store_true", help="build on this host, without Docker (Colab, bare metal): the"
        " host's Python, torch and nvcc, checked against each other first"),
    Opt(("--flat",), action="store_true", help="with --native: put the wheel directly in --out (e.g. a mounted"
        " Google Drive folder) instead of OUT/<pkg>-<ver>/torch<X.Y>/cu<XYZ>/"),
    Opt(("--src-dir",), type=local_path,
        help="with --native: an existing checkout to build (default: clone into --work)"),
    Opt(("--print-env",), action="store_true", help="with --native: print the variables the build would set (arch"
        " knob, MAX_JOBS, ...) as JSON; build nothing"),
    NATIVE_PYTHON_EXE,
    Opt(("--verbose-build",), action="store_true", help="with --native: run pip wheel -v, printing every compiler"
        " line as it comes (slows down chatty builds; without it pip prints them when the build fails)"),
    Opt(("--no-audit",), action="store_true", help="skip the gencode audit before compiling (the package's own"
        " build run with stand-in compilers, which refuses a cell whose build would fail or miss an arch)"),
    Opt(("--repair",), action="store_true", help="give each new wheel a manylinux tag (auditwheel, torch's"
        " libraries excluded; imagegen repair), verified and imported again"),
    Opt(("--index",), action="store_true", help="then bring OUT's pip index up to date (imagegen index): pip"
        " install --index-url OUT/simple/ or --find-links OUT/index.html"),
    GPU_CHECK,
    COMMON,
))

VERIFY = Command("verify", "checking.cmd_verify", "check that a wheel carries the requested SASS/PTX", (
    "Check a wheel: its file name parses, and every CUDA extension (.so) in it carries SASS for each requested"
    " arch and PTX where +PTX was asked (read from the .nv_fatbin section; cuobjdump is used too when installed)."
    " Each extension's archs are listed once. Archs present but not requested (the build ignored --arch or"
    " compiles a hard-coded list) are a warning, exit 0; with --strict a failure. A missing arch fails (exit 6)."), (
    WHEELS,
    Opt(("--arch",), required=True, help="the archs the wheel must carry, e.g. '8.0;9.0a+PTX'"),
    Opt(("--python-exe",), type=path_text,
        help="also import the wheel's modules with this interpreter (it must have the torch the"
        " wheel was built for); imports that need a GPU driver are reported as skipped"),
    Opt(("--strict",), action="store_true", help="fail (exit 6) when an extension carries archs not requested"),
    Opt(("--gpu",), action="store_true", help="then run the recipe's numerical GPU check (imagegen check) on each"
        " wheel that passed, with --python-exe (default: this Python)"),
    RECIPE_DIR.but(help="with --gpu: extra directory of recipe YAML files (repeatable)"),
    JSON,
))

CHECK = Command("check", "checking.cmd_check", "run the recipe's numerical GPU check against a wheel", (
    "Run the recipe's smoke.gpu_check (the kernel against torch SDPA on the GPU) against a wheel: the recipe is"
    " found by the wheel's distribution name, the wheel is unpacked into a temporary folder (nothing is installed)"
    " and the check runs in a fresh interpreter from an empty folder. Exit 0: it passed; 6: it failed; 8: no torch"
    " or no CUDA GPU visible to that interpreter (nothing checked); 2: bad input (no such wheel, unknown"
    " distribution, a recipe without a gpu_check)."), (
    Opt(("wheel",), type=local_path, help="wheel file"),
    Opt(("--recipe",), help="recipe whose gpu_check to run (default: the one for the wheel's distribution)"),
    Opt(("--python", "--python-exe"), type=path_text, dest="python_exe", metavar="EXE",
        help="interpreter to run the check with (it"
        " must have the torch the wheel was built for; default: this one)"),
    Opt(("--timeout",), type=float, default=600.0, help="seconds the check may take (default: 600)"),
    JSON.but(help="print the result as JSON"),
    COMMON,
))

REUSE = Command("reuse", "reusing.cmd_reuse", "check whether a wheel built for one torch works with another (no build)", (
    "Before rebuilding a wheel for a new torch, check the one built for an earlier torch against it: each"
    " extension's undefined symbols against what that torch's libraries export (each missing one said demangled,"
    " with the library it was expected from), its Requires-Dist and Python tag, then, with --python-exe, an import"
    " of its modules with that torch (unpacked into a temporary folder, under the time limit) and the recipe's GPU"
    " check where a GPU is here (else said skipped, never a pass). Exit 0: reusable; 11: not reusable; 2: bad"
    " input. With --into, a reusable wheel is placed in that wheelhouse's folder for the torch it was checked"
    " against, its manifest entry marked reused_from (the index shows it so)."), (
    Opt(("wheel",), type=local_path, help="the wheel built for an earlier torch"),
    Opt(("--torch",), metavar="X.Y.Z", help="the torch release to check against (default: whichever the given"
        " install has); it must be the one --python-exe or --torch-wheel has"),
    Opt(("--python-exe",), type=path_text, metavar="EXE", help="an environment's interpreter with that torch: its"
        " libraries are read, and the wheel is imported (and GPU-checked) with it"),
    Opt(("--torch-wheel",), type=local_path, metavar="PATH", help="instead of --python-exe: a torch wheel file, or a"
        " folder of one unpacked, whose libraries are read (symbols only: nothing is imported)"),
    Opt(("--built-with",), type=local_path, metavar="PATH", help="the torch the wheel was built with (a wheel file or"
        " a folder of one unpacked): a symbol its libraries export is one the new torch must export too"),
    Opt(("--into",), type=local_path, metavar="WHEELHOUSE", help="place a reusable wheel in this wheelhouse, in the"
        " folder of the torch it was checked against, marked reused_from in its manifest"),
    Opt(("--recipe",), help="recipe whose gpu_check to run (default: the one for the wheel's distribution)"),
    Opt(("--no-gpu-check",), action="store_true", help="skip the recipe's GPU check even where a GPU is here"),
    Opt(("--timeout",), type=float, default=600.0, help="seconds the whole check may take (default: 600)"),
    JSON.but(help="print the result as JSON"),
    CONFIG,
    RECIPE_DIR,
))

DOCTOR = Command("doctor", "checking.cmd_doctor", "check this machine: torch, nvcc, GPUs, Docker/buildx, disk, RAM", (
    "Check what this machine can build and say how to fix each problem: Python, torch and its CUDA, nvcc and"
    " CUDA_HOME (nvcc's major must equal torch's CUDA major), GPUs and their archs, the Docker engine and buildx"
    " (a real bake matrix with local export is tried), disk, RAM/cores and the job settings builds would use."), (
    Opt(("--python-exe",), type=path_text, help="the interpreter whose torch to check (default: this one)"),
    Opt(("--no-engine",), action="store_true", help="skip the Docker checks"),
    Opt(("--no-build",), action="store_true", help="check the engine and buildx without building the tiny probe"
        " image (a 2-target bake matrix exported locally, nothing pulled; said before it runs)"),
    JSON,
))

CDI_SPEC = Command("cdi-spec", "checking.cmd_cdi_spec", "write a CDI spec for this host's GPUs (builds and containers"
                   " without the toolkit)", (
    "Write a Container Device Interface spec declaring nvidia.com/gpu=all from this host's NVIDIA device nodes and"
    " the running driver's libraries (found as imagegen doctor finds them), for hosts without the NVIDIA Container"
    " Toolkit (where it exists, `nvidia-ctk cdi generate` writes one). Docker 25+ with CDI on reads it for `docker"
    " run --device nvidia.com/gpu=all`, and BuildKit for `RUN --device` (imagegen build --gpu-check-device"
    " nvidia.com/gpu=all); it carries the annotation that lets builds use it without the `device` entitlement."
    " Exit 8 when this host has no NVIDIA devices and driver."), (
    Opt(("-o", "--output"), type=path_text,
        help="write to this file (e.g. /etc/cdi/imagegen-nvidia.json) instead of stdout"),
))

SETUP = Command("setup", "setup.cmd_setup", "set up Docker with buildx, a local registry or QEMU on Debian/Ubuntu"
                " (root)", (
    "Set up what builds in containers need on a Debian or Ubuntu machine with the scripts shipped in imagegen:"
    " engine installs a Docker engine, the buildx plugin and the docker client where there is none, and starts"
    " dockerd (Ubuntu's from its own archive; Debian's from Debian 13's, which has buildx); registry installs Debian's docker-registry and htpasswd, a registry of this"
    " machine's own, its packaged service left stopped; qemu registers qemu-user-static with binfmt_misc, for"
    " linux/arm64 build steps on an x86_64 machine. Each is idempotent (what is there already is kept) and needs"
    " root: run as another user, it says how to re-run with sudo and runs nothing."), (
    Opt(("part",), choices=("engine", "registry", "qemu"), help="what to set up: engine, registry or qemu"),
    Opt(("--print",), action="store_true", help="print the script instead of running it (root not needed): what"
        " would run, with the helper it sources written in, to read first or to save and run with bash"),
))

REFRESH = Command("refresh", "planning.cmd_refresh", "add new torch series and CUDA toolkits from PyPI to your"
                  " compatibility tables", (
    "Read PyPI (torch's wheels and their metadata, cuda-toolkit) and add what imagegen's tables lack: new torch"
    " series (newest release, Python range, the CUDA variant of its PyPI wheel) and CUDA toolkits; update the"
    " PyPI-derived facts of known series. Written to a user-level overlay ($IMAGEGEN_COMPAT_DIR, else"
    " ~/.config/imagegen/compat), never into the installed package. Refuses an answer that looks broken (a release"
    " going backwards, lost series or Pythons, an unknown CUDA). The cuXYZ builds of download.pytorch.org cannot be"
    " read from PyPI: a new series lists only its PyPI variant. Then say each catalogue package whose newest"
    " release on the index is newer than the newest release its recipe pins, with its sdist's name and sha256 (a"
    " pin to add; the catalogue is not written)."), (
    Opt(("--index-url",), help="a PyPI-compatible simple index with the JSON API (default:"
        " https://pypi.org/simple/)"),
    Opt(("--dry-run",), action="store_true", help="show what would change; write nothing"),
))

RECIPES = Command("recipes", "planning.cmd_recipes", "list the recipe catalogue",
                  "List every recipe with its versions, arch knob and supported archs.", (JSON, COMMON))

ARCHS = Command("archs", "planning.cmd_archs", "parse an arch list and show it in every consumer's format", (
    "Normalise a GPU arch list and print it as TORCH_CUDA_ARCH_LIST, FLASH_ATTN_CUDA_ARCHS, NATTEN_CUDA_ARCH,"
    " CMAKE_CUDA_ARCHITECTURES and -gencode flags; with --cuda/--torch, check it against them."), (
    Opt(("arch",), help="arch list, e.g. '8.0 9.0a 12.0+PTX' or Hopper"),
    Opt(("--cuda",), help="check against this nvcc version"),
    Opt(("--torch",), help="check against this torch's TORCH_CUDA_ARCH_LIST parser"),
))

PUSH = Command("push", "images.cmd_push", "build and push prebuilt builder images for a matrix", (
    "Bake each cell's builder stage (OS packages, torch, build requirements, the pinned and patched source; no"
    " arch) and push it as REGISTRY/imagegen-<recipe>:<ver>-torch<X.Y>-cu<XYZ>-py<XY>[-<flavor>], with OCI labels."
    " The pushed digests are written to the lock file, which pull then uses."), (
    MATRIX,
    REGISTRY,
    Opt(("--work",), type=local_path, default=Path(".imagegen"), help="bake files and logs (default: .imagegen)"),
    Opt(("--builder",), help="buildx builder to run on (default: the current one)"),
    CACHE,
    Opt(("--ca-bundle",), type=path_text,
        help="CA bundle for PyPI/git inside builds (a BuildKit secret, never in a layer)"),
    NETRC,
    COMMON,
))

PULL = Command("pull", "images.cmd_pull", "pull prebuilt builder images and run them to produce wheels", (
    "For each cell: pull its builder image (pinned by the lock file when it has it), run it with the GPUs visible"
    " when this host has any, verify the wheel and publish it into OUT like build. A missing image is built"
    " locally from the same Dockerfile; wrong credentials or an unreachable registry stop."), (
    MATRIX,
    REGISTRY,
    OUT_FOLDER,
    Opt(("--work",), type=local_path, default=Path(".imagegen"), help="staging and logs (default: .imagegen)"),
    Opt(("--gpus",), choices=("auto", "all", "toolkit", "cdi", "devices", "none"), default="auto", help="give the"
        " container the GPUs: toolkit (--gpus all, the NVIDIA Container Toolkit), cdi (--device nvidia.com/gpu=all,"
        " a CDI spec), devices (the /dev/nvidia* nodes and the driver's libraries, passed by hand: no toolkit"
        " needed); auto: the first of them this host supports, when nvidia-smi works here (imagegen doctor says"
        " which); all: --gpus all as it is"),
    Opt(("--no-fallback",), action="store_true", help="fail when the image is missing instead of building it"
        " locally"),
    Opt(("--no-audit",), action="store_true", help="skip the gencode audit the image runs before compiling (the"
        " package's own build with stand-in compilers, which refuses a cell whose build would fail or miss an"
        " arch)"),
    COMPILE,
    Opt(("--ca-bundle",), type=path_text, help="CA bundle for a local fallback build"),
    NETRC,
    JSON_RESULTS,
    COMMON,
))

LOCK = Command("lock", "images.cmd_lock", "pin every base image (and pushed builder image) of a matrix to its"
               " registry digest", (
    "Resolve the base image of every buildable cell to the digest its registry serves now and write the lock"
    " file; render, bake, build and pull then use FROM image@sha256:..., so a moved tag cannot change a build."
    " With a registry (--registry, else the config's registry), each cell's builder image there is pinned too,"
    " read from its manifest without pulling it (one not pushed yet is said and left out); pull then uses"
    " that digest."),
    (MATRIX, REGISTRY, COMMON))

COLLECT = Command("collect", "collecting.cmd_collect", "verify and record the wheels a builder image exported"
                  " (docker buildx bake, docker run -v OUT:/out)", (
    "Take into the wheelhouse the wheels that builder images made outside `imagegen build`: a plain `docker"
    " buildx bake` of the generated bake file, a `docker run -v OUT:/out` of a builder image, the build jobs of"
    " `imagegen ci github`. Each such wheel has a build record beside it (<wheel>.imagegen.json); a wheel whose"
    " sha256 and passed smoke test match its record and whose .so files carry the SASS/PTX its requested archs"
    " need (as its recipe compiles them) is recorded in its folder's manifest.json, which `imagegen index` and"
    " `imagegen publish` read. Exit 6 when a wheel fails; it is left out, the others are recorded. A wheel"
    " imagegen did not build (an RTX 5090 user's own SageAttention wheel): `imagegen collect WHEEL... --external"
    " --arch LIST --out WHEELHOUSE` verifies its SASS/PTX against --arch, reads its tags, records its sha256 and"
    " marks it external in WHEELHOUSE's manifest.json (no smoke test: there is no build record)."), (
    Opt(("out",), nargs="+", type=local_path, metavar="OUT",
        help="the folder the builds exported to (searched for build records); with --external, the wheel files"),
    Opt(("--external",), action="store_true", help="take wheels imagegen did not build: verify each against --arch"
        " and record it, flat in --out, as external"),
    Opt(("--arch",), help="with --external: the archs the wheels must carry, e.g. '12.0' (an RTX 5090) or"
        " '8.0;9.0a+PTX'"),
    Opt(("--out",), dest="wheelhouse", type=local_path, metavar="WHEELHOUSE", help="with --external: the wheelhouse"
        " folder the wheels are copied into (flat) and recorded in (made if missing)"),
    Opt(("--strict",), action="store_true", help="fail a wheel whose extensions carry archs not requested"),
    RECIPE_DIR.but(help="extra directory of recipe YAML files (repeatable), for wheels of your own recipes"),
    CONFIG,
    JSON,
))

INDEX = Command("index", "indexing.cmd_index", "write a pip index (PEP 503 simple + find-links page) for a"
                " wheelhouse", (
    "Write a static package index for the verified wheels of a wheelhouse (those its manifest.json files list):"
    " OUT/simple/<project>/ pages with #sha256= fragments and data-requires-python (PEP 503; PEP 691 JSON beside"
    " them) and OUT/index.html for pip --find-links. Servable by any web server, S3 or GitHub Pages. Rewritten"
    " atomically: a reader never sees a half-written index."), (
    WHEELHOUSE,
    Opt(("--base-url",), help="absolute URL the wheelhouse is served from (default: links relative to the index,"
        " which works wherever the folder is served)"),
    Opt(("--variants",), action=argparse.BooleanOptionalAction, default=None, help="also list each wheel as a wheel"
        " variant (PEP 817/825: a copy with its CUDA version and GPU archs as variant properties, and each"
        " version's variants.json) for a variant-aware installer; plain pip ignores them. Costs a copy of every"
        " wheel; later runs (build --index too) keep them until --no-variants removes them (default: as the index"
        " has them)"),
    Opt(("--merge",), metavar="URL", help="the URL this wheelhouse's index is published at (an earlier run's): list"
        " the wheels served there beside these, flat and per CUDA, and write each cell folder's"
        " manifest.served.json (its published cells and this run's), for imagegen publish --to"
        " s3://BUCKET/PREFIX,layout=wheelhouse to upload; nothing published yet (404) merges nothing; a wheel name"
        " served with another sha256 is refused"),
    JSON,
))

REPAIR = Command("repair", "repairing.cmd_repair", "give wheels a manylinux tag with auditwheel (torch's libraries"
                 " excluded)", (
    "Run auditwheel repair on each wheel with the libraries torch provides excluded (libtorch, libc10, libcudart,"
    " libcuda, ...), so the wheel gets the manylinux tag its glibc needs and no copy of torch; print the glibc"
    " ceiling; verify and import the repaired wheel again."), (
    WHEELS,
    Opt(("--out",), type=local_path,
        help="where the repaired wheels go (default: beside each wheel, which replaces it in"
        " its wheelhouse folder and manifest)"),
    Opt(("--plat",), help="manylinux tag to ask for (default: the lowest the wheel's symbols allow)"),
    Opt(("--python-exe",), type=path_text,
        help="import the repaired wheel with this interpreter (it must have the torch the wheel"
        " was built for; default: skip the import test when this one has no torch)"),
    JSON,
))

PUBLISH = Command("publish", "publishing.cmd_publish", "upload a wheelhouse's verified wheels (PyPI-compatible,"
                  " Hugging Face Hub, GitHub release, S3)", (
    "Upload the verified wheels of a wheelhouse: a wheel already there with the same sha256 is skipped, one that"
    " differs under the same name is refused. Credentials come from the environment (TWINE_USERNAME /"
    " TWINE_PASSWORD, HF_TOKEN, GITHUB_TOKEN, AWS_*), ~/.netrc or the token `huggingface-cli login` stored, never"
    " from the command line. Each exchange with a destination has a total deadline: $IMAGEGEN_PUBLISH_DEADLINE"
    " seconds (default 300), plus one per MiB uploaded."), (
    WHEELHOUSE,
    Opt(("--to",), required=True, action="append", metavar="DEST", help="pypi:URL (a PyPI-compatible upload"
        " endpoint, e.g. pypi:https://upload.pypi.org/legacy/), hf:OWNER/REPO[@REVISION][:PATH],"
        " github:OWNER/REPO@TAG, s3://BUCKET[/PREFIX] (repeatable)"),
    Opt(("--dry-run",), action="store_true", help="list what would be uploaded where, contacting no destination"
        " (works offline, needs no credentials); upload nothing"),
    Opt(("--check",), action="store_true", help="a dry run that reads what each destination holds (with the"
        " credentials if set, else anonymously), so says what would be skipped or refused; upload nothing"),
    Opt(("--create",), action="store_true", help="create an hf: repository that does not exist yet (a public model"
        " repository, as the Hub makes one; one that exists is used as it is); a dry run creates nothing"),
    JSON,
))


COMMANDS = (RENDER, PLAN, BAKE, BUILD, VERIFY, CHECK, REUSE, DOCTOR, SETUP, CDI_SPEC, REFRESH, RECIPES, ARCHS, PUSH, PULL,
            LOCK, COLLECT, INDEX, REPAIR, PUBLISH, CI)
