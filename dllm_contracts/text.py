"""Token-level helpers shared by every entry point: cut at EOS, count completion tokens, decode."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


def cut_at_eos(token_ids: Sequence[int], eos_ids: Iterable[int]) -> list[int]:
    """Tokens before the first EOS."""
    eos = set(eos_ids)
    for index, token in enumerate(token_ids):
        if token in eos:
            return list(token_ids[:index])
    return list(token_ids)


def within_limit(
    token_ids: Sequence[int], max_tokens: int, eos_ids: Iterable[int], ignore_eos: bool = False
) -> tuple[list[int], str]:
    """What a client gets of a finished generation and why it ended: at most ``max_tokens`` tokens (whole
    blocks overshoot the limit), "stop" when an EOS came within them, else "length"."""
    kept = list(token_ids[:max_tokens])
    eos = set(eos_ids)
    return kept, "stop" if not ignore_eos and any(t in eos for t in kept) else "length"


def completion_tokens(token_ids: Sequence[int], eos_ids: Iterable[int]) -> int:
    """Generated tokens up to and including the first EOS (all of them when there is none)."""
    kept = len(cut_at_eos(token_ids, eos_ids))
    return min(kept + 1, len(token_ids))


def decode_completion(tokenizer: Any, token_ids: Sequence[int], eos_ids: Iterable[int], mask_id: int) -> str:
    """Text of the tokens before the first EOS, leaving out masks left by a capped block."""
    kept = [t for t in cut_at_eos(token_ids, eos_ids) if t != mask_id]
    if tokenizer is None:
        return " ".join(str(t) for t in kept)
    return tokenizer.decode(kept, skip_special_tokens=True)
