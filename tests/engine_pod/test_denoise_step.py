"""The one denoising step: candidates scored where they sit, the policy's selection written, log
probabilities recorded for the rows that asked and only for the tokens committed."""

from __future__ import annotations

import torch
from torch import nn

from engine_pod.decoding.denoise_step import Candidates, DenoiseStep
from engine_pod.decoding.logprobs import LogprobRecorder
from engine_pod.decoding.policies import StepContext
from engine_pod.decoding.policies.scheduled_threshold import ScheduledThresholdPolicy
from engine_pod.models.transformer import SelectedHidden

MASK = 5
VOCAB = 6


def logits_for(tokens: list[int], strengths: list[float]) -> SelectedHidden:
    """Hidden states whose logits put ``strength`` on ``token`` (the LM head is the identity)."""
    head = nn.Linear(VOCAB, VOCAB, bias=False, dtype=torch.float64)
    with torch.no_grad():
        head.weight.copy_(torch.eye(VOCAB, dtype=torch.float64))
    hidden = torch.zeros(len(tokens), VOCAB, dtype=torch.float64)
    hidden[torch.arange(len(tokens)), torch.tensor(tokens)] = torch.tensor(strengths, dtype=torch.float64)
    return SelectedHidden(hidden, head)


def step_for(block: torch.Tensor, rows: list[int]):
    candidates = Candidates.of(block == MASK, torch.tensor(rows))
    return DenoiseStep(ScheduledThresholdPolicy(), torch.float64), candidates


def test_a_forced_step_commits_every_candidate_and_records_only_the_rows_that_asked():
    block = torch.tensor([[MASK, 1, MASK], [2, MASK, 3]])
    step, candidates = step_for(block, [1, 0])  # the stepping rows are the batch's rows 1 and 0
    logits = logits_for([3, 4, 1], [2.0, 3.0, 4.0])
    asked = LogprobRecorder(counts=[2, None], values=[[None] * 3, None])
    commit = step(logits, candidates, block, torch.tensor([10, 12, 21]), 0, None, None, asked)
    assert asked.values[0] == [None] * 3  # read at the cycle's end, not in the step
    asked.finish()
    assert torch.equal(commit.transfer, block == MASK)
    assert commit.blocks.tolist() == [[3, 1, 4], [2, 1, 3]]
    own, alternatives = asked.values[0][1]  # batch row 0 is the second stepping row
    assert asked.values[0][0] is None and asked.values[0][2] is None
    expected = torch.log_softmax(logits.logits()[2], dim=-1)
    assert own == expected[1].item()
    assert len(alternatives) == 2 and alternatives[0] == (1, own)  # the others tie at 0


def test_the_policy_commits_the_most_confident_candidate_at_its_own_position():
    block = torch.tensor([[MASK, MASK, MASK]])
    step, candidates = step_for(block, [0])
    logits = logits_for([1, 2, 3], [1.0, 5.0, 2.0])
    context = StepContext(
        step=0,
        steps_per_block=3,
        masks_at_block_start=torch.tensor([3]),
        masks_now=torch.tensor([3]),
        threshold=torch.tensor([1.0], dtype=torch.float64),
        eps=0.0,
    )
    commit = step(logits, candidates, block, torch.tensor([0, 1, 2]), 0, None, context)
    assert commit.transfer.tolist() == [[False, True, False]]
    assert commit.blocks.tolist() == [[MASK, 2, MASK]]
    assert commit.proposals.tolist() == [[1, 2, 3]]
