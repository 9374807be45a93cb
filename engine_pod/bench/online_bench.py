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
from engine_pod.bench.policies import PolicySpec, static_batch_size_for, static_widths
from engine_pod.bench.policy_caches import decoding_for, split_policy
from engine_pod.bench.prepare import prepare_requests
from engine_pod.bench.results import ModelSpec
from engine_pod.bench.workloads import load_workload
from engine_pod.decoding.config import DecodingConfig

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class OnlineConfig:
    model: ModelSpec
    workload: str
    policies: tuple[str, ...]
    decoding: DecodingConfig
    scheduling: SchedulerConfig
    loads: tuple[Load, ...]
    requests: int | None = None  # how many requests per load (default: the workload's)
    url: str | None = None  # a running server to load instead (chat requests; policies ignored)
    api_key: str | None = None
    served_model: str = "bench"
    seed: int = 0


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
        "runs": {},
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
        prepared = [r.request for r in requests]
        widths = static_widths(prepared, cfg.decoding.block_length)
        batch = static_batch_size_for(widths, cfg.scheduling.token_budget)
        for name in cfg.policies:
            spec = PolicySpec(split_policy(name)[0], cfg.scheduling, batch)
            decoding = decoding_for(name, cfg.decoding)
            for load in cfg.loads:
                if spec.through_gateway:
                    yield (
                        name,
                        load,
                        lambda load=load, spec=spec, decoding=decoding: _through_gateway(
                            loaded, decoding, spec, requests, load
                        ),
                    )
                else:
                    yield (
                        name,
                        load,
                        lambda load=load, spec=spec, decoding=decoding: run_engine_online(
                            loaded, decoding, spec, requests, load
                        ),
                    )


def _through_gateway(
    loaded, decoding: DecodingConfig, spec: PolicySpec, requests: list[OnlineRequest], load: Load
):
    from engine_pod.bench.through_gateway import serving_stack

    with serving_stack(loaded, decoding, spec, [r.request for r in requests]) as stack:
        observed = stack.serve_while(
            lambda: asyncio.run(drive(stack.url, requests, load, "bench", chat=False))
        )
    return observed, {}  # the engine's figures are the worker's (its /metrics)


def online_summary(report: dict) -> str:
    usable = report.get("usable_memory_bytes")
    lines = [
        f"{report['workload']}: {report['requests']} requests per load, target {report['target']}"
        + (f", usable memory {usable / 2**20:.0f} MiB" if usable else ""),
        f"{'run':<28}{'load':<14}{'tok/s':>9}{'1st blk p50':>12}{'p99':>8}{'lat p50':>9}{'p90':>8}"
        f"{'p99':>8}{'wait p50':>9}{'worst family p99/p50':>22}{'rows mean':>10}{'max':>5}{'waiting':>8}{'holds':>7}{'kept':>6}"
        f"{'refresh':>8}{'peak MiB':>9}",
    ]
    for name, by_load in report["runs"].items():
        for label, m in by_load.items():
            first, lat = m["first_block_s"], m["latency_s"]
            wait = (m.get("queue_wait_s") or {}).get("p50")
            worst = max(f["p99"] for f in m["latency_by_family_s"].values()) / lat["p50"]
            lines.append(
                f"{name:<28}{label:<14}{m['tokens_per_s']:>9.1f}{first.get('p50', 0):>12.2f}"
                f"{first.get('p99', 0):>8.2f}{lat['p50']:>9.2f}{lat['p90']:>8.2f}{lat['p99']:>8.2f}"
                f"{(f'{wait:.2f}' if wait is not None else '-'):>9}{worst:>22.2f}"
                f"{_figure(m, 'rows_resident_mean', '.2f'):>10}{_figure(m, 'rows_resident_max', 'd'):>5}"
                f"{_figure(m, 'rows_resident_mean_waiting', '.2f'):>8}"
                f"{_figure(m, 'rows_the_budget_holds', '.2f'):>7}"
                f"{_figure(m, 'admitted_kept_share', '.2f'):>6}{_figure(m, 'refresh_share', '.3f'):>8}"
                f"{_figure(m, 'peak_memory_bytes', '.0f', 2**20):>9}"
            )
    return "\n".join(lines)


def _figure(metrics: dict, key: str, spec: str, unit: int = 1) -> str:
    """An engine figure for the table ('-' where the engine ran elsewhere: a server, the gateway)."""
    value = metrics.get(key)
    if value is None:
        return "-"
    return format(value / unit if unit != 1 else value, spec)
