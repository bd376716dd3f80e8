"""What a value may look like before it reaches a Dockerfile or a shell.

imagegen never builds a shell command by pasting text: recipe values travel to the builder script
as JSON, and the Dockerfile only carries values that match one of these patterns (versions, image
references, URLs, names). A value with a newline, a quote, ``$`` or a backtick cannot match any of
them, so it can never become an extra Dockerfile instruction or shell command.
"""

from __future__ import annotations

import re

from imagegen.errors import UnsafeValueError

# Names and identifiers
RECIPE_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")
DIST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
# Environment values: printable ASCII without quotes, $, `, backslash or newline.
ENV_VALUE = re.compile(r"[A-Za-z0-9 _.,;:=+/@%^~{}()\[\]<>*!?#&|-]{0,512}")
VERSION_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")
PIP_REQUIREMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9_,-]+\])?([<>=!~]=?[A-Za-z0-9.*+-]+)?(,[<>=!~]=?[A-Za-z0-9.*+-]+)*")
SYSTEM_PACKAGE = re.compile(r"[a-z0-9][a-z0-9.+-]{0,99}")

# Sources
GIT_URL = re.compile(r"(https://|ssh://|git@)[A-Za-z0-9._~:/@%+-]+?(\.git)?")
GIT_REF = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,199}")
GIT_SHA = re.compile(r"[0-9a-f]{7,40}")
RELATIVE_PATH = re.compile(r"(?!/)(?!.*\.\.)[A-Za-z0-9._/-]{1,200}")
RELATIVE_PATH_OR_EMPTY = re.compile(r"|(?!/)(?!.*\.\.)[A-Za-z0-9._/-]{1,200}")
LOCAL_PATH = re.compile(r"[A-Za-z0-9._/~-]{1,400}")
URL = re.compile(r"https?://[A-Za-z0-9._~:/?#\[\]@!&()*+,;=%-]+")
URL_OR_EMPTY = re.compile(r"|https?://[A-Za-z0-9._~:/?#\[\]@!&()*+,;=%-]+")

# Images: [registry[:port]/]path[:tag][@sha256:digest]
IMAGE_REF = re.compile(
    r"(?:[a-z0-9.-]+(?::[0-9]{1,5})?/)?[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?"
)
# Dockerfile paths inside the image
IMAGE_PATH = re.compile(r"/[A-Za-z0-9._/-]{1,200}|python3(\.[0-9]{1,2})?|python")


HINTS = {
    IMAGE_REF.pattern: "an image reference like registry:5000/name:tag or name@sha256:<digest>",
    URL.pattern: "an http(s) URL without quotes, spaces or $",
    IMAGE_PATH.pattern: "an absolute path of letters, digits, '.', '_', '-' and '/'",
}


def check(value: str, pattern: re.Pattern[str], what: str) -> str:
    """Return ``value`` if it fully matches ``pattern``; otherwise raise a one-line error."""
    if not isinstance(value, str) or not pattern.fullmatch(value):
        shown = repr(value)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        hint = HINTS.get(pattern.pattern, f"it must match {pattern.pattern}")
        raise UnsafeValueError(f"{what} {shown} is not allowed: use {hint}")
    return value


def heredoc_delimiter(body: str, stem: str = "IMAGEGEN_EOF") -> str:
    """A heredoc terminator that no line of ``body`` equals, so the body cannot end it early."""
    lines = set(body.splitlines())
    delimiter, n = stem, 0
    while delimiter in lines:
        n += 1
        delimiter = f"{stem}_{n}"
    return delimiter
