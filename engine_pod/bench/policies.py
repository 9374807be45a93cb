"""Scheduling policies a benchmark compares, and how each becomes a scheduler."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from dllm_contracts.scheduler_config import ADMISSION_MODES, SchedulerConfig
from engine_pod.engine import scheduler_for
from engine_pod.runner.contract import Runner
from engine_pod.scheduler.base import Scheduler
from engine_pod.scheduler.serving import SERVING_POLICIES

POLICIES = (
    "sequential",
    "static",
    "blockserve",
    "blockserve-preempt",
    "blockserve-projected",
    "blockserve-dense",
    "blockserve-packed",
    "dllm-serve",
    "gateway",
    "gateway-static",
    "gateway-sequential",
)


@dataclass(frozen=True)
class PolicySpec:
    name: str  # one of POLICIES
    scheduling: SchedulerConfig  # BlockServe's (static's batch size is derived from its budget)
    static_batch_size: int

    def __post_init__(self) -> None:
        if self.name not in POLICIES:
            raise ValueError(f"unknown policy {self.name!r}; choose from {', '.join(POLICIES)}")

    @property
    def token_budget(self) -> int:
        return self.scheduling.token_budget

    @property
    def effective_scheduling(self) -> SchedulerConfig:
        """``blockserve-preempt`` and ``blockserve-projected`` name their admission mode,
        ``blockserve-dense`` and ``blockserve-packed`` their layout."""
        if not self.name.startswith("blockserve-"):
            return self.scheduling
        variant = self.name.split("-", 1)[1]
        field = "admission" if variant in ADMISSION_MODES else "layout"
        return replace(self.scheduling, **{field: variant})

    @property
    def through_gateway(self) -> bool:
        """Behind the whole serving path (HTTP, gateway, Redis queue, worker): ``gateway`` serves with
        BlockServe, ``gateway-static`` and ``gateway-sequential`` with the baselines."""
        return self.name == "gateway" or self.name.startswith("gateway-")

    @property
    def served_policy(self) -> str:
        """The scheduler it runs (one of ``SERVING_POLICIES``)."""
        name = self.name.removeprefix("gateway-") if self.through_gateway else self.name
        return name if name in SERVING_POLICIES else "blockserve"


def build_scheduler(spec: PolicySpec, runner: Runner) -> Scheduler:
    """The scheduler ``spec`` names for ``runner``'s model and decoding. The baselines run as their
    reference does (Fast-dLLM's static batch: a dense box in lockstep; sequential: one row, which no
    layout pads); BlockServe in its configured layout."""
    return scheduler_for(runner, spec.served_policy, spec.effective_scheduling, spec.static_batch_size)


def static_widths(requests, block_length: int) -> list[int]:
    """Each request's static row: its prompt and its whole generation budget, in whole blocks."""
    return [r.longest_prompt + math.ceil(r.max_tokens / block_length) * block_length for r in requests]


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
