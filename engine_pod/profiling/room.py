"""Whether usable memory can run one block at all: said in one line, before a budget is made of it."""

from __future__ import annotations

from engine_pod.profiling.fit import MemoryFit
from engine_pod.profiling.grid import Point


def smallest_too_large(smallest: Point, usable: int) -> str | None:
    """Why the grid's smallest batch, measured first, shows that nothing fits (None when it fits)."""
    if smallest.peak_bytes <= usable:
        return None
    return (
        f"usable memory {usable} bytes is below the peak of the smallest batch measured ({smallest.tokens} "
        f"tokens: {smallest.peak_bytes} bytes); that cannot run one block"
    )


def no_block_fits(budget: int, block_length: int, fit: MemoryFit, usable: int) -> str | None:
    """Why a fitted budget cannot hold one block's rows (None when it can)."""
    if budget >= 2 * block_length:
        return None
    return (
        f"usable memory {usable} bytes leaves room for only {max(budget, 0)} batch tokens "
        f"(runtime {int(fit.intercept_bytes)} + weights {fit.weights_bytes} bytes); that cannot run one block"
    )
