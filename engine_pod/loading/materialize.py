"""Storage for a model built on the meta device, without torch's meta-tensor reference path."""

from __future__ import annotations

import torch


def materialize(module: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """``module.to_empty(device=device)``: every parameter and buffer as uninitialised storage of its shape
    and dtype on ``device``. ``to_empty`` calls ``empty_like`` on meta tensors, whose reference
    implementation imports sympy: about half a CPU second in every process that loads a model."""
    return module._apply(lambda t: torch.empty(t.shape, dtype=t.dtype, device=device))
