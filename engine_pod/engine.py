"""The engine step: ``schedule() -> runner.run(output) -> update_from_output()``, with per-cycle records."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from dllm_contracts.run_rules import stagger_problem_for
from dllm_contracts.scheduler_config import SchedulerConfig
from engine_pod.cpu_load import between_cycles
from engine_pod.runner.contract import CycleStats, Runner, scheduling_facts
from engine_pod.scheduler.base import Scheduler
from engine_pod.scheduler.output import SchedulerOutput
from engine_pod.scheduler.request import Request
from engine_pod.scheduler.serving import serving_scheduler

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CycleRecord:
    """What one block cycle did: the data behind the timeline plot and the padding efficiency."""

    started_s: float  # since the engine's first cycle
    duration_s: float
    rows: int  # |A|
    box_width: int  # max row width, block included
    cost: int  # what the batch held against the budget (packed: the rows' widths; dense: the box)
    forwards: int
    computed_positions: int
    useful_positions: int
    logits_materialized: int  # LM head outputs: positions x columns (the vocabulary, or k candidates)
    peak_logits: int  # the most of them at once
    admitted: int
    preempted: int
    finished: int
    refresh_positions: int = 0  # positions computed by refreshes (forwards that rewrite a dual cache)
    peak_refresh_positions: int = 0  # of those, in the cycle's largest
    refresh_quota: int | None = None  # the most one step could refresh (None: no quota)
    kv_dense_bytes: int = 0  # the dual cache's keys and values of every cached position
    kv_kept_bytes: int = 0  # of those, what it held (all, unless head-sparse)
    carried: int = 0  # rows whose block went on into the next cycle (dLLM-Serve's step-level batching)
    prefill_chunks: int = 0  # chunk rows (a long prompt's keys and values, a chunk at a time)
    prefill_chunk_tokens: int = 0  # their tokens
    chunk_wait_s: float = 0.0  # the share of the cycle's first forward decoding rows waited on chunks for
    cpu_s: float = 0.0  # this process's CPU seconds in the cycle (its work, whatever else shares the host)


@dataclass
class StepResult:
    output: SchedulerOutput  # what ran
    blocks: list[list[int] | None]  # each row's block as committed (inactive rows included; None: carried on)
    finished: list[Request]  # requests that finished at this block boundary
    logprobs: list | None = None  # per row, when some row asked: see CycleOutput.logprobs
    stats: CycleStats = field(default_factory=CycleStats)  # what the cycle computed


class Engine:
    """Drives one scheduler and one runner until every request is finished."""

    def __init__(
        self,
        runner: Runner,
        scheduler: Scheduler,
        clock: Callable[[], float] = time.perf_counter,
        record_window: int | None = None,
    ) -> None:
        for fact in ("grid_aligned", "shares_blocks"):
            if getattr(scheduler, fact) != getattr(runner, fact):
                raise ValueError(
                    f"the scheduler was built with {fact}={getattr(scheduler, fact)} and the runner's model "
                    f"has {getattr(runner, fact)}: build it with scheduling_facts(runner)"
                )
        if scheduler.staggers_refreshes and not runner.staggers_refreshes:
            raise ValueError(stagger_problem_for(runner.loaded.family, runner.decoding))
        self.runner = runner
        self.scheduler = scheduler
        self.clock = clock
        # the last ``record_window`` cycles (all of them when None: a benchmark's run is finite)
        self.records: deque[CycleRecord] = deque(maxlen=record_window)
        self.margins: dict[str, list[float]] = {}  # per request, per generated token (runner records them)
        self._start: float | None = None
        self._reset = False

    def reset_records(self) -> None:
        """Forget the cycles run so far (a benchmark's untimed warm-up) when the next one starts, which
        is then at 0 (safe from another thread: the engine's own does the clearing)."""
        self._reset = True

    def add_request(self, request: Request) -> None:
        self.scheduler.add(request)

    def has_work(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> StepResult:
        """Run one block cycle: every row's committed block and the requests that finished."""
        output = self.scheduler.schedule()
        if output.is_empty:
            return StepResult(output, [], [])
        begin = self.clock()
        if self._reset:
            self.records.clear()
            self._start, self._reset = None, False
        if self._start is None:
            self._start = begin
        between_cycles()  # torch's threads follow the load, never inside a cycle (cpu_load.py)
        cpu_began = time.process_time()
        cycle = self.runner.run(output)
        carried = cycle.carried or []
        if any(carried):  # blocks that go on in the next cycle are not committed yet
            cycle.blocks = [None if c else block for block, c in zip(cycle.blocks, carried)]
            if cycle.logprobs is not None:
                cycle.logprobs = [None if c else values for values, c in zip(cycle.logprobs, carried)]
        self._keep_margins(output, cycle.margins)
        finished = self.scheduler.update_from_output(output, cycle.blocks)
        self.records.append(
            CycleRecord(
                started_s=begin - self._start,
                duration_s=self.clock() - begin,
                rows=len(output.rows),
                box_width=output.box_width,
                cost=output.cost,
                forwards=cycle.stats.forwards,
                computed_positions=cycle.stats.computed_positions,
                useful_positions=cycle.stats.useful_positions,
                logits_materialized=cycle.stats.logits_materialized,
                peak_logits=cycle.stats.peak_logits,
                admitted=len(output.admitted),
                preempted=len(output.preempted),
                finished=len(finished),
                refresh_positions=cycle.stats.refresh_positions,
                peak_refresh_positions=cycle.stats.peak_refresh_positions,
                refresh_quota=output.refresh_quota,
                kv_dense_bytes=cycle.stats.kv_dense_bytes,
                kv_kept_bytes=cycle.stats.kv_kept_bytes,
                carried=sum(carried),
                prefill_chunks=cycle.stats.prefill_chunks,
                prefill_chunk_tokens=cycle.stats.prefill_chunk_tokens,
                chunk_wait_s=cycle.stats.chunk_wait_s,
                cpu_s=time.process_time() - cpu_began,
            )
        )
        return StepResult(output, cycle.blocks, finished, cycle.logprobs, cycle.stats)

    def _keep_margins(self, output, margins: list[list[float]] | None) -> None:
        if margins is None:
            return
        for request_id, row, row_margins in zip(output.request_ids, output.rows, margins):
            if row.active:
                self.margins.setdefault(request_id, []).extend(row_margins)

    def run(self, on_finished: Callable[[Request], None] | None = None) -> None:
        """Step until no request is left unfinished."""
        while self.has_work():
            for request in self.step().finished:
                if on_finished is not None:
                    on_finished(request)


def scheduler_for(
    runner: Runner, policy: str, scheduling: SchedulerConfig, batch_size: int = 1, **options
) -> Scheduler:
    """``policy``'s scheduler (one of SERVING_POLICIES) for ``runner``'s model and decoding: its block
    length, EOS ids and masked suffix, the share of a row's context its cache keeps, and the scheduling
    facts of its model (``options``: the clock)."""
    decoding, config = runner.decoding, runner.loaded.config
    return serving_scheduler(
        policy,
        decoding.block_length,
        config.eos_token_ids,
        scheduling,
        batch_size,
        kept_share=1.0  # a cache that keeps every position; DiffusionGemma's config names no K/V heads
        if decoding.sparse.mode == "off"
        else decoding.sparse.context_kept_share(config.num_kv_heads),
        ignore_eos=decoding.ignore_eos,
        masked_suffix=decoding.masked_suffix,
        **scheduling_facts(runner),
        **options,
    )
