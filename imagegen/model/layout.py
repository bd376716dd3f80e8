"""The wheelhouse layout: the folder a cell's wheels land in below the output folder, as a template
(default ``{package}-{version}/torch{torch}/{cuda}``; seed 001's team keeps ``fa{version}/torch{torch}/{cuda}``)."""

from __future__ import annotations

import re
import string

from imagegen.errors import UsageError

DEFAULT_LAYOUT = "{package}-{version}/torch{torch}/{cuda}"
LAYOUT_FIELDS = ("package", "short", "version", "torch", "cuda", "python", "py")


def check_layout(template: str, what: str = "--layout") -> str:
    """A wheelhouse layout: a relative folder template of {package} {short} {version} {torch} {cuda}
    {python} {py} and [A-Za-z0-9._-/] (seed 001's fa{version}/torch{torch}/{cuda}). Refused otherwise."""
    hint = f"fields: {', '.join('{' + f + '}' for f in LAYOUT_FIELDS)}; e.g. fa{{version}}/torch{{torch}}/{{cuda}}"
    if not isinstance(template, str) or not 1 <= len(template) <= 200 \
            or not re.fullmatch(r"[A-Za-z0-9._/{}-]+", template):
        raise UsageError(f"{what} {template!r}: use letters, digits, . _ - / and {{fields}} ({hint})")
    try:
        fields = [f for _, f, spec, conv in string.Formatter().parse(template) if f is not None or spec or conv]
    except ValueError:
        raise UsageError(f"{what} {template!r}: unbalanced braces ({hint})") from None
    bad = [f for f in fields if f not in LAYOUT_FIELDS]
    if bad:
        raise UsageError(f"{what} {template!r}: unknown field {{{bad[0]}}} ({hint})")
    parts = template.split("/")
    if template.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise UsageError(f"{what} {template!r}: a relative folder below the output folder (no /, . or .. parts)")
    return template
