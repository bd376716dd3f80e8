"""Typed errors. Each carries the exit code and a one-line, actionable message for the user.

The CLI turns any ImagegenError into ``imagegen: error: <message>`` on stderr and its exit code;
no known failure reaches the user as a traceback.
"""

from __future__ import annotations


class ImagegenError(Exception):
    """Base class: a failure the user can act on."""

    exit_code = 1

    def __init__(self, message: str) -> None:
        # Keep the message on one line whatever the caller passed in.
        super().__init__(" ".join(str(message).split()))

    @property
    def message(self) -> str:
        return str(self)


class UsageError(ImagegenError):
    """Bad command-line input (a flag's value, a missing argument)."""

    exit_code = 2


class ConfigError(ImagegenError):
    """A broken imagegen.toml / [tool.imagegen] section."""

    exit_code = 2


class RecipeError(ImagegenError):
    """A recipe file that does not load or validate, or an unknown recipe name."""

    exit_code = 2


class ArchError(ImagegenError):
    """A GPU architecture that cannot be parsed, or that a consumer cannot express."""

    exit_code = 2


class CompatError(ImagegenError):
    """An impossible torch / CUDA / Python / arch / base-image combination."""

    exit_code = 3


class NothingToDoError(ImagegenError):
    """Every requested cell was rejected."""

    exit_code = 3


class UnsafeValueError(ImagegenError):
    """A value that would reach a Dockerfile or a shell and is not safe there."""

    exit_code = 2


class EngineError(ImagegenError):
    """No usable container engine / buildx, or the engine refused a request."""

    exit_code = 4


class BuildError(ImagegenError):
    """A build ran and failed."""

    exit_code = 5
