"""``--batch-invariant``: a request's float32 outputs are the same bits alone and in any batch, for every
family, by construction rather than by the matrix library's kernel choices (``DecodingConfig.batch_invariant``).

``set_batch_invariant`` turns a built model's layers to the construction of ``models/row_invariant.py``,
or back: every ``nn.Linear`` (the plain layers, the fused q/k/v projection that reads their class, the
tensor-parallel ``RowParallelLinear`` and ``VocabParallelHead``) takes a class of its own whose product is
``row_invariant.linear`` (tiles of ``TILE_ROWS`` rows as one batched product: the library sees one problem
shape whatever the batch), and every module that declares ``row_invariant`` (LLaDA2.0's router and experts,
DiffusionGemma's head and soft embeddings) is told. Parameters, their names and storage are untouched.
Each runner arms its model before it runs (runner/cycle_driver.py), so runners with and without the
setting may share one model; the runner also lays every cycle out packed under the setting (a dense box's
padding changes how the attention kernel blocks a row's queries and keys).

On a GPU, ``matmul_settings`` also keeps cuBLAS at full float32 precision (no TF32) and half-precision
products with full-precision reductions and no split-K (docs/design.md, "Batch invariance on a GPU").
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

from engine_pod.models.row_invariant import RowInvariantLinear


class BatchInvariantLinear(RowInvariantLinear):
    """An ``nn.Linear`` turned row-invariant by ``set_batch_invariant`` (``plain``: its class before)."""

    plain: type[nn.Linear] = nn.Linear


@functools.cache
def _tiled_class(cls: type[nn.Linear]) -> type[nn.Linear]:
    """``cls`` with its product through ``row_invariant.linear``: for a subclass whose forward calls
    ``nn.Linear``'s (``super().forward``), ``RowInvariantLinear`` comes between them in the MRO."""
    if cls is nn.Linear:
        return BatchInvariantLinear
    return type(f"BatchInvariant{cls.__name__}", (cls, BatchInvariantLinear), {"plain": cls})


def set_batch_invariant(model: nn.Module, on: bool) -> None:
    """Turn ``model``'s products row-invariant (``on``) or back to the library's own (a no-op when they
    already are). Layers that are row-invariant by their family's design (DiffusionGemma's) stay so."""
    if getattr(model, "batch_invariant", False) == on:
        return
    for module in model.modules():
        if isinstance(module, BatchInvariantLinear) and not on:
            module.__class__ = type(module).plain
        elif isinstance(module, nn.Linear) and not isinstance(module, RowInvariantLinear) and on:
            module.__class__ = _tiled_class(type(module))
        elif hasattr(type(module), "row_invariant"):
            module.row_invariant = on
    model.batch_invariant = on


def matmul_settings(device: torch.device | str, on: bool) -> dict[str, Any]:
    """``torch.backends.cuda.matmul``'s settings for a model on ``device`` with the setting ``on`` or off
    (off: torch's defaults); nothing off a CUDA device."""
    if torch.device(device).type != "cuda":
        return {}
    return {
        "fp32_precision": "ieee" if on else "none",  # ieee: no TF32
        "allow_fp16_reduced_precision_reduction": (not on, not on),  # (reduced precision, split-K)
        "allow_bf16_reduced_precision_reduction": (not on, not on),
    }


def apply_matmul_settings(device: torch.device | str, on: bool) -> None:
    """Set ``matmul_settings(device, on)`` (process-wide: cuBLAS's settings are the process's)."""
    for name, value in matmul_settings(device, on).items():
        setattr(torch.backends.cuda.matmul, name, value)


def arm(model: nn.Module, device: torch.device | str, on: bool) -> None:
    """The setting in force for ``model`` on ``device``: its layers, and cuBLAS's settings on a GPU (set
    where the setting changes: a model that never had it leaves the process's settings as they are)."""
    if getattr(model, "batch_invariant", False) == on:
        return
    set_batch_invariant(model, on)
    apply_matmul_settings(device, on)
