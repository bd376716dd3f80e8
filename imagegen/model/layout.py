"""The wheelhouse layout: the folder a cell's wheels land in below the output folder, as a template
(default ``{package}-{version}/torch{torch}/{cuda}``; a team's flash-attn matrix keeps ``fa{version}/torch{torch}/{cuda}``).
``.`` (or an empty layout) is flat: every wheel directly in the output folder, beside its one manifest.json, as an
RTX 5090 user's ``sage-wheels/*.whl`` are (wheel names differ by their local version, ``+cu128torch2.8``)."""

from __future__ import annotations

import re
import string

from imagegen.errors import UsageError

DEFAULT_LAYOUT = "{package}-{version}/torch{torch}/{cuda}"
FLAT = "."  # wheels directly in the output folder
LAYOUT_FIELDS = ("package", "short", "version", "torch", "cuda", "python", "py")
# How many folders deep a layout may go: as deep as every reader of a wheelhouse walks (`index`,
# `publish`, `collect`, `build`'s up-to-date check: imagegen.wheelhouse.manifest.MAX_WALK_DEPTH is this one
# constant), so that a wheel a build places is one they find.
MAX_LAYOUT_DEPTH = 8


def validate_layout(template: str, what: str = "--layout") -> str:
    """A wheelhouse layout: a relative folder template of {package} {short} {version} {torch} {cuda}
    {python} {py} and [A-Za-z0-9._-/] (a team's flash-attn matrix's fa{version}/torch{torch}/{cuda}), at most
    MAX_LAYOUT_DEPTH folders deep. Refused otherwise. The one check of a layout, whichever command
    or config file gives it (imagegen.plan.options, imagegen.plan.config). ``.`` and ``""`` are the flat
    layout, returned as FLAT (``out / "."`` is ``out``)."""
    if template in ("", FLAT):
        return FLAT
    hint = f"fields: {', '.join('{' + f + '}' for f in LAYOUT_FIELDS)}; e.g. fa{{version}}/torch{{torch}}/{{cuda}}"
    if not isinstance(template, str) or not 1 <= len(template) <= 200 \
            or not re.fullmatch(r"[A-Za-z0-9._/{}-]+", template):
        raise UsageError(f"{what} {template!r}: use letters, digits, . _ - / and {{fields}} ({hint})")
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError:
        raise UsageError(f"{what} {template!r}: unbalanced braces ({hint})") from None
    fields = [f for _, f, spec, conv in parsed if f is not None or spec or conv]
    bad = [f for f in fields if f not in LAYOUT_FIELDS]
    if bad:
        raise UsageError(f"{what} {template!r}: unknown field {{{bad[0]}}} ({hint})")
    if any("{" in literal or "}" in literal for literal, *_ in parsed):
        # {{ and }} stand for a brace in a folder name, which no output folder may have.
        raise UsageError(f"{what} {template!r}: a brace belongs to a {{field}} only, not to a folder name ({hint})")
    parts = template.split("/")
    if template.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise UsageError(f"{what} {template!r}: a relative folder below the output folder (no /, . or .. parts;"
                         " '.' alone is flat: the wheels directly in the output folder)")
    if len(parts) > MAX_LAYOUT_DEPTH:
        raise UsageError(f"{what} {template!r}: {len(parts)} folders deep, deeper than the {MAX_LAYOUT_DEPTH} that"
                         " index, publish and collect look into: the wheels would be built, then never found")
    return template
