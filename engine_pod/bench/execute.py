"""Run one policy over a prepared workload, in a child process of its own when asked; the one place that
dispatches a policy to the engine alone or through the serving path.

A child per policy gives each its own peak resident memory (CPU) and a clean allocator (CUDA).
"""

from __future__ import annotations

import os
import time

import torch
from tqdm import tqdm

from dllm_contracts.heap import freeze_loaded_objects
from dllm_contracts.text import cut_at_eos
from engine_pod.bench.pinning import Pinning
from engine_pod.bench.policies import PolicySpec, build_scheduler
from engine_pod.bench.results import ModelSpec, PolicyRun, PreparedRequest, RequestOutcome
from engine_pod.decoding.config import DecodingConfig
from engine_pod.device_memory import peak_bytes, reset_peak
from engine_pod.engine import Engine
from engine_pod.isolation import ChildDied, run_in_child
from engine_pod.loading.loader import LoadedModel
from engine_pod.runner.contract import Runner
from engine_pod.runner.factory import make_runner
from engine_pod.scheduler.base import Scheduler
from engine_pod.scheduler.cycle_row import CycleRow
from engine_pod.scheduler.output import SchedulerOutput
from engine_pod.scheduler.request import Request


def warm_up(runner: Runner, requests: list[PreparedRequest]) -> None:
    """One untimed block cycle, so that one-off kernel and allocator set-up is not charged to a policy
    (and nothing it computed is left cached for the timed run)."""
    if requests:
        packed = runner.decoding.sparse.on  # the head-sparse cache runs packed rows only
        runner.run(SchedulerOutput.of_rows([CycleRow(tuple(requests[0].prompt_ids))], packed=packed))
        runner.forget()


class FollowUps:
    """A chat's next turns: each sent when the turn before it is answered, its history before it."""

    def __init__(self, requests: list[PreparedRequest], scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.waiting: dict[str, list[PreparedRequest]] = {}
        for item in requests:
            if item.follows is not None:
                self.waiting.setdefault(item.follows, []).append(item)
        self.first = [item for item in requests if item.follows is None]
        self.prompts = {item.request_id: list(item.prompt_ids) for item in self.first}

    def request(self, item: PreparedRequest) -> Request:
        prompt = self.prompts[item.request_id]
        return self.scheduler.request_for(item.request_id, prompt, item.max_tokens)

    def after(self, request_id: str, answer: list[int]) -> list[Request]:
        """The turns that follow ``request_id``, now that its answer is known."""
        history = self.prompts.pop(request_id) + answer
        nexts = []
        for item in self.waiting.pop(request_id, []):
            self.prompts[item.request_id] = history + list(item.prompt_ids)
            nexts.append(self.request(item))
        return nexts


def run_policy(
    loaded: LoadedModel,
    decoding: DecodingConfig,
    spec: PolicySpec,
    requests: list[PreparedRequest],
    record_margins: bool = True,
    progress: bool = True,
    pinning: Pinning | None = None,
) -> PolicyRun:
    """One policy's run; with ``pinning``, the engine on its core (and the serving path on the others)."""
    if pinning is not None:
        pinning.pin_engine()
    if spec.through_gateway:
        from engine_pod.bench.through_gateway import run_through_gateway

        if any(item.follows is not None for item in requests):
            raise ValueError("a multi-turn workload runs on the engine alone (not the gateway policies)")

        return run_through_gateway(loaded, decoding, spec, requests, pinning)
    eos = loaded.config.eos_token_ids
    margins = record_margins and loaded.family.records_margins  # where the family's runner can
    runner = make_runner(loaded, decoding, spec.token_budget, record_margins=margins)
    engine = Engine(runner, build_scheduler(spec, runner))
    turns = FollowUps(requests, engine.scheduler)
    for item in turns.first:
        engine.add_request(turns.request(item))
    warm_up(engine.runner, requests)
    freeze_loaded_objects()  # as a worker does when it starts serving
    reset_peak(loaded.device)
    loaded.parallel.clear_counts()  # the run's collectives, not the load's or the warm-up's
    outcomes: dict[str, RequestOutcome] = {}
    bar = tqdm(total=len(requests), desc=spec.name, unit="req", disable=not progress, leave=False)
    start, cpu_start = time.perf_counter(), time.process_time()

    def finished(request: Request) -> None:
        reason = request.finish_reason.value if request.finish_reason else "length"
        answer = request.generated[: request.max_tokens]  # what a client gets: whole blocks overshoot
        outcomes[request.request_id] = RequestOutcome(list(answer), reason, time.perf_counter() - start)
        bar.update(1)
        for follow_up in turns.after(request.request_id, cut_at_eos(answer, eos)):
            engine.add_request(follow_up)

    engine.run(finished)
    if loaded.device.type == "cuda":
        torch.cuda.synchronize(loaded.device)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    bar.close()
    for request_id, margins in engine.margins.items():
        if request_id in outcomes:
            outcomes[request_id].margins = margins
    cores = {"engine": sorted(os.sched_getaffinity(0))} if pinning else None
    run = PolicyRun(spec.name, wall, peak_bytes(loaded.device), outcomes, list(engine.records), cores)
    run.cpu_s = cpu
    if loaded.parallel.size > 1:
        run.collectives, run.collective_bytes = dict(loaded.parallel.counts), dict(loaded.parallel.sent)
    return run


def _run_in_this_process(
    model: ModelSpec, decoding, spec, requests, record_margins, seed, pinning
) -> PolicyRun:
    torch.manual_seed(seed)
    with model.loaded(seed) as loaded:
        return run_policy(loaded, decoding, spec, requests, record_margins, pinning=pinning)


def run_policy_isolated(
    model: ModelSpec,
    decoding: DecodingConfig,
    spec: PolicySpec,
    requests: list[PreparedRequest],
    record_margins: bool,
    seed: int = 0,
    pinning: Pinning | None = None,
) -> PolicyRun:
    """``run_policy`` in a fresh process: its peak memory is this policy's alone."""
    try:
        return run_in_child(
            _run_in_this_process, model, decoding, spec, requests, record_margins, seed, pinning
        )
    except ChildDied as exc:
        raise RuntimeError(f"benchmark child for policy {spec.name} died ({exc})") from None
