"""One denoising step, the same for every model family: score the masked candidates of one forward
(decoding/candidates.py), let the remasking policy select which to commit, write the commits into the
blocks and record the committed tokens' log probabilities for the rows that asked (decoding/logprobs.py).
A family's runner owns the rest: the forward that gives the candidates' logits and its cache layout."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine_pod.decoding.candidates import score_candidates
from engine_pod.decoding.grammar.device import GrammarStep
from engine_pod.decoding.logprobs import LogprobRecorder
from engine_pod.decoding.policies import RemaskingPolicy, StepContext


@dataclass
class Candidates:
    """The masked positions one forward scores, in the order the forward selects them."""

    mask: torch.Tensor  # [R', L] the candidates over the stepping rows' blocks
    r: torch.Tensor  # [n] each candidate's row among the stepping rows
    k: torch.Tensor  # [n] its position in the block
    owner: torch.Tensor  # [n] its row in the cycle's batch: its sampling and its log-probability request

    @classmethod
    def of(cls, mask: torch.Tensor, rows: torch.Tensor, count: int | None = None) -> Candidates:
        """``rows`` [R']: each stepping row's row in the batch; ``count``: how many candidates the mask
        holds, where the host knows it (then nothing is read back from the device to find them)."""
        if count is None:
            r, k = mask.nonzero(as_tuple=True)
        else:
            r, k = torch.nonzero_static(mask, size=count).unbind(1)
        return cls(mask, r, k, rows[r])


@dataclass
class Commit:
    """What one step committed."""

    blocks: torch.Tensor  # [R', L] the stepping rows' blocks after the step
    transfer: torch.Tensor  # [R', L] positions committed in this step
    proposals: torch.Tensor  # [R', L] each candidate's proposed token (the block's own elsewhere)
    confidence: torch.Tensor | None = None  # [R', L] each candidate's confidence (-inf elsewhere), if scored


@dataclass
class DenoiseStep:
    """Scores, selects and writes one forward's candidates with one policy."""

    policy: RemaskingPolicy
    score_dtype: torch.dtype  # what scores are computed in
    mask_id: int | None = None  # a sampled row never draws it (committing it would leave the position masked)

    def __call__(
        self,
        logits,
        candidates: Candidates,
        block: torch.Tensor,
        positions: torch.Tensor,
        step: int,
        sampling,
        context: StepContext | None,
        logprobs: LogprobRecorder | None = None,
        grammar: GrammarStep | None = None,
    ) -> Commit:
        """``logits``: the candidates' SelectedHidden; ``block`` [R', L]: the stepping rows' blocks;
        ``positions`` [n]: the candidates' absolute positions; ``sampling``: a RowSampling over the batch
        (None: all greedy); ``context`` None commits every candidate (a forced commit); ``grammar``: the
        constrained rows among the stepping rows, which commit their frontier alone, under its mask."""
        width = None if logprobs is None else logprobs.width
        scored = score_candidates(
            logits,
            self.policy.scorer,
            sampling,
            candidates.owner,
            positions,
            step,
            self.score_dtype,
            self.mask_id,
            width,
        )
        proposal, confidence = scored[0], scored[1]
        constrained = grammar is not None and grammar.count > 0
        if constrained:
            masked = grammar.frontier_proposals(
                logits, sampling, candidates.owner, positions, step, self.score_dtype
            )
            proposal = proposal.index_copy(0, grammar.first_candidate, masked)
        proposals = block.clone()
        proposals[candidates.r, candidates.k] = proposal
        scores = None
        if context is not None or constrained:
            scores = torch.full(block.shape, float("-inf"), dtype=confidence.dtype, device=block.device)
            scores[candidates.r, candidates.k] = confidence
        transfer = (
            candidates.mask if context is None else self.policy.select(scores, candidates.mask, context)
        )
        if constrained:
            transfer = grammar.restrict(transfer)
        if logprobs is not None:  # read with the cycle's end
            logprobs.keep(candidates.owner, candidates.k, transfer[candidates.r, candidates.k], scored[2:])
        return Commit(torch.where(transfer, proposals, block), transfer, proposals, scores)
