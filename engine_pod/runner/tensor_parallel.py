"""One scheduler for a tensor-parallel group: rank 0 decides, every rank computes.

Rank 0 (the leader) admits requests and runs the cycle driver as one process does; before each cycle it
broadcasts the cycle (the scheduler's output) to the other ranks in one collective, and each of them runs
the same cycle on its shard of the model (``follow``). The layers' all-reduces make every rank's hidden
states, logits and so commits the same, so the ranks never decide anything themselves and their batches
never diverge. The step's one read stays one on each rank. While no cycle runs, the leader's worker
calls ``keep_alive`` on each turn of its loop: a message every ``pulse_s`` keeps the followers' wait for
the next one within its timeout, and finds a lost rank (GroupFailed) while the group is idle.
"""

from __future__ import annotations

import time
from typing import Any

from engine_pod.decoding.config import DecodingConfig
from engine_pod.device_memory import peak_bytes, reset_peak
from engine_pod.runner.contract import CycleOutput, Runner
from engine_pod.runner.model_interface import ServedModel
from engine_pod.scheduler.output import SchedulerOutput

STOP = ("stop",)
PULSE = ("pulse",)  # the leader is there; nothing to do


class LeaderRunner:
    """Rank 0's runner: each call is broadcast to the group first, then run on rank 0's shard."""

    def __init__(self, runner: Runner, loaded: ServedModel) -> None:
        self.runner, self.loaded, self.parallel = runner, loaded, loaded.parallel
        self.decoding: DecodingConfig = runner.decoding
        self.grid_aligned = runner.grid_aligned
        self.shares_blocks = runner.shares_blocks
        self.staggers_refreshes = runner.staggers_refreshes
        self.chunks_prefill = getattr(runner, "chunks_prefill", False)  # every rank runs the chunk rows
        self.request_defaults = runner.request_defaults
        self._last_told = time.monotonic()

    @property
    def prefix_cache_stats(self):
        return self.runner.prefix_cache_stats

    @property
    def stepper(self):
        return self.runner.stepper

    def run(self, cycle: SchedulerOutput) -> CycleOutput:
        self._tell(("run", cycle))
        return self.runner.run(cycle)

    def forget(self) -> None:
        self._tell(("forget",))
        self.runner.forget()

    def first_block_confidences(self, prompts: list[list[int]]):
        self._tell(("confidences", prompts))
        return self.runner.first_block_confidences(prompts)

    def keep_alive(self) -> None:
        """A pulse to the followers if nothing was sent for ``pulse_s`` (GroupFailed: a rank is lost)."""
        if time.monotonic() - self._last_told >= self.parallel.pulse_s:
            self._tell(PULSE)

    def grammar_problem(self, grammar) -> str | None:
        """Checked on rank 0 alone (every rank compiles the same grammar for the same tokenizer)."""
        return self.runner.grammar_problem(grammar)

    def warm_prefix(self, tokens: list[int]) -> int:
        self._tell(("warm", tokens))
        return self.runner.warm_prefix(tokens)

    def _tell(self, message: tuple) -> None:
        self.parallel.broadcast(message)
        self._last_told = time.monotonic()


def lead(runner: Runner, loaded: ServedModel, recipe: tuple[Any, ...]) -> Runner:
    """Rank 0's runner for a group (``runner`` itself for one process): the others are told the runner's
    ``recipe`` (make_runner's arguments after the model) and build theirs alike."""
    if loaded.parallel.size == 1 or not loaded.parallel.leads:
        return runner
    loaded.parallel.broadcast(("runner", loaded.config, *recipe))  # rank 0's config (its sampler too)
    loaded.parallel.started()  # the followers build theirs: the group runs under its collective timeout
    return LeaderRunner(runner, loaded)


def group_reset_peak(loaded: ServedModel, resident_window: bool = False) -> None:
    """A new peak window on every rank's device (rank 0 asks; ``device_memory.reset_peak``)."""
    loaded.parallel.broadcast(("reset_peak", resident_window))
    reset_peak(loaded.device, resident_window)


def group_peak(loaded: ServedModel) -> int:
    """The worst rank's peak memory since its window began (rank 0 asks)."""
    loaded.parallel.broadcast(("peak",))
    return loaded.parallel.max_of(peak_bytes(loaded.device))


def follow(loaded: ServedModel, make_runner) -> None:
    """A follower rank's loop: build the runner rank 0 names, run what it broadcasts, until it stops."""
    runner = None
    while True:
        kind, *body = loaded.parallel.broadcast()
        if kind == "stop":
            return
        if kind == "pulse":
            continue
        if kind == "runner":
            loaded.config, *recipe = body
            runner = make_runner(loaded, *recipe)
            loaded.parallel.started()
        elif runner is None and kind in ("run", "forget", "confidences", "warm"):
            raise RuntimeError(f"rank {loaded.parallel.rank} was sent {kind!r} before its runner")
        elif kind == "run":
            runner.run(*body)
        elif kind == "forget":
            runner.forget()
        elif kind == "confidences":
            runner.first_block_confidences(*body)
        elif kind == "warm":
            runner.warm_prefix(*body)
        elif kind == "reset_peak":
            reset_peak(loaded.device, *body)
        elif kind == "peak":
            loaded.parallel.max_of(peak_bytes(loaded.device))
        else:
            raise RuntimeError(f"rank {loaded.parallel.rank} was sent an unknown message {kind!r}")
