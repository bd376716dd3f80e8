"""Tests for imagegen.errors: every error kind's exit code (declared or inherited), one-line escaped and
bounded messages, printable() and bounded(), and the internal signals (BakeFailed, Unreadable, Stopped)."""

from __future__ import annotations

import pytest

from imagegen import errors
from imagegen.errors import (
    ArchError,
    BakeFailed,
    BuildError,
    CompatError,
    ConfigError,
    EngineError,
    GpuCheckError,
    ImagegenError,
    ImageMissing,
    LockFileError,
    NoGpuError,
    NothingToDoError,
    RecipeError,
    RegistryError,
    Stopped,
    Unreadable,
    UnsafeValueError,
    UsageError,
    VerifyError,
    bounded,
    printable,
)

EXIT_CODES = {
    "ImagegenError": 1, "UsageError": 2, "ConfigError": 2, "RecipeError": 2, "ArchError": 2, "UnsafeValueError": 2,
    "CompatError": 3, "NothingToDoError": 3, "EngineError": 4, "BuildError": 5, "VerifyError": 6,
    "GpuCheckError": 6, "RegistryError": 7, "LockFileError": 7, "ImageMissing": 7, "NoPlatformImage": 7, "NoGpuError": 8,
    "PublishError": 9, "BuildRecordError": 6, "NoVariant": 9, "RefusedError": 10, "SetupError": 4,
    "NotReusableError": 11,
}


def test_every_error_kind_has_its_documented_exit_code():
    kinds = {name: obj for name, obj in vars(errors).items()
             if isinstance(obj, type) and issubclass(obj, ImagegenError)}
    assert set(kinds) == set(EXIT_CODES)
    for name, kind in kinds.items():
        assert kind.exit_code == EXIT_CODES[name], name
        assert kind("x").exit_code == EXIT_CODES[name], name  # the instance answers the same


def test_the_kinds_that_callers_catch_together_share_a_parent():
    # pull falls back on ImageMissing but stops on any other RegistryError; a lock-file failure is a registry failure.
    assert issubclass(ImageMissing, RegistryError) and issubclass(LockFileError, RegistryError)
    assert issubclass(GpuCheckError, VerifyError)
    for kind in (UsageError, ConfigError, RecipeError, ArchError, CompatError, NothingToDoError, UnsafeValueError,
                 EngineError, BuildError, VerifyError, NoGpuError, RegistryError):
        assert issubclass(kind, ImagegenError) and issubclass(kind, Exception)
    # The internal signals are never shown as they are: not ImagegenErrors, so the CLI cannot print them as one.
    for internal in (BakeFailed, Unreadable, errors.NoBaseImage):
        assert not issubclass(internal, ImagegenError)


def test_a_new_kind_declares_or_inherits_its_exit_code():
    class Declared(RegistryError, exit_code=9):
        pass

    class Inherited(Declared):
        pass

    assert Declared.exit_code == 9 and Inherited.exit_code == 9 and Inherited("x").exit_code == 9
    assert RegistryError.exit_code == 7 and ImagegenError.exit_code == 1  # the parents are untouched


def test_a_message_is_one_line_whatever_the_caller_passed():
    err = UsageError("first line\nsecond\tline\r\n   third  ")
    assert str(err) == "first line second line third" and err.message == str(err)
    assert str(ConfigError("")) == ""


def test_a_message_carries_no_raw_control_or_bidi_character():
    text = "a\x1b[31mred\x07 \u202eevil\u2066 \u2028x\ud800 \ue000 \x00end"
    for kind in (ImagegenError, UsageError, RecipeError, EngineError):
        shown = str(kind(text))
        assert shown.isprintable() and shown.isascii(), ascii(shown)
        for escape in ("\\x1b", "\\x07", "\\u202e", "\\u2066", "\\ud800", "\\ue000", "\\x00"):
            assert escape in shown, (escape, shown)
        assert "\u2028" not in shown  # a line separator is whitespace: the message is joined on one line


def test_only_recipe_errors_are_bounded_and_the_cut_is_marked():
    long = "word " * 10_000
    recipe = str(RecipeError(long))
    assert len(recipe) == RecipeError.max_chars == 380 and recipe.endswith("...")
    assert len(str(UsageError(long))) == len(long.strip())  # no limit for the others
    exact = "y" * 380
    assert str(RecipeError(exact)) == exact  # at the limit: nothing is cut


def test_printable_keeps_readable_text_and_escapes_only_what_could_hide_or_drive():
    for kept in ("plain ascii", "é, ß, 日本語, →, emoji 🙂", "tab-free line with 'quotes' and \"doubles\""):
        assert printable(kept) == kept
    assert printable("a\tb\nc") == "a\\tb\\nc"  # Cc: tab and newline too
    assert printable("zero\u200bwidth") == "zero\\u200bwidth"  # Cf
    assert printable("x\u0085y") == "x\\x85y"  # NEL, a C1 control
    assert printable("\U000e0001tag") == "\\U000e0001tag"  # a tag character (Cf) outside the BMP
    assert printable("\u0378") == "\\u0378"  # unassigned (Cn)
    assert printable("a\u2028b\u2029c") == "a\\u2028b\\u2029c"  # line and paragraph separators (Zl, Zp)


@pytest.mark.parametrize("text, limit, expected", [
    ("short", 10, "short"),
    ("exactly10!", 10, "exactly10!"),
    ("eleven chars", 10, "eleven ..."),
    ("abcdef", 3, "..."),
])
def test_bounded(text, limit, expected):
    assert bounded(text, limit) == expected


def test_bake_failed_keeps_the_whole_stderr_and_a_short_message():
    stderr = "line\n" * 1000 + 'ERROR: target "sage-1" failed'
    exc = BakeFailed(stderr)
    assert exc.stderr == stderr and len(str(exc)) == 400 and str(exc).endswith('target "sage-1" failed')


def test_stopped_is_handled_like_ctrl_c():
    exc = Stopped("SIGTERM")
    assert isinstance(exc, KeyboardInterrupt) and not isinstance(exc, Exception) and str(exc) == "SIGTERM"
    with pytest.raises(KeyboardInterrupt):
        raise exc
