"""``--prefill-chunk``: one chunk size for a command that serves, a comma list for ``dllm bench``."""

from __future__ import annotations

import argparse

CHUNK_WORDS = {"off": 0, "auto": None}  # off: the whole prompt at once; auto: the default from the budget


def _one_chunk(text: str) -> int | None:
    word = text.strip()
    if word in CHUNK_WORDS:
        return CHUNK_WORDS[word]
    try:
        value = int(word)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected tokens, off or auto; got {word!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0 tokens, got {value}")
    return value


def prefill_chunk_setting(text: str) -> int | None:
    """One chunk size: tokens, ``off`` (0) or ``auto`` (None, the default)."""
    return _one_chunk(text)


def prefill_chunk_settings(text: str) -> tuple[int | None, ...]:
    """Several chunk sizes (``off,512,256``): a benchmark runs every policy with each."""
    values = tuple(_one_chunk(part) for part in text.split(",") if part.strip())
    if not values:
        raise argparse.ArgumentTypeError(f"expected chunk sizes such as off,512; got {text!r}")
    if len(set(values)) < len(values):
        raise argparse.ArgumentTypeError(f"a chunk size is named twice in {text!r}")
    return values
