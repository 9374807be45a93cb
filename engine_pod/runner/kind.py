"""A cache kind: how a family's block cycles keep keys and values, which decides its stepper.

Each kind lives in one folder of ``engine_pod/kinds/`` (its stepper, its batch builders, its cache's view
of the pool and its side stores) and makes one ``CacheKind`` there; a family's record names it
(families/record.py), and the runner factory builds the kind's stepper (runner/factory.py). The kind's
``name`` is what the torch-free family table and run rules know it by (dllm_contracts/family_table.py,
dllm_contracts/run_rules.py); the engine asks the object instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine_pod.runner.cycle_driver import Stepper


@dataclass(frozen=True)
class CacheKind:
    """One cache kind, as the engine reads it."""

    name: str  # its name in the family table and the run rules
    # (loaded, decoding, pool_tokens[, record_trace, record_margins]) -> the kind's stepper
    stepper: Callable[..., Stepper]
    model_interface: type  # the Protocol its stepper needs of a model (runner/model_interface.py)
    records_margins: bool = False  # its stepper records each commit's top-two gap and row 0's trace
    # its cache is rebuilt by each block's refresh and held for the row's life (dLLM-Serve's admission
    # counts that share of a token's cost: profiling/cache_share.py)
    refreshes: bool = False
    canvas_rows: bool = False  # a row is one canvas over a kept context (what the profiler measures)

    def __repr__(self) -> str:
        return f"CacheKind({self.name!r})"
