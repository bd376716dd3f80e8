"""Options: what a command runs with, resolved once and in one place: command-line flags first, then
the project config file (imagegen.toml or [tool.imagegen] in pyproject.toml), then imagegen's
defaults (resources/defaults.yaml). Every command reads the one frozen Options; no other module
decides which of the three wins."""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass
from pathlib import Path

from imagegen import safety
from imagegen.plan.config import DEFAULT_OUT, Config
from imagegen.errors import UsageError
from imagegen.model import compat
from imagegen.model.layout import DEFAULT_LAYOUT, check_layout
from imagegen.plan.matrix import defaults


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


def _flag(args: argparse.Namespace, name: str):
    return getattr(args, name, None)


# Inside one --torch/--cuda/--python value, as users type lists: "2.8 2.9", "2.8,2.9", "3.11, 3.12".
_LIST_SEP = re.compile(r"[\s,]+")


def _many(value, flag: str) -> tuple[str, ...]:
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
                         " one cell; plan, bake and build take lists")
    return tuple(out)


def platform_flag(value) -> tuple[str, ...]:
    """--platform's values (repeated, or a list in one value), parsed; empty when not given."""
    from imagegen.plan.platforms import parse_platforms
    return parse_platforms(_many(value, "--platform")) if value is not None else ()


def recipe_versions(args: argparse.Namespace) -> tuple[str, ...]:
    """--version's values, each once (repeated, or a list in one value: '2.8.2 2.8.3', 2.8.2,2.8.3); empty
    when not given (the recipe's default version). render's single --version refuses a list."""
    return _unique(_many(_flag(args, "recipe_version"), "--version"))


def _unique(values) -> tuple[str, ...]:
    return tuple(dict.fromkeys(values))


def flag_values(args: argparse.Namespace, name: str) -> tuple[str, ...]:
    """What --torch, --cuda or --python were given as, one value each (lists split; Pythons in one
    notation: 3.12, 312, py312 and cp312 are 3.12); empty when the flag was not given."""
    values = _many(_flag(args, name), f"--{name}")
    return tuple(compat.check_python(v) for v in values) if name == "python" else values


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


def resolve(args: argparse.Namespace, config: Config) -> Options:
    d = defaults()
    m = config.matrix
    torch, cuda, python = (flag_values(args, k) for k in ("torch", "cuda", "python"))
    arch = _flag(args, "arch")  # a list of archs is one value ("8.0 9.0"); several lists are several flags
    arch = tuple(arch) if isinstance(arch, (list, tuple)) else (() if arch is None else (arch,))
    out = _flag(args, "out")
    # The wheelhouse written below it: never the root, the home folder or a system folder.
    safety.wheelhouse_folder(Path(out) if out else config.out, "--out", UsageError)
    flavor = _flag(args, "flavor") or config.flavor
    return Options(
        config=config,
        flavor=flavor or d["flavor"],
        flavor_given=bool(flavor),
        base_image=base_images(_flag(args, "base_image")) or config.base_image,
        torch_index_url=config.torch_index_url,
        registry=_flag(args, "registry") or config.registry,
        out=Path(out) if out else config.out,
        out_written=str(out) if out else (os.path.relpath(config.out) if config.path else DEFAULT_OUT),
        recipes=tuple(_flag(args, "recipes") or ()) or tuple(m.recipes),
        torch=_unique(torch or m.torch),
        cuda=_unique(cuda or m.cuda),
        python=_unique(python or m.python),
        archs=arch or ((m.arch,) if m.arch else (d["arch"],)),
        torch_one=(torch[0] if torch else None) or (m.torch[-1] if m.torch else None),
        cuda_one=(cuda[0] if cuda else None) or (m.cuda[-1] if m.cuda else None),
        python_one=(python[0] if python else None) or (m.python[-1] if m.python else None),
        arch_configured=(arch[0] if arch else None) or m.arch,
        layout=check_layout(_flag(args, "layout")) if _flag(args, "layout") is not None else config.layout or DEFAULT_LAYOUT,
        offline=bool(_flag(args, "offline") or config.offline),
        gpu_check_device=_flag(args, "gpu_check_device"),
        platforms=platform_flag(_flag(args, "platform")),
        dockerfile_frontend=_flag(args, "dockerfile_frontend"),
    )


__all__ = ["Options", "flag_values", "platform_flag", "recipe_versions", "resolve"]
