"""Parsing what users write for GPU archs: 12.0+PTX, 8.0;9.0, sm_90a, compute_120, 90-real, Hopper, H100,
RTX 5090 ... mixed freely, into one ArchList; every refusal one line that says what to write."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import replace

from imagegen.errors import ArchError
from imagegen.model.arch import (
    FORMS_HINT,
    MAX_INPUT_CHARS,
    ArchList,
    CudaArch,
    arch_from_notation,
    normalise_gpu,
    quote,
)
from imagegen.model.arch_data import arch_error, arch_table

# Separators users mix freely: torch uses ';' and spaces, SageAttention also ',' (§3.3).
_LIST_SEP = re.compile(r"[;,]")


_WORD_SEP = re.compile(r"[ \t\r\n]+")


# Everything a valid token can contain; anything else (control characters, quotes, unicode
# look-alike digits) is refused before any lookup.
_TOKEN_CHARS = re.compile(r"[A-Za-z0-9._+\-]+")


# Product names may be typed with spaces ("RTX PRO 6000"): try joining up to this many words.
_MAX_GPU_WORDS = 3


def _split_tokens(text: str) -> list[str]:
    """Split on any mix of separators, re-joining space-separated words of a product name."""
    data = arch_table()
    tokens: list[str] = []
    for chunk in _LIST_SEP.split(text):
        words = [word for word in _WORD_SEP.split(chunk) if word]
        for word in words:
            if not _TOKEN_CHARS.fullmatch(word):
                raise ArchError(f"unknown GPU architecture {quote(word)}: {FORMS_HINT}")
        i = 0
        while i < len(words):
            n = _gpu_words_at(words, i, data.gpus)
            tokens.append(" ".join(words[i : i + n]))
            i += n
    return tokens


def _gpu_words_at(words: list[str], i: int, gpus: Mapping[str, CudaArch]) -> int:
    """How many words from ``words[i]`` form one token: >1 only for a spaced product name."""
    # Join only when the first word means nothing alone ("RTX"), so that "50 90" stays
    # 5.0;9.0 and does not become an RTX 5090.
    if _is_token(words[i]):
        return 1
    for n in range(min(_MAX_GPU_WORDS, len(words) - i), 1, -1):
        joined = "".join(words[i : i + n])
        if joined.lower().endswith("+ptx"):  # "RTX 5090+PTX": the suffix belongs to the whole name
            joined = joined[: -len("+ptx")]
        if normalise_gpu(joined) in gpus:
            return n
    return 1


def _is_token(word: str) -> bool:
    try:
        _resolve_token(word)
    except ArchError:
        return False
    return True


def _resolve_token(token: str) -> tuple[CudaArch, ...]:
    data = arch_table()
    low = token.lower()
    if low in data.named:
        return data.named[low]
    plus_ptx = low.endswith("+ptx")
    gpu = data.gpus.get(normalise_gpu(low[: -len("+ptx")] if plus_ptx else low))
    if gpu is not None:
        return (replace(gpu, ptx=plus_ptx),)
    arch = arch_from_notation(low)
    if arch is None:
        raise ArchError(f"unknown GPU architecture {quote(token)}: {FORMS_HINT}")
    problem = arch_error(arch, token, data.infos)
    if problem is not None:
        raise ArchError(problem)
    return (arch,)


def parse_arch_list(text: str | Iterable[str]) -> ArchList:
    """Parse any notation users write into one merged, sorted :class:`ArchList`.

    Accepts ``12.0+PTX``, ``12.0``, ``120``, ``sm_120``, ``sm_90a``, ``compute_120`` (PTX only),
    ``10.0f``, ``100f``, ``90a``, CMake ``90a-real``/``120-virtual``, generation names
    (``Hopper``) and product names (``H100``, ``RTX 5090``), separated by any mix of spaces,
    ``;`` and ``,``. Raises only :class:`ArchError`, whatever the input.
    """
    if isinstance(text, str):
        joined = text
    else:
        try:
            items = list(text)
        except TypeError:
            raise ArchError(
                f"a GPU architecture list must be text, not {type(text).__name__}"
            ) from None
        if not all(isinstance(item, str) for item in items):
            raise ArchError("a GPU architecture list must contain only strings")
        joined = ";".join(items)
    if len(joined) > MAX_INPUT_CHARS:
        raise ArchError(
            f"the GPU architecture list is too long ({len(joined)} characters, "
            f"at most {MAX_INPUT_CHARS})"
        )
    tokens = _split_tokens(joined)
    if not tokens:
        raise ArchError(f"the GPU architecture list is empty: {FORMS_HINT}")
    return ArchList(arch for token in tokens for arch in _resolve_token(token))


def as_arch_list(archs: ArchList | str | Iterable[CudaArch] | Iterable[str]) -> ArchList:
    """Let every public function take a parsed list, raw text, or loose entries."""
    if isinstance(archs, ArchList):
        result = archs
    elif isinstance(archs, str):
        result = parse_arch_list(archs)
    else:
        items = list(archs)
        if items and all(isinstance(item, str) for item in items):
            result = parse_arch_list(items)  # type: ignore[arg-type]
        else:
            result = ArchList(items)  # type: ignore[arg-type]
    if not result:
        raise ArchError(f"the GPU architecture list is empty: {FORMS_HINT}")
    return result
