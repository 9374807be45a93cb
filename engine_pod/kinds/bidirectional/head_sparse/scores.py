"""What a head attends to at a refresh, and which positions it keeps (vectorised over rows and heads).

Score: the mean, over the refresh's scoring queries of a row (its active block's positions; at the last
layer, the block positions whose logits are computed, the only queries a reuse step's last layer has), of
the attention probabilities to each of the row's keys, per K/V head (its query heads' probabilities
summed). Cross-step consistency: where the request had a refresh before, a head compares its new scores
with the ranking it kept by then, over the positions both saw; above the threshold (cosine), it keeps
ranking those positions as before (its selection stays put) and ranks only the new ones afresh.
"""

from __future__ import annotations

import torch


def attention_scores(
    queries: torch.Tensor, q_valid: torch.Tensor, keys: torch.Tensor, k_valid: torch.Tensor, scale: float
) -> torch.Tensor:
    """queries [R, Q, H, hd] (``q_valid`` [R, Q] the real ones), keys [R, K, Hkv, hd] (``k_valid`` [R, K]) ->
    [R, Hkv, K]: per row and K/V head, each key's attention probability averaged over the row's queries
    (summed over the query heads of the K/V head); zero where a row has no query."""
    rows, width, heads, dim = queries.shape
    kv_heads = keys.shape[2]
    compute = torch.promote_types(queries.dtype, torch.float32)
    q = queries.to(compute).view(rows, width, kv_heads, heads // kv_heads, dim)
    logits = torch.einsum("rqjgd,rkjd->rjgqk", q, keys.to(compute)) * scale
    logits.masked_fill_(~k_valid[:, None, None, None, :], float("-inf"))
    probs = logits.softmax(-1) * q_valid[:, None, None, :, None].to(compute)
    count = q_valid.sum(1).clamp(min=1).to(compute)
    return probs.sum((2, 3)) / count[:, None, None]


def consistent_ranking(
    scores: torch.Tensor, previous: torch.Tensor, previous_len: torch.Tensor, threshold: float
) -> torch.Tensor:
    """scores [R, Hkv, K] and the ranking each head kept by at the request's previous refresh (``previous``
    [R, Hkv, K], its first ``previous_len`` [R] positions real): where the cosine similarity over those
    positions exceeds ``threshold``, the previous ranking there, the new scores elsewhere."""
    width = scores.shape[-1]
    within = (torch.arange(width, device=scores.device) < previous_len[:, None])[:, None, :]
    s, p = scores * within, previous * within
    cosine = (s * p).sum(-1) / (s.norm(dim=-1) * p.norm(dim=-1)).clamp(min=1e-30)
    stays = (cosine > threshold) & (previous_len > 0)[:, None]
    return torch.where(stays[..., None] & within, previous, scores)


def kept_positions(
    ranking: torch.Tensor, always: torch.Tensor, k_valid: torch.Tensor, kept: torch.Tensor, most: int
) -> torch.Tensor:
    """ranking [R, Hg, K] of a group's heads, ``always`` [R, K] positions kept whatever their rank (the
    active block), ``kept`` [R] how many each row keeps (at most ``most``) -> [R, Hg, most]: each head's
    kept positions ascending, then ``K`` where the row keeps fewer. Ties go to the earlier position."""
    width = ranking.shape[-1]
    ranked = ranking.masked_fill(always[:, None], float("inf")).masked_fill(~k_valid[:, None], float("-inf"))
    top = torch.argsort(ranked, dim=-1, descending=True, stable=True)[..., :most]
    real = torch.arange(most, device=ranking.device) < kept[:, None]
    return torch.where(real[:, None], top, width).sort(-1).values
