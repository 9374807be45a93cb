"""The entropy-bound sampler's arithmetic shortcuts (decoding/entropy_bound.py) give torch's bits: its
logsumexp without the slow exps of subnormal results, and the step's probabilities reused by the
self-conditioning (models/diffusion_gemma/model.py) in place of a second softmax."""

from __future__ import annotations

import pytest
import torch

from engine_pod.decoding.entropy_bound import entropy_bound_step, logsumexp, start_canvas
from engine_pod.families.diffusion_gemma.sampler_settings import EntropyBoundParams
from engine_pod.loading.loader import load_model


@pytest.mark.parametrize("temperature", [0.005, 0.02, 0.1, 0.4, 0.8, 3.0])
def test_logsumexp_is_torchs_bit_for_bit(temperature):
    generator = torch.Generator().manual_seed(int(temperature * 1000))
    for scale in (0.1, 1.0, 10.0):
        logits = torch.tanh(torch.randn(32, 16, 1024, generator=generator) * scale) * 30 / temperature
        assert torch.equal(logsumexp(logits), logits.logsumexp(dim=-1, keepdim=True))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_steps_probabilities_give_the_self_conditioning_its_own_softmax_would(dtype):
    model = load_model("random:diffusion-gemma-tiny", dtype=dtype).model
    params = [EntropyBoundParams(max_denoising_steps=4, t_min=0.01, t_max=0.02)] * 3
    generators = [torch.Generator().manual_seed(seed) for seed in range(3)]
    rows = start_canvas(params, generators, 32, 1024, torch.device("cpu"))
    logits = torch.tanh(torch.randn(3, 32, 1024, generator=generators[0])) * 30
    result = entropy_bound_step(rows, logits)
    alone = model.soft_embeddings(result.processed_logits)
    assert torch.equal(model.soft_embeddings(result.processed_logits, result.probabilities), alone)
