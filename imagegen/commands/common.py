"""Shared by the commands: the config and catalogue a command reads, the plan it builds, and the checks
of the values it hands on (registry, builders, cache specs, CA bundle, executables)."""

from __future__ import annotations

import argparse
import dataclasses
import errno
import os
import re
import shlex
import shutil
import stat
import sys
from pathlib import Path
from typing import Callable, Sequence

from imagegen import safety
from imagegen.plan import options, refs
from imagegen.plan.config import Config, load_config
from imagegen.errors import ImagegenError, NothingToDoError, Unreadable, UsageError
from imagegen.model import compat
from imagegen.model.arch import ArchList
from imagegen.model.arch_parse import parse_arch_list
from imagegen.model.catalogue import Catalogue, load_catalogue
from imagegen.model.recipes import JOB_FLAGS, Recipe, RecipeVersion, fetched_from, with_env, with_memory_for
from imagegen.model.source_tree import looks_like_path, recipe_from_source_tree, with_declared_version
from imagegen.outputs import shown
from imagegen.model.cell import BUILDABLE, Cell, MatrixRequest, Plan
from imagegen.plan.matrix import (
    defaults,
    device_requests,
    expand,
    gpu_checked,
    with_gpu_check,
    with_layout,
    with_offline,
)
from imagegen.plan.platforms import with_requested_platforms


def config(args: argparse.Namespace) -> Config:
    return load_config(args.config, search_from=Path.cwd()) if args.config else load_config(search_from=Path.cwd())


def catalogue(args: argparse.Namespace, config: Config) -> Catalogue:
    return load_catalogue(tuple(config.recipe_dirs) + tuple(args.recipe_dir))


def user_env(args: argparse.Namespace) -> dict[str, str]:
    """``--env KEY=VALUE`` (repeatable): a package's own variables for the build, checked like a
    recipe's (a name, and printable text without quotes, $ or `: the value reaches Dockerfiles only
    as JSON, but also the Windows scripts)."""
    env: dict[str, str] = {}
    for item in getattr(args, "env", None) or []:
        name, sep, value = item.partition("=")
        if not sep or not safety.ENV_NAME.fullmatch(name):
            raise UsageError(f"--env {shown(item, 60)}: expected NAME=VALUE, NAME a variable name like NVCC_APPEND_FLAGS")
        if not safety.ENV_VALUE.fullmatch(value):
            raise UsageError(f"--env {name}: bad value {shown(value, 60)} (printable text, no quotes, $ or `)")
        secret = safety.env_secret(name, value)
        if secret:
            raise UsageError(f"--env {name}: {secret}; {safety.ENV_SECRET_INSTEAD}")
        if env.get(name, value) != value:
            raise UsageError(f"--env {name} is given twice with different values")
        env[name] = value
    return env


def job_fix(args: argparse.Namespace) -> tuple[str, str]:
    """How this command sets MAX_JOBS and NVCC_THREADS, as an --env refusal says it: its own flags where
    it takes them (build, pull, render --shell), else where the jobs of what it writes are set."""
    if getattr(args, "max_jobs", None) is not None or (hasattr(args, "max_jobs") and (
            args.command != "render" or getattr(args, "shell", None))):
        return JOB_FLAGS
    if args.command == "render":
        return tuple(f"the Dockerfile takes it at build time (docker build --build-arg {v}=N)"  # type: ignore[return-value]
                     for v in ("MAX_JOBS", "NVCC_THREADS"))
    if args.command == "bake":
        return tuple(f"the bake file takes it at bake time ({v}=N docker buildx bake)"  # type: ignore[return-value]
                     for v in ("IMAGEGEN_MAX_JOBS", "IMAGEGEN_NVCC_THREADS"))
    return tuple(f"imagegen build sets it ({flag})" for flag in ("--max-jobs", "--nvcc-threads"))  # type: ignore[return-value]


def resolve(cat: Catalogue, name: str | None, source: Path | None, wanted_version: str | None,
            fetch: str | None = None, env: dict[str, str] | None = None, *, ref: str | None = None,
            git: str | None = None, jobs: tuple[str, str] = JOB_FLAGS,
            build: refs.BuildCredentials | None = None) -> tuple[Recipe, RecipeVersion]:
    if source is not None and name is not None:
        raise UsageError(f"name a recipe ({shown(name, 60)}) or give --source {shown(source, 60)}, not both")
    if source is None and name is not None and looks_like_path(name):
        source = Path(name)
    if source is not None:
        recipe = recipe_from_source_tree(source)
        known = cat.by_distribution(recipe.distribution)
        if known is not None:  # a tree of a package the catalogue knows: built with that recipe's knowledge
            recipe, version = refs.at_tree(known, known.version(None), source, wanted_version, tree=recipe)
            return with_build_env(recipe, version, env or {}, jobs)
        # your own project: named by the version it states, else the one --version declares
        recipe = with_declared_version(recipe, wanted_version)
        wanted_version = None
        if recipe.version(None).source_version is None:
            print(f"imagegen: warning: {recipe.version(None).resolved}", file=sys.stderr)
    elif name is None:
        raise UsageError("name a recipe (imagegen recipes lists them) or give --source PATH")
    else:
        recipe = cat.get(name)
    if ref or git:
        if fetch == "sdist":
            raise UsageError("--fetch sdist builds a pinned version's source distribution; --ref/--git fetch from git")
        recipe, version = refs.at_ref(recipe, ref, git, wanted_version, build)
    else:
        recipe, version = fetched_from(recipe, recipe.version(wanted_version), fetch)
    return with_build_env(recipe, version, env or {}, jobs)


def with_build_env(recipe: Recipe, version: RecipeVersion, env: dict[str, str],
                   jobs: tuple[str, str]) -> tuple[Recipe, RecipeVersion]:
    """The user's --env on top of the version's, and the recipe's memory figure for that environment."""
    version = with_env(recipe, version, env, jobs)
    return with_memory_for(recipe, version.env), version


def lock(args: argparse.Namespace):
    from imagegen.plan.registry import LOCK_FILE, Lock

    path = getattr(args, "lock", None)
    if path is not None and not str(path).strip():
        raise UsageError("--lock: give the lock file's path")
    if path is not None and not is_file(path) and args.command not in ("lock", "push"):
        raise UsageError(f"--lock {shown(path)}: no such file (imagegen lock writes it)")
    return Lock.load(path or Path(LOCK_FILE))


def is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except (OSError, ValueError):  # a name too long, a NUL
        return False


def check_wheel_file(wheel: Path) -> None:
    """A wheel argument (verify, repair) is an existing file, or a one-line UsageError."""
    try:
        found = wheel.is_file()
    except OSError as exc:  # a 5000-character name
        raise UsageError(f"{shown(wheel)}: {exc.strerror or 'not a usable path'}") from None
    if not found:
        raise UsageError(f"{shown(wheel)}: no such wheel file")


def planned(args: argparse.Namespace, config: Config, cat: Catalogue, *, pin: bool = True,
            opts: options.Options | None = None):
    """The matrix expanded, with locked base images pinned to their digests (``pin``; `imagegen lock`
    wants the tags); a cell asked twice (``sage SAGE``, ``--torch 2.8 --torch 2.8.0``, ``--cuda 12.8
    --cuda cu128``) is there once. ``opts``: the command's options when it resolved them already."""
    opts = opts or options.resolve(args, config)
    request = matrix(args, config, cat, opts)
    # a flavor whose images each serve one device (jetson) plans its devices' own cells on open axes
    requests = device_requests(request, torch=opts.torch_one is not None, cuda=opts.cuda_one is not None,
                               python=opts.python_one is not None, arch=opts.arch_configured is not None)
    expanded = Plan(cells=[c for r in requests for c in expand(r).cells])
    plan = with_requested_platforms(with_layout(unique_cells(expanded), opts.layout), opts.platforms, request.flavor)
    if opts.offline:
        plan = with_offline(plan)
    plan = plan.each(gpu_check_step(opts))
    return lock(args).pin_bases(plan) if pin else plan


def gpu_check_step(opts: options.Options) -> Callable[[Cell], Cell]:
    """The per-cell change --gpu-check-device asks for (the GPU check inside the build; none without it),
    its values checked now."""
    if opts.dockerfile_frontend is not None and opts.gpu_check_device is None:
        raise UsageError("--dockerfile-frontend goes with --gpu-check-device (only `RUN --device` needs a labs frontend)")
    # `is not None`: an empty value (an unset shell variable) is refused by with_gpu_check, not taken as no flag.
    if opts.gpu_check_device is None:
        return lambda cell: cell
    device, frontend = opts.gpu_check_device, opts.dockerfile_frontend
    with_gpu_check(Plan(), device, frontend)  # refuses a bad device or frontend even where no cell is built
    return lambda cell: gpu_checked(cell, device, frontend)




def unique_cells(plan: Plan) -> Plan:
    seen: set = set()
    cells = []
    for c in plan.cells:
        key = (c.name, str(c.archs), c.status)
        if key not in seen:
            seen.add(key)
            cells.append(c)
    return dataclasses.replace(plan, cells=cells)


def one_target_per_cell(plan: Plan) -> Plan:
    """bake/build/pull make one bake target per cell, named by the cell: two arch lists of one cell
    would be two targets of one name (bake keeps one of them, or refuses the file)."""
    archs: dict[str, str] = {}
    for c in plan.buildable:
        other = archs.setdefault(c.name, str(c.archs))
        if other != str(c.archs):
            raise UsageError(f"{c.name} is asked for two arch lists ({other} and {c.archs}): a build makes one target"
                             f" per cell; give one --arch list (e.g. --arch '{other};{c.archs}'), or run once per list")
    return plan


def registry(args: argparse.Namespace, config: Config) -> str:
    from imagegen.plan.registry import check_registry

    value = options.resolve(args, config).registry
    if not value:
        raise UsageError("no registry: pass --registry HOST[:PORT]/NAMESPACE or set registry in imagegen.toml")
    return check_registry(value)


BUILDER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,99}")


def check_builders(values: Sequence[str] | str | None) -> None:
    for v in [values] if isinstance(values, str) else values or []:
        if not BUILDER.fullmatch(v):
            raise UsageError(f"--builder {v!r}: not a buildx builder name (letters, digits, '.', '_', '+', '-')")


def check_job_flags(args: argparse.Namespace) -> None:
    """--max-jobs and --nvcc-threads, for every command that compiles (container, native, pulled, Windows)."""
    for flag in ("max_jobs", "nvcc_threads"):
        value = getattr(args, flag, None)
        if value is not None and not 1 <= value <= 1024:
            raise UsageError(f"--{flag.replace('_', '-')} must be between 1 and 1024")


def ca_bundle(value: str | None) -> str | None:
    if value is not None and not is_file(Path(value)):
        raise UsageError(f"--ca-bundle {shown(value)}: no such file (a PEM bundle, e.g. /etc/ssl/certs/ca-certificates.crt)")
    return value


# A netrc holds a few machine entries: anything bigger is not one.
MAX_NETRC_BYTES = 1 << 20


def netrc_file(value: str | None) -> str | None:
    """``--netrc FILE``: the absolute path of a readable regular file of at most MAX_NETRC_BYTES, handed
    to the builds as the ``netrc`` BuildKit secret (its path goes into the bake file's secret entry;
    its content is read here only to check that it can be). None when not given: no default, since
    every host the file names (and a ``default`` entry: any host) would get its credential from every
    build's fetch, toolchain and deps steps."""
    if value is None:
        return None
    if not value.strip() or any(c in value for c in ',"\'') or not value.isprintable():
        raise UsageError(f"--netrc {shown(value)}: give a file path without ',', quotes or control characters"
                         " (it goes into a BuildKit secret spec)")
    path = Path(value).expanduser()
    try:
        safety.read_regular_file(path, limit=MAX_NETRC_BYTES)
    except Unreadable as exc:
        raise UsageError(f"--netrc {shown(value)}: {exc} (a netrc file: machine HOST login USER password TOKEN)") from None
    resolved = os.path.realpath(path)
    if any(c in resolved for c in ',"\'') or not resolved.isprintable():
        raise UsageError(f"--netrc {shown(value)} leads to {shown(resolved)}: give a path without ',', quotes or"
                         " control characters (it goes into a BuildKit secret spec)")
    return resolved


def compile_cache(value: str | None) -> str | None:
    """``--compile-cache URL`` (or $IMAGEGEN_COMPILE_CACHE): a ccache remote storage URL, redis:// or
    http://, checked; its credential, if any, is never shown."""
    if value is None or not value.strip():
        return None
    if not safety.COMPILE_CACHE_URL.fullmatch(value):
        # (every message is redacted on its way out: the hint names the password's place in words, as a
        # "PASSWORD@" would be hidden too)
        raise UsageError(f"--compile-cache {shown(safety.redact(value))}: give redis://HOST:PORT[/DB] (a password"
                         " before HOST, ending in '@') or"
                         " http://HOST:PORT/PATH (ccache's remote storage; no spaces or quotes)")
    return value


def check_cache_specs(values: Sequence[str]) -> list[str]:
    for v in values:
        if safety.has_credentials(v):
            # the spec goes into the bake file imagegen writes: a registry's credential belongs to docker login
            raise UsageError(f"cache spec {safety.describe(safety.redact(v), 80)} carries a credential, which would be"
                             " written into the bake file: log in to the registry with docker login instead")
        if not CACHE_SPEC.fullmatch(v):
            raise UsageError(f"cache spec {v!r}: expected buildx's key=value,... form, e.g. type=registry,ref=HOST/NS/cache:TAG")
    return list(values)


CACHE_SPEC = re.compile(r"type=[a-z]+(,[a-z-]+=[A-Za-z0-9._:/@=-]+)*|[a-z0-9.-]+(:[0-9]+)?/[A-Za-z0-9._/:@-]+")


def command_line(argv: Sequence[str]) -> str:
    """The command line as one line (it becomes a comment in generated files): an argument with a
    newline or another control character is written in bash's $'...' form."""
    return "imagegen " + " ".join(quote_arg(a) for a in argv)


def quote_arg(arg: str) -> str:
    if all(c.isprintable() for c in arg):
        return shlex.quote(arg)
    return "$'" + "".join(c if c.isprintable() and c not in "\\'" else
                          ("\\" + c if c in "\\'" else c.encode("unicode_escape").decode("ascii")) for c in arg) + "'"


def check_exe(value: str | None, flag: str) -> str | None:
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


def build_credentials(args: argparse.Namespace) -> refs.BuildCredentials | None:
    """What the container builds of this command will have to fetch a private git source (``--netrc``),
    for resolving its ref with exactly that; None for a command that builds nothing or natively (git on
    this machine then uses its own ~/.netrc and credential helpers)."""
    if args.command not in ("build", "push", "pull") or getattr(args, "native", False):
        return None
    return refs.BuildCredentials(netrc_file(getattr(args, "netrc", None)))


def matrix(args: argparse.Namespace, config: Config, cat: Catalogue,
           opts: options.Options | None = None) -> MatrixRequest:
    opts = opts or options.resolve(args, config)
    # --source alone means just that project; otherwise the named recipes, the config's, or all.
    # --version applies to each, a source tree too (which render also refuses when the tree is not it).
    sources = args.source or []
    names = args.recipes or ([] if sources else list(opts.recipes) or cat.names())
    pairs, seen = [], set()
    # A recipe named twice (sage SAGE sageattention) or one project given twice is built once.
    env = user_env(args)
    ref, git = getattr(args, "ref", None), getattr(args, "git", None)
    if (ref or git) and (sources or len({cat.get(n).name if not looks_like_path(n) else n for n in names}) != 1):
        raise UsageError("--ref/--git name one recipe's source: give exactly one recipe with them")
    # Several versions (seed 001's FA_VERSIONS="2.8.2 2.8.3"): each recipe's cells at each of them.
    versions = one_version_per_source(args)
    jobs = job_fix(args)
    build = build_credentials(args) if ref or git else None
    for recipe, version in [resolve(cat, n, None, v, args.fetch, env, ref=ref, git=git, jobs=jobs, build=build)
                            for n in names for v in versions] \
            + [resolve(cat, None, source, versions[0], args.fetch, env, jobs=jobs) for source in sources]:
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
        flavor_given=opts.flavor_given,
    )


def one_version_per_source(args: argparse.Namespace) -> tuple[str | None, ...]:
    """The --version values a matrix is planned at ((None,): each recipe's default). Several versions are
    several pins of a catalogue recipe; a source given as it is (--ref, --git, --source, a path) is one
    version, so it takes one --version."""
    versions = options.recipe_versions(args)
    if len(versions) > 1:
        given = [flag for flag, value in (("--ref", getattr(args, "ref", None)), ("--git", getattr(args, "git", None)),
                                          ("--source", getattr(args, "source", None)))
                 if value] + (["a project path"] if any(looks_like_path(n) for n in args.recipes or []) else [])
        if given:
            raise UsageError(f"--version {' '.join(versions)}: {given[0]} is one source, of one version: give one"
                             " --version with it (several versions are several pins of a catalogue recipe)")
    return versions or (None,)


def buildable(args, config, cat, *, arch_free: bool = False):
    """The plan's buildable cells (one per target name: a builder image, ``arch_free``, is one per cell
    whatever the arch lists)."""
    plan = planned(args, config, cat)
    if arch_free:
        names: set[str] = set()
        plan = dataclasses.replace(plan, cells=[c for c in plan.cells if not (c.status == BUILDABLE and (
            c.name in names or names.add(c.name)))])
    else:
        plan = one_target_per_cell(plan)
    for c in plan.rejected:
        print(f"[{c.name}] rejected: {'; '.join(c.problems)}", file=sys.stderr)
    if not plan.buildable:
        raise NothingToDoError("no cell of this matrix can build (imagegen plan explains each)")
    return plan


def native_cell(args: argparse.Namespace, config: Config, cat: Catalogue, opts: options.Options | None = None):
    """The one cell a native build (or audit) makes on this host, checked like plan's cells."""
    from imagegen.executors import host as host_toolchain
    sources = getattr(args, "source", None) or []
    for flag in ("gpu_check_device", "dockerfile_frontend"):
        if getattr(args, flag, None) is not None:
            raise UsageError(f"--{flag.replace('_', '-')} goes with a container build, not --native (run the"
                             " recipe's gpu_check on a natively built wheel with `imagegen check WHEEL`)")
    if getattr(args, "platform", None):
        raise UsageError("--platform goes with a container build, not --native (a native build makes a wheel for"
                         " this host's platform)")
    if len(args.recipes) + len(sources) != 1:
        raise UsageError("--native builds one recipe (or one --source) at a time, for this host's torch")
    if len(args.arch or []) > 1:
        raise UsageError("--native takes one --arch list")
    versions = options.recipe_versions(args)
    if len(versions) > 1:
        raise UsageError(f"--native builds one version at a time (for this host's torch): give one --version, not"
                         f" {' '.join(versions)}")
    wanted = versions[0] if versions else None
    recipe, version = resolve(cat, args.recipes[0] if args.recipes else None, sources[0] if sources else None,
                              wanted, args.fetch, user_env(args), ref=getattr(args, "ref", None),
                              git=getattr(args, "git", None), jobs=job_fix(args))
    recipe, version = local_checkout(recipe, version, getattr(args, "src_dir", None), wanted)
    host = host_toolchain.probe(check_exe(args.python_exe, "--python-exe"))
    # --torch/--cuda/--python describe the host here: refuse a mismatch instead of building the wrong thing.
    for flag, asked, have in (("--torch", options.flag_values(args, "torch"), host.torch),
                              ("--cuda", options.flag_values(args, "cuda"), host.torch_cuda),
                              ("--python", options.flag_values(args, "python"), host.python)):
        for w in asked:
            if not same_value(flag, w, have):
                raise UsageError(f"{flag} {w} asked, but this host has {have}: a native build uses the host's;"
                                 " install the one you want, or build in a container")
    # With no --arch: the GPUs this host has (seed 000 builds for the Colab GPU it runs on).
    opts = opts or options.resolve(args, config)
    archs = parse_arch_list(opts.arch_configured or ";".join(host.ccs) or defaults()["arch"])
    cell = host_toolchain.preflight(recipe, version, archs, host)
    return dataclasses.replace(cell, layout=opts.layout), host


def same_value(flag: str, asked: str, have: str | None) -> bool:
    """Whether ``have`` (an interpreter's torch, torch's CUDA or Python: 2.8.0, 12.9, 3.12) is what --torch,
    --cuda or --python ``asked`` (2.8, 2.8.0; 12.9, cu129; 3.12)."""
    if have is None:
        return False
    if flag == "--cuda" and compat.cuda_variant(asked).dotted == have:
        return True
    return have == asked or have.startswith(asked + ".")


def local_checkout(recipe: Recipe, version: RecipeVersion, src_dir, wanted: str | None) -> tuple[Recipe, RecipeVersion]:
    """``--src-dir`` on an existing checkout of a git recipe (a native build, a Windows script): the pin as
    it is, or a fork or changed tree built as a local tree with the recipe's knowledge (refs.at_tree); a
    folder that holds no project yet (the build clones into it) leaves the recipe as it is."""
    if src_dir is None or recipe.source_kind != "git" or not any(
            is_file(Path(src_dir) / f) for f in ("setup.py", "pyproject.toml")):
        return recipe, version
    return refs.at_tree(recipe, version, Path(src_dir), wanted)


def expected_for_wheel(cat: Catalogue | None, wheel: Path, archs: ArchList) -> tuple[ArchList, dict]:
    """What ``wheel`` must carry for the request ``archs``, seen through the recipe that builds its
    distribution (the version whose label is the wheel's version, else the default one): the
    request mapped the way the package compiles it (SageAttention builds 9.0 as sm_90a; flash-attn's
    8.6 runs the sm_80 cubin), and the per-extension knowledge (_qattn_sm90: 9.0a only). A wheel no
    recipe knows is held to the request as written, in every extension."""
    from packaging.utils import parse_wheel_filename
    from packaging.version import Version

    from imagegen.finish import check
    from imagegen.model.cell_rules import compiled_archs, expected_archs

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
