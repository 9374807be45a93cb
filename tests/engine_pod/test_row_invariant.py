"""A row of a linear layer's input rounds alike among 1 to 3 rows and among many (on one torch thread)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine_pod.models.row_invariant import RowInvariantLinear, linear


@pytest.mark.parametrize(("inputs", "outputs"), [(128, 64), (64, 256), (128, 8)])
def test_one_to_three_rows_round_as_they_do_among_many(inputs, outputs):
    generator = torch.Generator().manual_seed(inputs + outputs)
    weight = torch.randn(outputs, inputs, generator=generator)
    bias = torch.randn(outputs, generator=generator)
    x = torch.randn(64, inputs, generator=generator)
    many = F.linear(x, weight, bias)
    for rows in (1, 2, 3, 5):
        assert torch.equal(linear(x[:rows], weight, bias), many[:rows])
        assert torch.equal(linear(x[:rows].view(1, rows, inputs), weight, bias)[0], many[:rows])


def test_the_module_keeps_nn_linears_parameters():
    module = RowInvariantLinear(16, 8, bias=False)
    assert list(dict(module.named_parameters())) == ["weight"]
    x = torch.randn(2, 16)
    assert torch.equal(module(x), linear(x, module.weight))
