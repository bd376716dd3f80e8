"""The one Jinja2 environment the generators render with: the templates in render/templates/.

All three (the Dockerfile, the Windows scripts, the GitHub workflow) render the same way: an undefined
name is an error, block tags leave no blank lines, a template's last newline is kept and nothing is
HTML-escaped. What differs is passed in: each output's own quoting filters and, for the Dockerfile, the
finalize hook that flattens every plain ``{{ }}``."""

from __future__ import annotations

from collections.abc import Callable

import jinja2

TEMPLATES = "templates"  # the folder of this package (render/) that holds the .j2 files


def environment(*, filters: dict[str, Callable[..., object]],
                finalize: Callable[[object], object] | None = None) -> jinja2.Environment:
    """An environment over render/templates/ with ``filters`` added (and ``finalize``, if given)."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("imagegen.render", TEMPLATES),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
        finalize=finalize,
    )
    env.filters.update(filters)
    return env
