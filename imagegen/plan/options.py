"""Options: what a command runs with, resolved once and in one place: command-line flags first, then
the project config file (imagegen.toml or [tool.imagegen] in pyproject.toml), then imagegen's
defaults (resources/defaults.yaml). Every command reads the one frozen Options; no other module
decides which of the three wins. What the command line gave comes in as Flags, plain values (the shell
makes them from its parser: imagegen.commands.common.flags), so nothing below the shell reads argparse."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from imagegen import safety
from imagegen.plan.config import DEFAULT_OUT, Config
from imagegen.errors import Unreadable, UsageError
from imagegen.outputs import shown
from imagegen.model import compat
from imagegen.model.layout import DEFAULT_LAYOUT, validate_layout
from imagegen.model.recipes import JOB_FLAGS
from imagegen.plan.matrix import defaults
from imagegen.plan.refs import BuildCredentials


@dataclass(frozen=True)
class Flags:
    """What the command line gave, as its parser left it: None (or empty) where a flag was not given or the
    command has no such flag. ``command``: the command's name (build, render, ...)."""

    command: str | None = None
    recipes: Sequence[str] = ()  # positional recipe names or project paths
    source: Path | Sequence[Path] | None = None  # --source (render: one; the matrix commands: repeatable)
    recipe_version: str | Sequence[str] | None = None  # --version
    torch: str | Sequence[str] | None = None
    cuda: str | Sequence[str] | None = None
    python: str | Sequence[str] | None = None
    arch: str | Sequence[str] | None = None
    out: str | None = None
    flavor: str | None = None
    base_image: str | Sequence[str] | None = None
    registry: str | None = None
    layout: str | None = None
    offline: bool = False
    gpu_check_device: str | None = None
    platform: str | Sequence[str] | None = None
    dockerfile_frontend: str | None = None
    fetch: str | None = None
    env: Sequence[str] | None = None  # --env NAME=VALUE (repeatable)
    ref: str | None = None
    git: str | None = None
    max_jobs: int | None = None
    shell: str | None = None  # render --shell
    native: bool = False
    netrc: str | None = None


# The commands with --max-jobs/--nvcc-threads of their own (render's only with --shell).
_JOB_FLAG_COMMANDS = ("build", "pull", "render")


@dataclass(frozen=True)
class Options:
    config: Config
    flavor: str  # --flavor, else the config's, else the default (flavor_given False: fallbacks may apply)
    flavor_given: bool
    # One image for every cell, or per CUDA variant: {"cu128": IMAGE, "*": IMAGE} (base_images)
    base_image: str | dict[str, str] | None
    torch_index_url: str | None
    registry: str | None
    out: Path  # where wheels go (the config's out, else wheelhouse)
    # out as the files imagegen writes for later runs name it (a bake file's outputs, a Windows script's
    # wheelhouse): --out as given, a config's out relative to the current folder, else wheelhouse
    out_written: str
    recipes: tuple[str, ...]  # named on the command line, else the config matrix's (empty: every recipe)
    # The values given per axis: flags, else the config matrix; empty: the axis is filled per cell by
    # the one default policy (plan.choose_cell: newest torch that builds, its PyPI CUDA, Python 3.12).
    torch: tuple[str, ...]
    cuda: tuple[str, ...]
    python: tuple[str, ...]
    archs: tuple[str, ...]  # arch lists, one per --arch (a matrix takes several)
    # One cell (render): what was given, else the config matrix's last entry (the newest listed),
    # else None (the default policy fills it).
    torch_one: str | None
    cuda_one: str | None
    python_one: str | None
    arch_configured: str | None  # --arch, else the config's (None: the caller's own default applies)
    layout: str = DEFAULT_LAYOUT  # where wheels land below out: --layout, else the config's, else the default
    offline: bool = False  # --offline, else the config's `offline = true`
    gpu_check_device: str | None = None  # --gpu-check-device (plan.with_gpu_check)
    platforms: tuple[str, ...] = ()  # --platform, parsed (platforms.with_platforms); empty: linux/amd64 alone
    dockerfile_frontend: str | None = None  # --dockerfile-frontend
    # The request's sources (imagegen.plan.request.matrix): --source trees, --version values (several: each
    # recipe at each), --fetch, the user's --env, --ref/--git; how an --env refusal names this command's
    # job flags; what the builds fetch a --ref/--git source with (build, push, pull in containers).
    sources: tuple[Path, ...] = ()
    versions: tuple[str, ...] = ()
    fetch: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    ref: str | None = None
    git: str | None = None
    jobs_fix: tuple[str, str] = JOB_FLAGS
    build_credentials: BuildCredentials | None = None
    # --torch, --cuda and --python as given on the command line, not the config's: a native build holds
    # them to the host's (imagegen.plan.request.native_cell)
    axes_given: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


# Inside one --torch/--cuda/--python value, as users type lists: "2.8 2.9", "2.8,2.9", "3.11, 3.12".
_LIST_SEP = re.compile(r"[\s,]+")


def listed(value, flag: str) -> tuple[str, ...]:
    """A flag's values: repeated flags, and lists inside one value. A flag that takes one value
    (render's) refuses a list in one line."""
    if value is None:
        return ()
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    out: list[str] = []
    for v in values:
        parts = [part for part in _LIST_SEP.split(str(v).strip()) if part]
        if not parts:  # given empty: refused, never taken as "not given" (the default)
            raise UsageError(f"{flag}: give a value (got an empty one)")
        out.extend(parts)
    if not isinstance(value, (list, tuple)) and len(out) > 1:
        raise UsageError(f"{flag} takes one value here, not a list ({', '.join(out[:4])}): this command builds"
                         " one cell; plan, bake and build take lists, and for Windows `imagegen ci github --windows"
                         " RECIPE` takes them as --windows-version, --windows-torch, --windows-cuda and --windows-python"
                         " (one job per cell)")
    return tuple(out)


def platform_flag(value) -> tuple[str, ...]:
    """--platform's values (repeated, or a list in one value), parsed; empty when not given."""
    from imagegen.plan.platforms import parse_platforms
    return parse_platforms(listed(value, "--platform")) if value is not None else ()


def recipe_versions(flags: Flags) -> tuple[str, ...]:
    """--version's values, each once (repeated, or a list in one value: '2.8.2 2.8.3', 2.8.2,2.8.3); empty
    when not given (the recipe's default version). render's single --version refuses a list."""
    return _unique(listed(flags.recipe_version, "--version"))


def _unique(values) -> tuple[str, ...]:
    return tuple(dict.fromkeys(values))


def flag_values(flags: Flags, name: str) -> tuple[str, ...]:
    """What --torch, --cuda or --python were given as, one value each (lists split; Pythons in one
    notation: 3.12, 312, py312 and cp312 are 3.12); empty when the flag was not given."""
    values = listed(getattr(flags, name), f"--{name}")
    return tuple(compat.validate_python(v) for v in values) if name == "python" else values


def base_images(values) -> str | dict[str, str] | None:
    """--base-image IMAGE (every cell) or CUDA=IMAGE (the cells of that CUDA version), repeatable:
    one image, or {cuXYZ: image, "*": image}. IMAGE may be PRIMARY,FALLBACK[,...]: the images tried in
    order when the first cannot be pulled (each checked as an image reference by the plan)."""
    values = [values] if isinstance(values, str) else list(values or [])  # "" is a value given, and refused below
    if not values:
        return None
    out: dict[str, str] = {}
    for value in values:
        cuda, sep, image = value.partition("=") if "=" in value.split("/")[0].split(":")[0] else ("", "", value)
        if not image.strip() or any(not i.strip() for i in image.split(",")):
            # Nothing silently dropped: an empty image would leave the cells on the flavor's own.
            raise UsageError(f"--base-image {safety.describe(value)}: no image"
                             + (" after '='" if sep and not image else " between commas" if image.strip() else "")
                             + ": give [CUDA=]IMAGE[,FALLBACK], e.g. 12.8=nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04")
        variant = compat.cuda_variant(cuda) if sep else None
        key = variant.name if variant else "*"
        if key in out and out[key] != image:
            which = f"CUDA {variant.dotted}" if variant else "every cell"
            raise UsageError(f"--base-image: two images for {which}"
                             f" ({out[key]} and {image})")
        out[key] = image
    return out["*"] if list(out) == ["*"] else out


def resolve(flags: Flags, config: Config) -> Options:
    d = defaults()
    m = config.matrix
    torch, cuda, python = (flag_values(flags, k) for k in ("torch", "cuda", "python"))
    arch = flags.arch  # a list of archs is one value ("8.0 9.0"); several lists are several flags
    arch = tuple(arch) if isinstance(arch, (list, tuple)) else (() if arch is None else (arch,))
    out = flags.out
    # The wheelhouse written below it: never the root, the home folder or a system folder.
    safety.wheelhouse_folder(Path(out) if out else config.out, "--out", UsageError)
    flavor = flags.flavor or config.flavor
    # render takes one --source, the matrix commands several
    given = [flags.source] if isinstance(flags.source, (str, Path)) else list(flags.source or ())
    sources = tuple(Path(s) for s in given)
    ref, git = flags.ref, flags.git
    return Options(
        config=config,
        flavor=flavor or d["flavor"],
        flavor_given=bool(flavor),
        base_image=base_images(flags.base_image) or config.base_image,
        torch_index_url=config.torch_index_url,
        registry=flags.registry or config.registry,
        out=Path(out) if out else config.out,
        out_written=str(out) if out else (os.path.relpath(config.out) if config.path else DEFAULT_OUT),
        # --source alone means just that project; otherwise the named recipes, else the config's (empty: all)
        recipes=tuple(flags.recipes or ()) or (() if sources else tuple(m.recipes)),
        torch=_unique(torch or m.torch),
        cuda=_unique(cuda or m.cuda),
        python=_unique(python or m.python),
        archs=arch or ((m.arch,) if m.arch else (d["arch"],)),
        torch_one=(torch[0] if torch else None) or (m.torch[-1] if m.torch else None),
        cuda_one=(cuda[0] if cuda else None) or (m.cuda[-1] if m.cuda else None),
        python_one=(python[0] if python else None) or (m.python[-1] if m.python else None),
        arch_configured=(arch[0] if arch else None) or m.arch,
        layout=validate_layout(flags.layout) if flags.layout is not None else config.layout or DEFAULT_LAYOUT,
        offline=bool(flags.offline or config.offline),
        gpu_check_device=flags.gpu_check_device,
        platforms=platform_flag(flags.platform),
        dockerfile_frontend=flags.dockerfile_frontend,
        sources=sources,
        versions=recipe_versions(flags),
        fetch=flags.fetch,
        env=user_env(flags.env),
        ref=ref,
        git=git,
        jobs_fix=job_fix(flags),
        build_credentials=build_credentials(flags) if ref or git else None,
        axes_given={"torch": torch, "cuda": cuda, "python": python},
    )


def user_env(items: Sequence[str] | None) -> dict[str, str]:
    """``--env KEY=VALUE`` (repeatable): a package's own variables for the build, checked like a
    recipe's (a name, and printable text without quotes, $ or `: the value reaches Dockerfiles only
    as JSON, but also the Windows scripts)."""
    env: dict[str, str] = {}
    for item in items or []:
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


def job_fix(flags: Flags) -> tuple[str, str]:
    """How this command sets MAX_JOBS and NVCC_THREADS, as an --env refusal says it: its own flags where
    it takes them (build, pull, render --shell), else where the jobs of what it writes are set."""
    if flags.max_jobs is not None or (flags.command in _JOB_FLAG_COMMANDS and (flags.command != "render" or flags.shell)):
        return JOB_FLAGS
    if flags.command == "render":
        return tuple(f"the Dockerfile takes it at build time (docker build --build-arg {v}=N)"  # type: ignore[return-value]
                     for v in ("MAX_JOBS", "NVCC_THREADS"))
    if flags.command == "bake":
        return tuple(f"the bake file takes it at bake time ({v}=N docker buildx bake)"  # type: ignore[return-value]
                     for v in ("IMAGEGEN_MAX_JOBS", "IMAGEGEN_NVCC_THREADS"))
    return tuple(f"imagegen build sets it ({flag})" for flag in ("--max-jobs", "--nvcc-threads"))  # type: ignore[return-value]


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


def build_credentials(flags: Flags) -> BuildCredentials | None:
    """What the container builds of this command will have to fetch a private git source (``--netrc``),
    for resolving its ref with exactly that; None for a command that builds nothing or natively (git on
    this machine then uses its own ~/.netrc and credential helpers)."""
    if flags.command not in ("build", "push", "pull") or flags.native:
        return None
    return BuildCredentials(netrc_file(flags.netrc))


__all__ = ["Flags", "Options", "build_credentials", "flag_values", "job_fix", "listed", "netrc_file", "platform_flag",
           "recipe_versions", "resolve", "user_env"]
