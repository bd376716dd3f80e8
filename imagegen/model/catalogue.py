"""The catalogue: the built-in recipes plus the user's recipe directories."""

from __future__ import annotations

import functools
import os
import re
import stat
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from imagegen import safety
from imagegen.errors import RecipeError
from imagegen.model.recipe_file import load_recipe_file
from imagegen.model.recipe_reader import quoted, shown_path
from imagegen.model.recipes import Recipe


def builtin_recipe_dir() -> Path:
    return Path(str(resources.files("imagegen") / "resources" / "recipes"))


@dataclass
class Catalogue:
    """All recipes known to this run: the built-in ones plus the user's directories."""

    recipes: dict[str, Recipe] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)

    def add(self, recipe: Recipe) -> None:
        # A user recipe with a built-in's name replaces it (that is how users patch a recipe).
        self.recipes[recipe.name] = recipe
        for alias in recipe.aliases:
            self.aliases[alias] = recipe.name

    def by_distribution(self, distribution: str) -> Recipe | None:
        """The recipe that builds ``distribution`` (a local tree's project name: flash_attn, causal-conv1d)."""
        key = re.sub(r"[-_.]+", "-", distribution).lower()
        for recipe in self.recipes.values():
            if recipe.source_kind == "git" and key in {re.sub(r"[-_.]+", "-", n).lower()
                                                       for n in (recipe.distribution, recipe.name)}:
                return recipe
        return None

    def names(self) -> list[str]:
        return sorted(self.recipes)

    def get(self, name: str) -> Recipe:
        key = name.strip().lower().replace("_", "-")
        # A name wins over an alias: a user's recipe called "sage" is reachable by that name.
        key = key if key in self.recipes else self.aliases.get(key, key)
        if key in self.recipes:
            return self.recipes[key]
        names = self.names()
        # At most 20 names and about 160 characters of them, so the hint after them is never cut off.
        shown: list[str] = []
        for n in names[:20]:
            if shown and len(", ".join([*shown, n])) > 160:
                break
            shown.append(n)
        rest = len(names) - len(shown)
        known = ", ".join(shown) + (f" and {rest} more (imagegen recipes lists them)" if rest else "")
        raise RecipeError(
            f"unknown recipe {quoted(name)}: known recipes are {known}"
            " (or give a path to a local project, or add a recipe directory with --recipe-dir)"
        )


def load_catalogue(extra_dirs: tuple[Path, ...] = ()) -> Catalogue:
    cat = Catalogue()
    for recipe in _builtin_recipes():
        cat.add(recipe)
    for d in extra_dirs:
        for path in _recipe_files(d):
            cat.add(load_recipe_file(path))
    return cat


def _recipe_files(d: Path) -> list[Path]:
    """The ``*.yaml`` / ``*.yml`` files of a recipe directory; any problem with the directory itself
    (missing, not a directory, unreadable, a name the OS refuses) is a one-line RecipeError."""
    shown = shown_path(d)
    try:
        st = d.stat()
        if not stat.S_ISDIR(st.st_mode):
            raise RecipeError(f"recipe directory {shown} is not a directory")
        names = sorted(os.listdir(d))
    except FileNotFoundError:
        raise RecipeError(f"recipe directory {shown} does not exist") from None
    except (OSError, ValueError) as exc:
        reason = safety.os_reason(exc) if isinstance(exc, OSError) else "not a usable path"
        raise RecipeError(f"recipe directory {shown}: {reason}") from None
    return [d / n for n in names if n.endswith(".yaml")] + [d / n for n in names if n.endswith(".yml")]


@functools.cache
def _builtin_recipes() -> tuple[Recipe, ...]:
    return tuple(load_recipe_file(p) for p in sorted(builtin_recipe_dir().glob("*.yaml")))
