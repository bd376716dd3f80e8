"""Typed errors. Each carries the exit code and a one-line, actionable message for the user.

The CLI turns any ImagegenError into ``imagegen: error: <message>`` on stderr and its exit code;
no known failure reaches the user as a traceback.
"""

from __future__ import annotations

import unicodedata


def printable(text: str) -> str:
    """``text`` with every control, format (bidi overrides, zero-width), separator and surrogate
    character written as an escape (``\\x1b``, ``\\u202e``), so that data quoted in a message can
    neither drive the terminal nor reorder what the user reads."""
    if text.isascii() and text.isprintable():
        return text
    return "".join(
        c.encode("unicode_escape", "backslashreplace").decode("ascii")
        if unicodedata.category(c) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp") else c
        for c in text
    )


def bounded(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, the cut marked with ``...``."""
    return text if len(text) <= limit else text[: max(limit - 3, 0)] + "..."


class ImagegenError(Exception):
    """Base class: a failure the user can act on. A kind names its exit code where it is declared:
    ``class ArchError(ImagegenError, exit_code=2)``; a kind without one keeps its parent's."""

    exit_code = 1
    # The longest message this kind of error prints (None: no limit).
    max_chars: int | None = None

    def __init_subclass__(cls, exit_code: int | None = None, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if exit_code is not None:
            cls.exit_code = exit_code

    def __init__(self, message: str) -> None:
        # Keep the message on one line whatever the caller passed in, with no raw control
        # characters, and within this kind's length.
        # No credential of a URL the message quotes is shown (safety.redact, before any cut, so that
        # half a token cannot survive either).
        from imagegen.safety import redact
        text = printable(redact(" ".join(str(message).split())))
        super().__init__(bounded(text, self.max_chars) if self.max_chars else text)

    @property
    def message(self) -> str:
        return str(self)


class UsageError(ImagegenError, exit_code=2):
    """Bad command-line input (a flag's value, a missing argument)."""


class ConfigError(ImagegenError, exit_code=2):
    """A broken imagegen.toml / [tool.imagegen] section."""


class RecipeError(ImagegenError, exit_code=2):
    """A recipe file that does not load or validate, or an unknown recipe name."""
    # "imagegen: error: " plus this stays under 400 characters, whatever a recipe file holds.
    max_chars = 380


class ArchError(ImagegenError, exit_code=2):
    """A GPU architecture that cannot be parsed, or that a consumer cannot express."""


class CompatError(ImagegenError, exit_code=3):
    """An impossible torch / CUDA / Python / arch / base-image combination."""


class NothingToDoError(ImagegenError, exit_code=3):
    """Every requested cell was rejected."""


class UnsafeValueError(ImagegenError, exit_code=2):
    """A value that would reach a Dockerfile or a shell and is not safe there."""


class EngineError(ImagegenError, exit_code=4):
    """No usable container engine / buildx, or the engine refused a request."""


class SetupError(EngineError, exit_code=4):
    """`imagegen setup` cannot set this machine up: not root, not a Debian or Ubuntu machine, or its
    script failed (it said why)."""


class BuildError(ImagegenError, exit_code=5):
    """A build ran and failed."""


class VerifyError(ImagegenError, exit_code=6):
    """A wheel lacks what was asked (an arch, an extension) or cannot be read as a wheel."""


class BuildRecordError(VerifyError, exit_code=6):
    """A builder's record beside a wheel that cannot be taken (unreadable, another wheel's, no smoke
    test): that wheel stays out of the wheelhouse (imagegen.wheelhouse.records)."""


class GpuCheckError(VerifyError, exit_code=6):
    """The recipe's GPU check ran and failed."""


class RegistryError(ImagegenError, exit_code=7):
    """A registry refused or could not be reached, or an image is missing."""


class LockFileError(RegistryError):
    """A lock file that is not one (binary, not JSON, wrong schema, not a regular file): exit 7 like
    every registry/lock failure."""


class ImageMissing(RegistryError):
    """The registry answered: no such image (the one failure `pull` may fall back from)."""


class NoPlatformImage(RegistryError):
    """The image exists, but not for the platform asked for (an amd64-only base for an arm64 cell)."""


class NoGpuError(ImagegenError, exit_code=8):
    """The interpreter has no torch, or torch sees no CUDA GPU: the check cannot run here."""


class PublishError(ImagegenError, exit_code=9):
    """The last mile failed: an index that cannot be written, a wheel auditwheel cannot repair, an
    upload refused (bad credentials, a different file already there under the same name)."""


class NoVariant(PublishError, exit_code=9):
    """Why a wheel gets no variant in the index (imagegen.publish.variants): said as a warning, and
    the wheel is listed as it is."""


class RefusedError(ImagegenError, exit_code=10):
    """A cell imagegen would not build, or whose wheel it would not place, because that would lose
    something: a wheel of the wheelhouse built for other archs is in the way (same file name; found
    before the build, or when the wheel was placed because another build placed one meanwhile), or
    the builder cannot run the cell's platform. Nothing was replaced; not a failed build (exit 5):
    the fix is a flag (--out, --force) or the builder."""


class NotReusableError(ImagegenError, exit_code=11):
    """A wheel built for one torch that `imagegen reuse` found unusable with another: a symbol the
    target torch does not export, a torch library it lacks, a failed import or GPU check, a torch pin or
    Python tag of another release. Nothing was placed; the fix is a rebuild for that torch."""
    max_chars = 700


# Internal signals, never shown as they are: each caller turns them into a user error or a plan reason.


class NoBaseImage(Exception):
    """Internal: no catalogue image fits; the message is a plan reason."""


class BakeFailed(Exception):
    """Internal: a bake ran and some target failed; ``stderr`` is buildx's (it names the failed
    targets, which the caller turns into failed cells)."""

    def __init__(self, stderr: str) -> None:
        super().__init__(stderr[-400:])
        self.stderr = stderr


class Unreadable(Exception):
    """Internal: a file imagegen was asked to read is not a readable regular file; the message says
    why in a few words, and the caller names the file and raises its own error type."""


class Unreachable(Unreadable):
    """Internal: a server could not be reached or the connection failed (imagegen.untrusted.http_get),
    as opposed to an answer that was refused."""


class HTTPStatusError(Unreadable):
    """Internal: a server answered with an HTTP error status, ``code`` (imagegen.untrusted.http_get)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class Stopped(KeyboardInterrupt):
    """imagegen got SIGINT/SIGTERM/SIGHUP: handled like Ctrl-C (exit 130, "interrupted")."""


class BakeReadError(Exception):
    """imagegen cannot read this bake file itself (buildx may): render.bake_read's signal to its caller, which
    turns it into a one-line error or asks buildx; never shown as it is."""
