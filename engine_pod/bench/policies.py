"""Scheduling policies a benchmark compares, and how each becomes a scheduler."""

from __future__ import annotations

from dataclasses import dataclass

from engine_pod.scheduler.base import Scheduler
from engine_pod.scheduler.blockserve import DEFAULT_MIN_PADDING_EFFICIENCY, BlockServeScheduler
from engine_pod.scheduler.static import StaticScheduler, sequential_scheduler

POLICIES = ("sequential", "static", "blockserve", "blockserve-preempt", "blockserve-projected", "gateway")


@dataclass(frozen=True)
class PolicySpec:
    name: str  # one of POLICIES
    token_budget: int  # BlockServe's budget (static's batch size is derived from it for equal memory)
    static_batch_size: int
    admission: str = "preempt"  # BlockServe admission for the plain "blockserve" policy
    max_rows: int = 256
    min_padding_efficiency: float = DEFAULT_MIN_PADDING_EFFICIENCY  # BlockServe's widening rule

    def __post_init__(self) -> None:
        if self.name not in POLICIES:
            raise ValueError(f"unknown policy {self.name!r}; choose from {', '.join(POLICIES)}")

    @property
    def effective_admission(self) -> str:
        return self.name.split("-", 1)[1] if "-" in self.name else self.admission

    @property
    def through_gateway(self) -> bool:
        """BlockServe behind the whole serving path: HTTP, gateway, Redis queue, worker."""
        return self.name == "gateway"


def build_scheduler(spec: PolicySpec, block_length: int, eos_ids, ignore_eos: bool, canvas: str) -> Scheduler:
    common = dict(ignore_eos=ignore_eos, canvas=canvas)
    if spec.name == "sequential":
        return sequential_scheduler(block_length, eos_ids, **common)
    if spec.name == "static":
        return StaticScheduler(block_length, eos_ids, batch_size=spec.static_batch_size, **common)
    return BlockServeScheduler(
        block_length,
        eos_ids,
        token_budget=spec.token_budget,
        max_rows=spec.max_rows,
        admission=spec.effective_admission,
        min_padding_efficiency=spec.min_padding_efficiency,
        **common,
    )


def static_batch_size_for(widths_in_arrival_order: list[int], token_budget: int) -> int:
    """Largest B whose every arrival-order batch box (B x widest p + g) fits the budget."""
    for batch in range(len(widths_in_arrival_order), 0, -1):
        chunks = [
            widths_in_arrival_order[i : i + batch] for i in range(0, len(widths_in_arrival_order), batch)
        ]
        if all(len(chunk) * max(chunk) <= token_budget for chunk in chunks):
            return batch
    raise ValueError(
        f"token budget {token_budget} cannot hold the widest request ({max(widths_in_arrival_order)} tokens)"
    )
