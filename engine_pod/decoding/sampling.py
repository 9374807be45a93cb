"""Seeded sampling of proposals that batching cannot change.

Gumbel-max over the tempered, top-k/top-p filtered logits draws from softmax(logits / T) restricted to
the kept tokens (what LLaDA's ``add_gumbel_noise`` and Dream's ``sample_tokens`` draw from). The uniform
noise is not drawn from a stream: it is a hash of (seed, absolute position, step within the block,
vocabulary entry), so it is the same whichever rows share the batch and wherever the row sits. The
confidence that orders commits is the drawn token's probability under the same distribution.
"""

from __future__ import annotations

import torch

_MASK32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B9


def _mix(h: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's 32-bit finaliser on int64 tensors holding values in [0, 2**32)."""
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & _MASK32
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & _MASK32
    return h ^ (h >> 16)


def uniform_noise(keys: torch.Tensor, vocab: int, dtype: torch.dtype) -> torch.Tensor:
    """[n, vocab] numbers in (0, 1), a pure function of each row's key and the vocabulary index."""
    entries = (torch.arange(vocab, device=keys.device, dtype=torch.int64) * _GOLDEN) & _MASK32
    bits = _mix(_mix(keys[:, None] ^ entries[None, :]) ^ (keys[:, None] >> 7))
    return (bits.to(torch.float64) + 0.5).div(2.0**32).to(dtype)


def draw_keys(seeds: torch.Tensor, positions: torch.Tensor, step: int) -> torch.Tensor:
    """One 32-bit key per candidate from its request's seed, its absolute position and the step."""
    low, high = seeds & _MASK32, (seeds >> 32) & _MASK32
    key = _mix(_mix(low) ^ high)
    key = _mix(key ^ (positions & _MASK32))
    return _mix(key ^ (step & _MASK32))


def _filtered(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, filters: bool) -> torch.Tensor:
    """Logits with everything outside each row's top-k and top-p nucleus at -inf (``filters``: whether any
    row keeps less than every token, which the host knows)."""
    if not filters:
        return logits
    ordered, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(logits.shape[-1], device=logits.device)[None, :]
    drop = (top_k[:, None] > 0) & (ranks >= top_k[:, None])
    probs = torch.softmax(ordered, dim=-1)
    before = probs.cumsum(dim=-1) - probs  # probability of the tokens ranked above each one
    drop |= before >= top_p[:, None]  # the nucleus: keep tokens until top_p is reached (the first always)
    dropped = torch.zeros_like(drop).scatter(-1, order, drop)
    return logits.masked_fill(dropped, float("-inf"))


def distribution_logits(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    never: int | None = None,
    filters: bool = True,
) -> torch.Tensor:
    """The logits of the distribution a sampled row draws from: ``never`` (the mask token: a random or
    undertrained model may rank it high) excluded, tempered, then top-k/top-p filtered."""
    if never is not None:
        logits = logits.clone()
        logits[:, never] = float("-inf")
    return _filtered(logits / temperature[:, None], top_k, top_p, filters)


def sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    keys: torch.Tensor,
    never: int | None = None,
    filters: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of ``logits`` [n, V] (in the scores' dtype): the drawn token and its probability; ``never``: a
    token no row draws; ``filters``: whether any row filters by top-k or top-p."""
    tempered = distribution_logits(logits, temperature, top_k, top_p, never, filters)
    noise = uniform_noise(keys, logits.shape[-1], logits.dtype)
    gumbel = -torch.log(-torch.log(noise))
    proposal = (tempered + gumbel).argmax(dim=-1)
    confidence = torch.softmax(tempered, dim=-1).gather(-1, proposal[:, None])[:, 0]
    return proposal, confidence
