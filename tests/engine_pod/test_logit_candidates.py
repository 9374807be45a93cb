"""Logit candidates: with k > 0 the scoring sees each position's k candidates' exact logits only, and
their token ids come back; 0 is the whole vocabulary."""

from __future__ import annotations

import pytest
import torch

from engine_pod.decoding.config import DecodingConfig, DecodingConfigError
from engine_pod.loading.loader import load_model
from engine_pod.models.logit_budget import LogitBudget
from engine_pod.models.transformer import SelectedHidden
from engine_pod.runner.factory import make_runner
from tests.engine_pod.test_logit_budget import run
from tests.factories import REFERENCE_DIR

K = 5


@pytest.fixture(scope="module")
def loaded():
    return load_model(str(REFERENCE_DIR / "llada"), dtype="float64")


def _scored(loaded, candidates: int):
    head = loaded.model.lm_head
    hidden = torch.randn(
        40, head.in_features, dtype=head.weight.dtype, generator=torch.Generator().manual_seed(1)
    )
    selected = SelectedHidden(hidden, head, LogitBudget(7, candidates))

    def fn(logits):
        probability = logits.softmax(dim=-1)
        confidence, proposal = probability.max(dim=-1)
        return proposal, confidence, torch.full_like(proposal, logits.shape[1])

    return selected.map_logits(fn, (0,)), head(hidden)


def test_the_scorer_sees_k_columns_and_gets_token_ids_back(loaded):
    (proposal, confidence, columns), full = _scored(loaded, K)
    assert columns.eq(K).all()  # the whole vocabulary (512) where candidates are off
    assert torch.equal(proposal, full.argmax(dim=-1))  # the likeliest token is among its candidates
    exact = full.softmax(dim=-1).max(dim=-1).values
    assert (confidence >= exact - 1e-12).all() and (confidence > exact).any()  # renormalized over K


def test_candidates_off_is_the_whole_vocabulary(loaded):
    (proposal, confidence, columns), full = _scored(loaded, 0)
    assert columns.eq(full.shape[1]).all()
    assert torch.equal(confidence, full.softmax(dim=-1).max(dim=-1).values)


def test_a_run_with_candidates_draws_and_reports_within_them(loaded):
    """Sampled rows draw, and log probabilities are, over the k candidates: alternatives' probabilities
    sum to at most 1 over K tokens, and outputs differ from the whole vocabulary's."""
    whole, restricted = run(loaded, None), run(loaded, None, candidates=K)
    assert set(restricted["tokens"]) == set(whole["tokens"])
    assert restricted["logprobs"] != whole["logprobs"]
    for values in restricted["logprobs"].values():
        for logprob, alternatives in filter(None, values):
            assert len(alternatives) == 3 and logprob <= 0


def test_candidates_are_refused_below_zero_and_for_diffusion_gemma():
    with pytest.raises(DecodingConfigError, match="logit candidates must be at least 0"):
        DecodingConfig(logit_candidates=-1)
    gemma = load_model("random:diffusion-gemma-tiny")
    with pytest.raises(ValueError, match="--logit-candidates: DiffusionGemma"):
        make_runner(gemma, DecodingConfig(block_length=32, logit_candidates=8))
