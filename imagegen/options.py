"""Options: what a command runs with, resolved once and in one place: command-line flags first, then
the project config file (imagegen.toml or [tool.imagegen] in pyproject.toml), then imagegen's
defaults (resources/defaults.yaml). Every command reads the one frozen Options; no other module
decides which of the three wins."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from imagegen.config import Config
from imagegen.plan import defaults


@dataclass(frozen=True)
class Options:
    config: Config
    flavor: str
    base_image: str | None
    torch_index_url: str | None
    registry: str | None
    out: Path  # where wheels go (the config's out, else wheelhouse)
    out_given: bool  # --out, or a config file that may set it (bake writes a relative path then)
    recipes: tuple[str, ...]  # named on the command line, else the config matrix's (empty: every recipe)
    torch: tuple[str, ...]  # the matrix: flags, else the config matrix, else the defaults
    cuda: tuple[str, ...]
    python: tuple[str, ...]
    archs: tuple[str, ...]  # arch lists, one per --arch (a matrix takes several)
    # One cell (render): what was given, else the config matrix's last entry (the newest listed),
    # else None (render chooses the newest combination that builds).
    torch_one: str | None
    cuda_one: str | None
    python_one: str | None
    arch_configured: str | None  # --arch, else the config's (None: the caller's own default applies)


def _flag(args: argparse.Namespace, name: str):
    return getattr(args, name, None)


def _many(value) -> tuple[str, ...]:
    if value is None:
        return ()
    return tuple(value) if isinstance(value, (list, tuple)) else (value,)


def _unique(values) -> tuple[str, ...]:
    return tuple(dict.fromkeys(values))


def resolve(args: argparse.Namespace, config: Config) -> Options:
    d = defaults()
    m = config.matrix
    torch, cuda, python, arch = (_many(_flag(args, k)) for k in ("torch", "cuda", "python", "arch"))
    out = _flag(args, "out")
    return Options(
        config=config,
        flavor=_flag(args, "flavor") or config.flavor or d["flavor"],
        base_image=_flag(args, "base_image") or config.base_image,
        torch_index_url=config.torch_index_url,
        registry=_flag(args, "registry") or config.registry,
        out=Path(out) if out else config.out,
        out_given=bool(out or config.path),
        recipes=tuple(_flag(args, "recipes") or ()) or tuple(m.recipes),
        torch=_unique(torch or m.torch or d["matrix"]["torch"]),
        cuda=_unique(cuda or m.cuda or d["matrix"]["cuda"]),
        python=_unique(python or m.python or d["matrix"]["python"]),
        archs=arch or ((m.arch,) if m.arch else (d["matrix"]["arch"],)),
        torch_one=(torch[0] if torch else None) or (m.torch[-1] if m.torch else None),
        cuda_one=(cuda[0] if cuda else None) or (m.cuda[-1] if m.cuda else None),
        python_one=(python[0] if python else None) or (m.python[-1] if m.python else None),
        arch_configured=(arch[0] if arch else None) or m.arch,
    )


__all__ = ["Options", "resolve"]
