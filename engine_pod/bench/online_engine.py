"""A policy's engine alone under an online load: requests join the scheduler when they arrive (on the
run's clock, bench/run_clock.py), as they would behind a queue, with no HTTP or Redis in between."""

from __future__ import annotations

from dllm_contracts.request_params import RequestParams
from dllm_contracts.text import completion_tokens
from engine_pod.bench.execute import warm_up
from engine_pod.bench.online import Load, Observed, OnlineRequest
from engine_pod.bench.policies import PolicySpec, build_scheduler
from engine_pod.bench.report import chunk_metrics, refresh_metrics, residency_metrics, work_metrics
from engine_pod.bench.run_clock import RunClock
from engine_pod.decoding.config import DecodingConfig
from engine_pod.device_memory import peak_bytes, reset_peak
from engine_pod.engine import Engine, StepResult
from engine_pod.loading.loader import LoadedModel
from engine_pod.runner.factory import make_runner
from engine_pod.scheduler.request import Request


class _Run:
    """The bookkeeping of one online run: what has arrived, what the client has seen."""

    def __init__(
        self, engine: Engine, decoding: DecodingConfig, requests: list[OnlineRequest], clock: RunClock
    ) -> None:
        self.engine, self.decoding, self.requests, self.clock = engine, decoding, requests, clock
        engine.scheduler.clock = clock.now  # arrivals, admission's waits and first schedules on one clock
        self.sent: dict[str, float] = {}
        self.first_block: dict[str, float] = {}
        self.observed: dict[str, Observed] = {}
        self.unadmitted: list[Request] = []  # sent, not yet scheduled
        self.waited_at: list[int] = []  # the cycles (engine.records' indices) leaving a request waiting

    def now(self) -> float:
        return self.clock.now()

    def send(self, item: OnlineRequest) -> None:
        prepared = item.request
        request = self.engine.scheduler.request_for(
            prepared.request_id,
            prepared.prompt_ids,
            RequestParams(max_tokens=prepared.max_tokens),
            arrival_time=self.now(),
        )
        self.sent[prepared.request_id] = self.now()
        self.engine.add_request(request)
        self.unadmitted.append(request)

    def step(self, families: dict[str, str]) -> list[Request]:
        result: StepResult = self.engine.step()
        at = self.now()
        self.unadmitted = [r for r in self.unadmitted if r.first_scheduled_time is None]
        if self.unadmitted and self.engine.records:
            self.waited_at.append(len(self.engine.records) - 1)
        for request_id, row, block in zip(result.output.request_ids, result.output.rows, result.blocks):
            if row.active and block is not None:  # committed (a chunk or carried block is not yet)
                self.first_block.setdefault(request_id, at)
        eos = self.engine.runner.loaded.config.eos_token_ids
        for request in result.finished:
            rid = request.request_id
            scheduled = request.first_scheduled_time
            self.observed[rid] = Observed(
                families[rid],
                self.sent[rid],
                at,
                self.first_block.get(rid),
                completion_tokens(request.generated[: request.max_tokens], eos),  # a client's: cut to the ask
                scheduled,
            )
        return result.finished


def run_engine_online(
    loaded: LoadedModel,
    decoding: DecodingConfig,
    spec: PolicySpec,
    requests: list[OnlineRequest],
    load: Load,
    clock: str = "wall",
) -> tuple[list[Observed], dict]:
    """Each request as observed, and the engine's figures: its refreshes, prefill chunks and the rows
    resident per cycle (bench/report.py), the share of a row's context its admission counts as held, and
    the peak memory (CUDA: this run's; CPU: the process's since it started)."""
    runner = make_runner(loaded, decoding, spec.token_budget, record_margins=False)
    engine = Engine(runner, build_scheduler(spec, runner))
    warm_up(engine.runner, [r.request for r in requests])
    reset_peak(loaded.device)
    families = {r.request.request_id: r.family for r in requests}
    run = _Run(engine, decoding, requests, RunClock(clock))
    if load.rate is not None:
        _open_loop(run, families, load.arrival_offsets(len(requests)))
    else:
        _closed_loop(run, families, load.concurrency)
    figures = refresh_metrics(engine.records) | chunk_metrics(engine.records) | work_metrics(engine.records)
    figures |= residency_metrics(engine.records, [engine.records[i] for i in run.waited_at], engine.scheduler)
    return list(run.observed.values()), figures | {
        "admitted_kept_share": getattr(engine.scheduler, "kept_share", 1.0),
        "peak_memory_bytes": peak_bytes(loaded.device),
    }


def _open_loop(run: _Run, families: dict[str, str], offsets: list[float]) -> None:
    waiting = list(zip(offsets, run.requests))
    while waiting or run.engine.has_work():
        while waiting and waiting[0][0] <= run.now():
            run.send(waiting.pop(0)[1])
        if run.engine.has_work():
            run.step(families)
        elif waiting:
            run.clock.wait_until(waiting[0][0])


def _closed_loop(run: _Run, families: dict[str, str], concurrency: int) -> None:
    waiting = list(run.requests)
    for _ in range(min(concurrency, len(waiting))):
        run.send(waiting.pop(0))
    while run.engine.has_work():
        for _ in run.step(families):  # each finished request's client sends its next one
            if waiting:
                run.send(waiting.pop(0))
