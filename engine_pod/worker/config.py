"""What a worker is configured with: its Redis, its queue, its scheduling policy and its timings."""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass

from dllm_contracts.model_identity import ModelIdentity
from dllm_contracts.queue.ops import RESULT_TTL_S
from dllm_contracts.scheduler_config import SchedulerConfig
from engine_pod.engine import scheduler_for
from engine_pod.runner.contract import Runner
from engine_pod.scheduler.base import Scheduler
from engine_pod.scheduler.serving import SERVING_POLICIES


@dataclass(frozen=True)
class WorkerConfig:
    redis_url: str
    service: str
    scheduling: SchedulerConfig  # token budget and admission: the scheduler decides what to claim
    worker_id: str = ""
    # blockserve, or a baseline behind the same queue (measured side by side): static (batches of
    # ``batch_size`` in arrival order, each run until its slowest row is done) or sequential
    policy: str = "blockserve"
    batch_size: int = 1  # static's
    lease_ms: int = 30_000
    idle_wait_s: float = 0.2  # longest wait for new work when idle
    drain_timeout_s: float = 60.0  # after SIGTERM: time to finish in-flight work before handing it back
    result_ttl_s: int = RESULT_TTL_S  # how long a finished request's record and result stay in Redis
    # the model it serves: a request stamped for another is refused, not answered (None: no check)
    model_identity: ModelIdentity | None = None
    served_name: str = ""  # the served model's name without an identity (dllm worker: its --model's)
    # token ids of fixed prefixes (system prompts) computed into the prefix cache at start and pinned there
    warm_prefixes: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        if self.policy not in SERVING_POLICIES:
            raise ValueError(f"policy must be one of {', '.join(SERVING_POLICIES)}, got {self.policy!r}")
        if self.batch_size < 1:
            raise ValueError(f"batch size must be positive, got {self.batch_size}")

    @property
    def model_name(self) -> str:
        """The served model's name, the metrics' model label, as the gateway names the model: its
        identity's, else ``served_name`` (else, for a worker built without one, the service's)."""
        if self.model_identity is not None:
            return self.model_identity.name
        return self.served_name or self.service

    def resolved_id(self) -> str:
        return self.worker_id or f"{socket.gethostname()}-{os.getpid()}"

    def scheduler_for(self, runner: Runner) -> Scheduler:
        """The policy's scheduler for ``runner``'s model and decoding, on the worker's monotonic clock."""
        return scheduler_for(runner, self.policy, self.scheduling, self.batch_size, clock=time.monotonic)
