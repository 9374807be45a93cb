"""What benchmarks pass around: the model to load, prepared requests, and what a policy's run produced
(shared by the engine-alone runner and the serving-path runner, so neither imports the other)."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine_pod.engine import CycleRecord


@dataclass(frozen=True)
class ModelSpec:
    model: str
    device: str
    dtype: str


@dataclass
class PreparedRequest:
    request_id: str
    prompt_ids: list[int]
    max_tokens: int


@dataclass
class RequestOutcome:
    generated: list[int]
    finish_reason: str
    latency_s: float  # from the start of the run (every request arrives at t=0 offline)
    margins: list[float] = field(default_factory=list)


@dataclass
class PolicyRun:
    policy: str
    wall_s: float
    peak_memory_bytes: int
    outcomes: dict[str, RequestOutcome]
    cycles: list[CycleRecord]
    cores: dict[str, list[int]] | None = None  # pinned runs: the cores each part ran on, as observed
