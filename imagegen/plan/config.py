"""Project configuration: ``[tool.imagegen]`` in pyproject.toml, or an ``imagegen.toml``.

Example::

    [tool.imagegen]
    out = "wheelhouse"
    registry = "ghcr.io/myteam"      # the team's builder images: imagegen push / pull / lock, ci github --push-builders
    recipe-dirs = ["recipes"]
    flavor = "runpod"

    [tool.imagegen.matrix]
    recipes = ["sage", "flash-attn"]
    torch = ["2.8", "2.9"]
    cuda = ["12.8"]
    python = ["3.12"]
    arch = "8.0;9.0;12.0+PTX"

Command-line flags win over the file; the file wins over built-in defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from imagegen import safety
from imagegen.errors import ConfigError, ImagegenError, UsageError
from imagegen.model import compat
from imagegen.model.base_images import container_flavors
from imagegen.model.layout import validate_layout
from imagegen.plan.registry import REGISTRY

MAX_CONFIG_BYTES = safety.MAX_TOML_BYTES


@dataclass(frozen=True)
class Matrix:
    recipes: tuple[str, ...] = ()
    torch: tuple[str, ...] = ()
    cuda: tuple[str, ...] = ()
    python: tuple[str, ...] = ()
    arch: str | None = None


DEFAULT_OUT = "wheelhouse"  # where wheels go when neither --out nor a config file says


@dataclass(frozen=True)
class Config:
    path: Path | None = None
    out: Path = Path(DEFAULT_OUT)
    registry: str | None = None
    flavor: str | None = None
    base_image: str | dict[str, str] | None = None  # one image, or per CUDA variant {cuXYZ: image}
    recipe_dirs: tuple[Path, ...] = ()
    torch_index_url: str | None = None
    matrix: Matrix = field(default_factory=Matrix)
    layout: str | None = None  # the wheelhouse layout (imagegen.model.layout)
    offline: bool = False  # build steps without a network (imagegen.plan.matrix.with_offline)


def _list(where: str, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return (str(value),)
    if isinstance(value, list) and all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in value):
        return tuple(str(v) for v in value)
    raise ConfigError(f"{where}: expected a string or a list of strings, got {value!r}")


def _section(path: Path) -> dict[str, Any] | None:
    data = safety.read_toml(path)
    if path.name == "pyproject.toml":
        return data.get("tool", {}).get("imagegen")
    return data.get("tool", {}).get("imagegen", data)


def find_config(start: Path) -> Path | None:
    """The nearest imagegen.toml, or pyproject.toml with a [tool.imagegen] table, from ``start`` up."""
    start = start.resolve()
    for d in (start, *start.parents):
        for name in ("imagegen.toml", "pyproject.toml"):
            p = d / name
            if p.is_file() and (name == "imagegen.toml" or _section(p) is not None):
                return p
    return None


def load_config(path: Path | None = None, *, search_from: Path | None = None) -> Config:
    """Load the project config; with no file, the defaults."""
    if path is None and search_from is not None:
        path = find_config(search_from)
    if path is None:
        return Config()
    try:
        is_file = path.is_file()
    except OSError as exc:  # a name too long, a loop
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if not is_file:
        raise ConfigError(f"{path}: {'not a regular file' if path.exists() else 'no such config file'}")
    section = _section(path)
    if section is None:
        return Config(path=path)
    if not isinstance(section, dict):
        raise ConfigError(f"{path}: [tool.imagegen] must be a table")
    where = f"{path}: tool.imagegen"
    known = {"out", "layout", "registry", "flavor", "base-image", "recipe-dirs", "torch-index-url", "matrix", "offline"}
    for key in section:
        if key not in known:
            raise ConfigError(f"{where}.{key}: unknown key (known: {', '.join(sorted(known))})")
    flavor = section.get("flavor")
    if flavor is not None and flavor not in container_flavors():
        raise ConfigError(f"{where}.flavor: {flavor!r} is not one of {', '.join(container_flavors())}")
    base = section.get("base-image")
    if isinstance(base, dict):  # per CUDA version: {"12.8" = "IMAGE", "13.0" = ["PRIMARY", "FALLBACK"]}
        try:
            base = {compat.cuda_variant(str(k)).name: v for k, v in base.items()}
        except ImagegenError as exc:
            raise ConfigError(f"{where}.base-image: {exc}") from None
    for key, value in (base.items() if isinstance(base, dict) else [("*", base)] if base is not None else []):
        # A list is the primary image and its fallbacks, tried in order (one string "A,B" inside imagegen).
        images = value if isinstance(value, list) and value else [value]
        for image in images:
            if not isinstance(image, str) or not safety.IMAGE_REF.fullmatch(image):
                raise ConfigError(f"{where}.base-image: {image!r} is not an image reference")
        if isinstance(base, dict):
            base[key] = ",".join(images)
        else:
            base = ",".join(images)
    registry = section.get("registry")  # where the team's builder images are: push, pull, lock, ci github
    if registry is not None and (not isinstance(registry, str) or not REGISTRY.fullmatch(registry)):
        shown = repr(safety.redact(registry) if isinstance(registry, str) else registry)
        raise ConfigError(f"{where}.registry: {shown:.120} is not a registry/namespace like ghcr.io/myteam or"
                          " 127.0.0.1:5000/ml (HOST[:PORT]/NAMESPACE, lower case)")
    index = section.get("torch-index-url")
    if index is not None and (not isinstance(index, str) or not safety.URL.fullmatch(index)):
        raise ConfigError(f"{where}.torch-index-url: {index!r} is not an http(s) URL")
    if index is not None and safety.has_credentials(index):
        raise ConfigError(f"{where}.torch-index-url: {safety.describe(index)} carries a credential, which every"
                          f" Dockerfile and builder image would carry: {safety.NETRC_INSTEAD}")
    out = section.get("out", DEFAULT_OUT)
    if not isinstance(out, str) or not out or not out.isprintable():
        raise ConfigError(f"{where}.out: expected a folder's path (a string, not empty, without control characters)")
    layout = section.get("layout")
    if layout is not None:
        try:
            layout = validate_layout(layout, f"{where}.layout")  # "" and "." are FLAT
        except UsageError as exc:
            raise ConfigError(str(exc)) from None
    offline = section.get("offline", False)
    if not isinstance(offline, bool):
        raise ConfigError(f"{where}.offline: expected true or false")
    m = section.get("matrix", {})
    if not isinstance(m, dict):
        raise ConfigError(f"{where}.matrix: must be a table")
    for key in m:
        if key not in ("recipes", "torch", "cuda", "python", "arch"):
            raise ConfigError(f"{where}.matrix.{key}: unknown key (known: arch, cuda, python, recipes, torch)")
    arch = m.get("arch")
    if isinstance(arch, list):
        arch = ";".join(str(a) for a in arch)
    if arch is not None and not isinstance(arch, str):
        raise ConfigError(f"{where}.matrix.arch: expected a string like '8.0;9.0+PTX'")
    base_dir = path.parent
    return Config(
        path=path,
        out=(base_dir / out),
        layout=layout,
        offline=offline,
        registry=registry,
        flavor=flavor,
        base_image=base,
        recipe_dirs=tuple(base_dir / d for d in _list(f"{where}.recipe-dirs", section.get("recipe-dirs"))),
        torch_index_url=index,
        matrix=Matrix(
            recipes=_list(f"{where}.matrix.recipes", m.get("recipes")),
            torch=_list(f"{where}.matrix.torch", m.get("torch")),
            cuda=_list(f"{where}.matrix.cuda", m.get("cuda")),
            python=_list(f"{where}.matrix.python", m.get("python")),
            arch=arch,
        ),
    )
