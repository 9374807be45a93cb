"""Experts as grouped matmuls (models/moe.py, models/diffusion_gemma/experts.py): the same bits as the loop
over the experts hit, for batches that hit one expert, a few (groups of 1 to 3 tokens among them) or all."""

from __future__ import annotations

import pytest
import torch

from engine_pod.families.diffusion_gemma.experts import GemmaExperts, GemmaRouter
from engine_pod.loading.loader import load_model
from engine_pod.models.moe import MixtureOfExperts


@pytest.fixture(scope="module")
def layers():
    torch.set_num_threads(1)
    found = {}
    for spec, kind in (
        ("random:llada2-tiny", MixtureOfExperts),
        ("random:diffusion-gemma-tiny", GemmaExperts),
    ):
        model = load_model(spec).model
        found[kind] = next(m for m in model.modules() if isinstance(m, kind))
        if kind is GemmaExperts:
            found[GemmaRouter] = next(m for m in model.modules() if isinstance(m, GemmaRouter))
    return found


def _tokens(rows: int, width: int, seed: int) -> torch.Tensor:
    return torch.randn(rows, width, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 17, 64])
def test_llada2_experts_grouped_equal_the_loop(layers, rows):
    moe = layers[MixtureOfExperts]
    x = _tokens(rows, moe.gate.weight.shape[1], rows)
    with torch.no_grad():
        assert moe._grouped_weights(x) is not None
        grouped = moe(x)
        stacked, moe._stacked = moe._stacked, None  # the loop over the experts hit
        try:
            looped = moe(x)
        finally:
            moe._stacked = stacked
    assert torch.equal(grouped, looped)


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 17, 64])
def test_diffusion_gemma_experts_grouped_equal_the_loop(layers, rows, monkeypatch):
    experts, router = layers[GemmaExperts], layers[GemmaRouter]
    x = _tokens(rows, experts.gate_up_proj.shape[2], 100 + rows)
    with torch.no_grad():
        chosen, weights = router(x)
        assert experts._groups_on_device(x)
        grouped = experts(x, chosen, weights)
        monkeypatch.setattr(GemmaExperts, "_groups_on_device", lambda self, x: False)
        looped = experts(x, chosen, weights)
    assert torch.equal(grouped, looped)
