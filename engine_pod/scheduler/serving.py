"""Which scheduler serves a worker's queue: BlockServe, or a baseline behind the same queue.

The baselines (static batching with Fast-dLLM's semantics, one request at a time) draw from the shared
queue as BlockServe does, so that the serving path can be measured with each of them side by side.
"""

from __future__ import annotations

from collections.abc import Iterable

from dllm_contracts.scheduler_config import SERVING_POLICIES, SchedulerConfig
from engine_pod.scheduler.base import Scheduler
from engine_pod.scheduler.blockserve import BlockServeScheduler
from engine_pod.scheduler.dllm_serve import DllmServeScheduler
from engine_pod.scheduler.static import StaticScheduler, sequential_scheduler


def serving_scheduler(
    policy: str,
    block_length: int,
    eos_ids: Iterable[int],
    config: SchedulerConfig,
    batch_size: int = 1,
    kept_share: float = 1.0,
    **common,
) -> Scheduler:
    """``policy``'s scheduler: BlockServe or dLLM-Serve with ``config``, static batches of ``batch_size`` (in arrival
    order, each run until its slowest row is done) or sequential. ``kept_share``: of a row's context, what
    its cache holds (the head-sparse cache's; dLLM-Serve's admission counts it)."""
    if policy == "blockserve":
        return BlockServeScheduler(block_length, eos_ids, config, **common)
    if policy == "dllm-serve":
        return DllmServeScheduler(block_length, eos_ids, config, kept_share=kept_share, **common)
    if policy == "static":
        return StaticScheduler(block_length, eos_ids, batch_size=batch_size, **common)
    if policy == "sequential":
        return sequential_scheduler(block_length, eos_ids, **common)
    raise ValueError(f"policy must be one of {', '.join(SERVING_POLICIES)}, got {policy!r}")
