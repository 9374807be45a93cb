"""``dllm bench`` end to end: prepare the workload, run every policy, compare, report, plot."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import torch

from dllm_contracts.scheduler_config import SchedulerConfig
from engine_pod.bench.calibrate import calibrate_threshold
from engine_pod.bench.execute import run_policy, run_policy_isolated
from engine_pod.bench.pinning import Pinning
from engine_pod.bench.policies import PolicySpec, static_batch_size_for, static_widths
from engine_pod.bench.prepare import prepare_requests
from engine_pod.bench.report import compare_outputs, outputs_digest, policy_metrics, summarise, timeline
from engine_pod.bench.results import ModelSpec, PolicyRun
from engine_pod.bench.workloads import load_workload
from engine_pod.decoding.config import DecodingConfig
from engine_pod.device_memory import device_name
from engine_pod.families.registry import family_of
from engine_pod.isolation import run_in_child
from engine_pod.loading.loader import LoadedModel

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BenchConfig:
    model: ModelSpec
    workload: str
    policies: tuple[str, ...]
    decoding: DecodingConfig
    scheduling: SchedulerConfig  # BlockServe's; static's batch size is derived from its token budget
    batch_size: int | None = None  # static batch size; default: the largest that fits the token budget
    limit: int | None = None  # use only the first N requests of the workload
    isolate: bool = True  # one child process per policy (separate peak memory)
    record_margins: bool = True
    seed: int = 0
    calibrate_fraction: float | None = None  # set the threshold so this share of confidences reach it
    # run the policy list this many times, round-robin (see _round_order), and report each policy's median
    # run (a shared, noisy machine moves single runs by a third)
    repeat: int = 1
    pin: bool = False  # the engine on one core, the serving path on the others (see bench/pinning.py)
    # run every policy with the block prefix cache on, off, or both ways (its runs then named
    # ``policy/prefix-cache-on`` and ``policy/prefix-cache-off``)
    prefix_cache: tuple[bool, ...] = (True,)
    # and with batch-invariant products, without, or both ways (``.../batch-invariant-on`` and ``-off``)
    batch_invariant: tuple[bool, ...] = (False,)

    @property
    def runs(self) -> tuple[str, ...]:
        """What each round runs: the policies, each both ways where a setting is compared."""
        names = self.policies
        for field, suffixes in COMPARED.items():
            settings = getattr(self, field)
            if len(settings) > 1:
                names = tuple(f"{name}{suffixes[on]}" for name in names for on in settings)
        return names

    def run_setup(self, name: str) -> tuple[str, DecodingConfig]:
        """The policy a run of ``runs`` is, and its decoding (its compared settings on or off)."""
        chosen = {field: getattr(self, field)[0] for field in COMPARED}
        for field, suffixes in reversed(COMPARED.items()):  # the last compared setting's suffix is last
            for on, suffix in suffixes.items():
                if len(getattr(self, field)) > 1 and name.endswith(suffix):
                    name, chosen[field] = name.removesuffix(suffix), on
        return name, replace(self.decoding, **chosen)


CACHE_SUFFIX = {True: "/prefix-cache-on", False: "/prefix-cache-off"}
INVARIANT_SUFFIX = {True: "/batch-invariant-on", False: "/batch-invariant-off"}
COMPARED = {
    "prefix_cache": CACHE_SUFFIX,
    "batch_invariant": INVARIANT_SUFFIX,
}  # BenchConfig's field: runs' names


def _calibrate(loaded: LoadedModel | None, cfg: BenchConfig, prompts: list[list[int]]) -> dict:
    if loaded is None:
        return run_in_child(_calibrate_fresh, cfg, prompts)
    return calibrate_threshold(loaded, cfg.decoding, prompts, cfg.calibrate_fraction)


def _calibrate_fresh(cfg: BenchConfig, prompts: list[list[int]]) -> dict:
    with cfg.model.loaded(cfg.seed) as loaded:
        return calibrate_threshold(loaded, cfg.decoding, prompts, cfg.calibrate_fraction)


def run_benchmark(cfg: BenchConfig, on_policy: Callable[[dict], None] | None = None) -> dict:
    """Every policy of ``cfg`` on its workload; ``on_policy`` gets the report so far after each one."""
    with contextlib.ExitStack() as held:
        return _run_benchmark(cfg, on_policy, held)


def _run_benchmark(cfg: BenchConfig, on_policy: Callable[[dict], None] | None, held) -> dict:
    items = load_workload(cfg.workload)[: cfg.limit]
    config, tokenizer = cfg.model.metadata()
    requests = prepare_requests(items, config, tokenizer, cfg.seed)
    widths = static_widths(requests, cfg.decoding.block_length)
    batch = cfg.batch_size or static_batch_size_for(widths, cfg.scheduling.token_budget)
    loaded = None if cfg.isolate else held.enter_context(cfg.model.loaded(cfg.seed))
    calibration = None
    if cfg.calibrate_fraction is not None:
        calibration = _calibrate(loaded, cfg, [r.prompt_ids for r in requests])
        logger.info(
            "calibrated threshold %.6g (%s of confidences reach it)",
            calibration["threshold"],
            cfg.calibrate_fraction,
        )
        cfg = replace(cfg, decoding=replace(cfg.decoding, threshold=calibration["threshold"]))
    pinning = Pinning.for_this_machine() if cfg.pin else None
    all_runs: dict[str, list[PolicyRun]] = {name: [] for name in cfg.runs}
    for round_number in range(cfg.repeat):
        for name in _round_order(cfg.runs, round_number):
            policy, decoding = cfg.run_setup(name)
            spec = PolicySpec(policy, cfg.scheduling, batch)
            logger.info("running policy %s on %d requests (run %d)", name, len(requests), round_number + 1)
            if loaded is None:
                run = run_policy_isolated(
                    cfg.model, decoding, spec, requests, cfg.record_margins, cfg.seed, pinning
                )
            else:
                run = run_policy(loaded, decoding, spec, requests, cfg.record_margins, pinning=pinning)
            run.policy = name
            all_runs[name].append(run)
            runs = {n: _median_run(r) for n, r in all_runs.items() if r}
            report = _report(cfg, runs, requests, widths, batch, config.eos_token_ids, calibration)
            report["family_settings"] = _family_settings(config, cfg.decoding)
            report["wall_s_per_run"] = {n: [round(x.wall_s, 4) for x in r] for n, r in all_runs.items() if r}
            report["cpu_s_per_run"] = {
                n: [round(x.cpu_s, 3) for x in r if x.cpu_s] for n, r in all_runs.items() if r
            }
            if on_policy is not None:
                on_policy(report)
    return report


def _family_settings(config, decoding: DecodingConfig) -> dict | None:
    """The service's values of the per-request settings the model's family adds (DiffusionGemma's
    sampler's), as the runner sets them; None for a family that adds none."""
    settings = family_of(config).service_settings(config, decoding.steps_per_block)
    return None if settings is None else asdict(settings)


def _round_order(policies: tuple[str, ...], round_number: int) -> tuple[str, ...]:
    """Round r starts with policy r (mod their count): each policy's runs take every place in a round in
    turn, so whatever a place costs (a machine that warms up or slows down over a round) falls on every
    policy alike instead of always on the same one."""
    start = round_number % len(policies)
    return policies[start:] + policies[:start]


def _median_run(runs: list[PolicyRun]) -> PolicyRun:
    """The run of median wall time (of an even count, the slower middle one); every run of a policy
    generates the same tokens."""
    return sorted(runs, key=lambda run: run.wall_s)[len(runs) // 2]


def _device_name(device: str) -> str:
    if device.startswith("cuda") and not torch.cuda.is_available():
        return device
    return device_name(torch.device(device))  # a GPU's name, or the CPU's model


def _report(
    cfg: BenchConfig, runs: dict[str, PolicyRun], requests, widths, batch: int, eos_ids, calibration
) -> dict:
    policies = {name: policy_metrics(run, eos_ids) for name, run in runs.items()}
    static = policies.get("static")
    for name, metrics in policies.items():
        if name.startswith("blockserve") and static and static["tokens_per_s"]:
            metrics["speedup_vs_static"] = round(metrics["tokens_per_s"] / static["tokens_per_s"], 3)
        for field, suffixes in COMPARED.items():  # each compared setting's run against its run without
            without = policies.get(name.replace(suffixes[True], suffixes[False]))
            if suffixes[True] in name and without and without["tokens_per_s"]:
                metrics[f"vs_{field}_off"] = round(metrics["tokens_per_s"] / without["tokens_per_s"], 3)
                if metrics.get("tokens_per_cpu_s") and without.get("tokens_per_cpu_s"):
                    ratio = metrics["tokens_per_cpu_s"] / without["tokens_per_cpu_s"]
                    metrics[f"cpu_vs_{field}_off"] = round(ratio, 3)
        engine = policies.get(PolicySpec(cfg.run_setup(name)[0], cfg.scheduling, batch).served_policy)
        if name.startswith("gateway") and engine and engine["tokens_per_s"]:  # against its engine alone
            metrics["throughput_vs_engine"] = round(metrics["tokens_per_s"] / engine["tokens_per_s"], 3)
    comparison = compare_outputs(runs, requests, cfg.decoding.block_length)
    return {
        "model": cfg.model.model,
        "device": cfg.model.device,
        "device_name": _device_name(cfg.model.device),
        "torch_version": torch.__version__,
        "dtype": cfg.model.dtype,
        "workload": {
            "name": cfg.workload,
            "requests": len(requests),
            "prompt_tokens": summarise([len(r.prompt_ids) for r in requests]),
            "max_tokens": summarise([r.max_tokens for r in requests]),
        },
        "decoding": asdict(cfg.decoding),
        "threshold_calibration": calibration,
        "token_budget": cfg.scheduling.token_budget,
        "min_padding_efficiency": cfg.scheduling.min_padding_efficiency,
        "scheduling": asdict(cfg.scheduling),
        "static_batch_size": batch,
        "prefix_cache": ["on" if on else "off" for on in cfg.prefix_cache],
        "batch_invariant": ["on" if on else "off" for on in cfg.batch_invariant],
        "pinned": cfg.pin,  # the engine on one core (one torch thread), the serving path on the others
        "static_max_box_tokens": max(
            len(widths[i : i + batch]) * max(widths[i : i + batch]) for i in range(0, len(widths), batch)
        ),
        "policies": policies,
        "outputs_identical": comparison["outputs_identical"],
        "output_comparison": comparison,
        # each policy's answers, as one hash: two runs (another tensor-parallel size, another machine) compare
        "outputs_sha256": {name: outputs_digest(run) for name, run in runs.items()},
        "tensor_parallel": cfg.model.tensor_parallel,
        "expert_parallel": cfg.model.expert_parallel,
        "latencies": {name: [o.latency_s for o in run.outcomes.values()] for name, run in runs.items()},
        "timelines": {name: timeline(run) for name, run in runs.items()},
    }
