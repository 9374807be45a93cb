"""``dllm bench --arrival-rate R`` / ``--concurrency C``: every policy under the same online load, through
the engine alone and through the whole serving path (gateway policy), or a running server (``--url``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass

from dllm_contracts.scheduler_config import SchedulerConfig
from engine_pod.bench.online import Load, OnlineRequest, online_metrics, repeat_to
from engine_pod.bench.online_engine import run_engine_online
from engine_pod.bench.online_http import drive
from engine_pod.bench.online_summary import policy_runs
from engine_pod.bench.policies import PolicySpec, static_batch_size_for, static_widths
from engine_pod.bench.policy_caches import decoding_for, split_policy
from engine_pod.bench.prepare import prepare_requests
from engine_pod.bench.results import ModelSpec
from engine_pod.bench.workloads import load_workload
from engine_pod.decoding.config import DecodingConfig
from engine_pod.isolation import ChildDied, run_in_child

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class OnlineConfig:
    model: ModelSpec
    workload: str
    policies: tuple[str, ...]
    decoding: DecodingConfig
    scheduling: SchedulerConfig
    loads: tuple[Load, ...]
    prefill_chunks: tuple[int | None, ...] = ()  # each policy runs with each (empty: scheduling's own)
    requests: int | None = None  # how many requests per load (default: the workload's)
    url: str | None = None  # a running server to load instead (chat requests; policies ignored)
    api_key: str | None = None
    served_model: str = "bench"
    seed: int = 0
    # on a CPU, each engine-alone run in a fresh process of its own, so that its peak memory is its own
    # (resident memory cannot be reset within a process)
    isolate: bool = False
    clock: str = "wall"  # what engine-alone runs are timed by (bench/run_clock.py)


def _requests(cfg: OnlineConfig) -> list[OnlineRequest]:
    items = load_workload(cfg.workload)
    config, tokenizer = cfg.model.metadata()
    prepared = prepare_requests(items, config, tokenizer, cfg.seed)
    requests = [OnlineRequest(p, item.task or "all", item.prompt) for p, item in zip(prepared, items)]
    return repeat_to(requests, cfg.requests or len(requests))


def run_online_benchmark(cfg: OnlineConfig, on_run: Callable[[dict], None] | None = None) -> dict:
    requests = _requests(cfg)
    report = {
        "workload": cfg.workload,
        "requests": len(requests),
        "decoding": asdict(cfg.decoding),
        "scheduling": asdict(cfg.scheduling),
        "loads": [asdict(load) | {"label": load.label} for load in cfg.loads],
        "target": cfg.url or "in-process",
        "clock": "wall" if cfg.url else cfg.clock,
        "runs": {},
        "prefill_chunk_by_run": {
            name: scheduling.prefill_chunk
            for name, _, scheduling in policy_runs(cfg.policies, cfg.scheduling, cfg.prefill_chunks)
        },  # the setting each run had (None: the default from the budget; 0: whole prompts)
    }
    for name, load, run in _runs(cfg, requests):
        logger.info("%s under %s: %d requests", name, load.label, len(requests))
        observed, engine_figures = run()
        report["runs"].setdefault(name, {})[load.label] = online_metrics(observed) | engine_figures
        if on_run is not None:
            on_run(report)
    return report


def _runs(cfg: OnlineConfig, requests: list[OnlineRequest]):
    """(policy, load, a function that runs it) for every pair, in the order they run: each run gives its
    requests as observed and the engine's figures where the engine runs in this process."""
    if cfg.url:
        for load in cfg.loads:
            yield (
                "server",
                load,
                lambda load=load: (
                    asyncio.run(
                        drive(cfg.url, requests, load, cfg.served_model, chat=True, api_key=cfg.api_key)
                    ),
                    {},
                ),
            )
        return
    with cfg.model.loaded(cfg.seed) as loaded:  # for as long as the runs are drawn
        # a CPU run's peak is its own process's (the same measure as `dllm profile`'s points)
        isolated = cfg.isolate and loaded.device.type == "cpu" and loaded.parallel.size == 1
        prepared = [r.request for r in requests]
        widths = static_widths(prepared, cfg.decoding.block_length)
        batch = static_batch_size_for(widths, cfg.scheduling.token_budget)
        for name, policy, scheduling in policy_runs(cfg.policies, cfg.scheduling, cfg.prefill_chunks):
            spec = PolicySpec(split_policy(policy)[0], scheduling, batch)
            decoding = decoding_for(policy, cfg.decoding)
            for load in cfg.loads:
                if spec.through_gateway:
                    yield (
                        name,
                        load,
                        lambda load=load, spec=spec, decoding=decoding: _through_gateway(
                            loaded, decoding, spec, requests, load
                        ),
                    )
                elif isolated:
                    yield (
                        name,
                        load,
                        lambda load=load, spec=spec, decoding=decoding: _engine_in_child(
                            cfg, decoding, spec, requests, load
                        ),
                    )
                else:
                    yield (
                        name,
                        load,
                        lambda load=load, spec=spec, decoding=decoding: _engine_here(
                            loaded, decoding, spec, requests, load, cfg.clock
                        ),
                    )


# what a run's peak_memory_bytes is (report's peak_measure)
PEAK_OWN_PROCESS = "resident high-water mark of the run's own process: imports, weights and engine"
PEAK_SINCE_RESET = "allocator's reserved peak since the run began"
PEAK_THIS_PROCESS = "resident high-water mark of the bench process since it started (every run before too)"


def _engine_here(loaded, decoding: DecodingConfig, spec: PolicySpec, requests, load: Load, clock: str):
    observed, figures = run_engine_online(loaded, decoding, spec, requests, load, clock)
    measure = PEAK_SINCE_RESET if loaded.device.type == "cuda" else PEAK_THIS_PROCESS
    return observed, figures | {"peak_measure": measure}


def _engine_fresh(cfg: OnlineConfig, decoding: DecodingConfig, spec: PolicySpec, requests, load: Load):
    """In a spawned process: the model loaded there, the run, its figures (its peak its process's)."""
    import torch

    torch.manual_seed(cfg.seed)
    with cfg.model.loaded(cfg.seed) as loaded:
        observed, figures = run_engine_online(loaded, decoding, spec, requests, load, cfg.clock)
    return observed, figures | {"peak_measure": PEAK_OWN_PROCESS}


def _engine_in_child(cfg: OnlineConfig, decoding: DecodingConfig, spec: PolicySpec, requests, load: Load):
    try:
        return run_in_child(_engine_fresh, cfg, decoding, spec, requests, load)
    except ChildDied as exc:
        raise RuntimeError(f"benchmark child for {spec.name} under {load.label} died ({exc})") from None


def _through_gateway(
    loaded, decoding: DecodingConfig, spec: PolicySpec, requests: list[OnlineRequest], load: Load
):
    from engine_pod.bench.through_gateway import serving_stack

    with serving_stack(loaded, decoding, spec, [r.request for r in requests]) as stack:
        observed = stack.serve_while(
            lambda: asyncio.run(drive(stack.url, requests, load, "bench", chat=False))
        )
    return observed, {}  # the engine's figures are the worker's (its /metrics)
