"""A row of a linear layer's input rounds alike in any batch: tiles of ``TILE_ROWS`` rows, whatever the row
count, its place among the rows and the other rows (on one torch thread)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine_pod.families.diffusion_gemma.experts import GemmaExperts
from engine_pod.models.logit_head import apply_head
from engine_pod.models.row_invariant import TILE_ROWS, RowInvariantLinear, linear, tiled_rows

SHAPES = [(128, 64), (64, 256), (128, 8), (256, 768), (384, 96)]  # (inputs, outputs)
COUNTS = (1, 2, 3, 4, 5, 7, 8, 13, 16, 17, 31, 32, 33, 63, 64, 65, 100)


@pytest.mark.parametrize(("inputs", "outputs"), SHAPES)
def test_a_row_rounds_alike_whatever_the_rows_around_it(inputs, outputs):
    generator = torch.Generator().manual_seed(inputs + outputs)
    weight = torch.randn(outputs, inputs, generator=generator)
    bias = torch.randn(outputs, generator=generator)
    x = torch.randn(200, inputs, generator=generator)
    alone = linear(x[100:101], weight, bias)[0]
    for count in COUNTS:
        for before in sorted(
            {0, min(1, count - 1), count // 2, count - 1}
        ):  # the row's place among the others
            start = 100 - before
            assert torch.equal(linear(x[start : start + count], weight, bias)[before], alone), (count, before)
    assert torch.equal(
        linear(x[98:103].view(1, 5, inputs), weight, bias)[0, 2], alone
    )  # leading dims flattened


def test_rows_are_multiplied_as_tiles_of_a_fixed_size():
    assert [tiled_rows(n) for n in (1, TILE_ROWS, TILE_ROWS + 1)] == [TILE_ROWS, TILE_ROWS, 2 * TILE_ROWS]
    weight, x = torch.randn(8, 16), torch.randn(3, 16)
    assert torch.allclose(linear(x, weight), F.linear(x, weight), atol=1e-6)


def test_float64_and_empty_inputs_pass_through():
    weight = torch.randn(8, 16, dtype=torch.float64)
    x = torch.randn(5, 16, dtype=torch.float64)
    assert torch.allclose(linear(x, weight), F.linear(x, weight))
    assert linear(torch.zeros(0, 16, dtype=torch.float64), weight).shape == (0, 8)


def test_the_lm_heads_logits_round_alike_in_any_chunk():
    head = torch.nn.Linear(64, 300, bias=False)
    x = torch.randn(90, 64)
    whole = apply_head(head, x)
    for count in (1, 3, 17, 40):
        assert torch.equal(apply_head(head, x[50 : 50 + count]), whole[50 : 50 + count]), count


def test_an_experts_token_rounds_alike_however_many_tokens_chose_the_expert():
    """The grouped matmuls pad each expert's group to a multiple of TILE_ROWS (float32, no grad)."""
    config = type("Config", (), {"moe_intermediate_size": 48, "hidden_size": 64, "num_experts": 4})()
    experts = GemmaExperts(config)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        experts.gate_up_proj.copy_(torch.randn(experts.gate_up_proj.shape, generator=generator))
        experts.down_proj.copy_(torch.randn(experts.down_proj.shape, generator=generator))
        x = torch.randn(70, 64, generator=generator)
        chosen = torch.randint(0, 4, (70, 2), generator=generator)
        chosen[:, 1] = (chosen[:, 0] + 1) % 4
        weights = torch.rand(70, 2, generator=generator)
        together = experts(x, chosen, weights)
        for count in (1, 2, 5, 33):
            assert torch.equal(experts(x[:count], chosen[:count], weights[:count]), together[:count]), count


def test_the_module_keeps_nn_linears_parameters():
    module = RowInvariantLinear(16, 8, bias=False)
    assert list(dict(module.named_parameters())) == ["weight"]
    x = torch.randn(2, 16)
    assert torch.equal(module(x), linear(x, module.weight))
