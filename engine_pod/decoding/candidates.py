"""Each candidate's proposal and confidence from the LM head's logits: the policy's scorer for greedy rows,
a seeded draw (decoding/sampling.py) for sampled ones, chunk by chunk over the LM head."""

from __future__ import annotations

import torch

from engine_pod.decoding.logprobs import token_logprobs
from engine_pod.decoding.sampling import distribution_logits, draw_keys, sample
from engine_pod.decoding.scoring import Scorer


def score_candidates(
    logits,
    scorer: Scorer,
    sampling,
    rows: torch.Tensor,
    positions: torch.Tensor,
    step: int,
    score_dtype: torch.dtype,
    mask_id: int | None = None,
    logprob_width: int | None = None,
) -> tuple[torch.Tensor, ...]:
    """``logits``: the candidates' SelectedHidden, in candidate order; ``rows`` [n]: each candidate's row in
    ``sampling`` (a RowSampling, or None when every row is greedy); ``positions`` [n]: absolute positions;
    ``mask_id``: a token sampled rows never draw; ``logprob_width``: unless None, each candidate's proposal's log
    probability and its likeliest tokens' (that many) follow (decoding/logprobs.py), from the same logits."""
    tokens = (0, 4) if logprob_width is not None else (0,)  # proposals and alternatives: token ids
    never, mask_id = (mask_id, None) if logits.restricts else (None, mask_id)  # the mask: no candidate
    if sampling is None:

        def greedy(chunk: torch.Tensor):
            proposal, confidence = scorer(chunk)
            proposal = _not_the_mask(chunk, proposal, mask_id)
            if logprob_width is None:
                return proposal, confidence
            return proposal, confidence, *token_logprobs(chunk.to(score_dtype), proposal, logprob_width)

        return logits.map_logits(greedy, tokens, never)
    keys = draw_keys(sampling.seeds[rows], positions, step)
    drawn, temperature = sampling.sampled[rows], sampling.temperature[rows]
    top_k, top_p = sampling.top_k[rows], sampling.top_p[rows]
    offset = 0

    def score(chunk: torch.Tensor):
        """Every candidate scored both ways, each keeping its row's (nothing read to choose)."""
        nonlocal offset
        part = slice(offset, offset + chunk.shape[0])
        offset += chunk.shape[0]
        proposal, confidence = scorer(chunk)
        proposal = _not_the_mask(chunk, proposal, mask_id)
        picked, probability = sample(
            chunk.to(score_dtype),
            temperature[part],
            top_k[part],
            top_p[part],
            keys[part],
            mask_id,
            sampling.filters,
        )
        mine = drawn[part]
        proposal = torch.where(mine, picked, proposal)
        confidence = torch.where(mine, probability.to(confidence.dtype), confidence)
        if logprob_width is None:
            return proposal, confidence
        scores = chunk.to(score_dtype)
        tempered = distribution_logits(
            scores, temperature[part], top_k[part], top_p[part], mask_id, sampling.filters
        )
        distribution = torch.where(mine[:, None], tempered, scores)
        return proposal, confidence, *token_logprobs(distribution, proposal, logprob_width)

    return logits.map_logits(score, tokens, never)


def _not_the_mask(logits: torch.Tensor, proposal: torch.Tensor, mask_id: int | None) -> torch.Tensor:
    """``proposal`` with the runner-up token where the model ranks the mask token first (random or
    undertrained weights do: committing it would leave the position masked and its block unfinished); the
    confidence is the scorer's, and every other proposal is the scorer's own."""
    if mask_id is None:
        return proposal
    kept = logits[:, mask_id].clone()
    logits[:, mask_id] = float("-inf")
    runner_up = logits.argmax(dim=-1)
    logits[:, mask_id] = kept
    return torch.where(proposal == mask_id, runner_up, proposal)
