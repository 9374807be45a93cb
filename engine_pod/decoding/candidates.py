"""Each candidate's proposal and confidence from the LM head's logits: the policy's scorer for greedy rows,
a seeded draw (decoding/sampling.py) for sampled ones, chunk by chunk over the LM head."""

from __future__ import annotations

import torch

from engine_pod.decoding.sampling import draw_keys, sample
from engine_pod.decoding.scoring import Scorer


def score_candidates(
    logits,
    scorer: Scorer,
    sampling,
    rows: torch.Tensor,
    positions: torch.Tensor,
    step: int,
    score_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``logits``: the candidates' SelectedHidden, in candidate order; ``rows`` [n]: each candidate's row in
    ``sampling`` (a RowSampling, or None when every row is greedy); ``positions`` [n]: absolute positions."""
    if sampling is None or not bool(sampling.sampled[rows].any()):
        return logits.map_logits(scorer)
    keys = draw_keys(sampling.seeds[rows], positions, step)
    drawn, temperature = sampling.sampled[rows], sampling.temperature[rows]
    top_k, top_p = sampling.top_k[rows], sampling.top_p[rows]
    offset = 0

    def score(chunk: torch.Tensor):
        nonlocal offset
        part = slice(offset, offset + chunk.shape[0])
        offset += chunk.shape[0]
        proposal, confidence = scorer(chunk)
        mine = drawn[part]
        if bool(mine.any()):
            take = lambda t: t[part][mine]  # noqa: E731
            picked, probability = sample(
                chunk[mine].to(score_dtype), take(temperature), take(top_k), take(top_p), take(keys)
            )
            proposal, confidence = proposal.clone(), confidence.clone()
            proposal[mine], confidence[mine] = picked, probability.to(confidence.dtype)
        return proposal, confidence

    return logits.map_logits(score)
