"""What ``dllm bench`` prints after an online load: every run (a policy, with each prefill chunk size when
several were asked for) under every load, then, where the workload has several task families (short
requests beside long prompts), each family's latency and first block beside the run's throughput and its
prefill chunks."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from dllm_contracts.scheduler_config import SchedulerConfig


def policy_runs(
    policies: tuple[str, ...], scheduling: SchedulerConfig, chunks: tuple[int | None, ...]
) -> Iterator[tuple[str, str, SchedulerConfig]]:
    """(run name, its policy, its scheduling) in the order they run: each policy with each chunk size; a run is named
    ``POLICY chunk SIZE`` when several sizes are compared, else by its policy."""
    for policy in policies:
        if len(chunks) < 2:
            yield policy, policy, replace(scheduling, prefill_chunk=chunks[0]) if chunks else scheduling
            continue
        for chunk in chunks:
            yield f"{policy} chunk {chunk_label(chunk)}", policy, replace(scheduling, prefill_chunk=chunk)


def online_summary(report: dict) -> str:
    usable, limit = report.get("usable_memory_bytes"), report.get("memory_limit_bytes")
    width = max([28, *(len(name) + 2 for name in report["runs"])])
    lines = [
        f"{report['workload']}: {report['requests']} requests per load, target {report['target']}"
        + (
            f", timed by the engine's CPU seconds ({report['clock']})"
            if report.get("clock", "wall") != "wall"
            else ""
        )
        + (f", memory limit {limit / 2**20:.0f} MiB" if limit else "")
        + (f", usable memory {usable / 2**20:.0f} MiB" if usable else ""),
        f"{'run':<{width}}{'load':<14}{'tok/s':>9}{'1st blk p50':>12}{'p99':>8}{'lat p50':>9}{'p90':>8}"
        f"{'p99':>8}{'wait p50':>9}{'worst family p99/p50':>22}{'rows mean':>10}{'max':>5}{'waiting':>8}"
        f"{'holds':>7}{'kept':>6}{'refresh':>8}{'peak MiB':>9}"
        + (f"{'<= limit':>9}" if limit else "")
        + (f"{'<= usable':>10}" if usable else ""),
    ]
    for name, by_load in report["runs"].items():
        for label, m in by_load.items():
            first, lat = m["first_block_s"], m["latency_s"]
            wait = (m.get("queue_wait_s") or {}).get("p50")
            worst = max(f["p99"] for f in m["latency_by_family_s"].values()) / lat["p50"]
            lines.append(
                f"{name:<{width}}{label:<14}{m['tokens_per_s']:>9.1f}{first.get('p50', 0):>12.2f}"
                f"{first.get('p99', 0):>8.2f}{lat['p50']:>9.2f}{lat['p90']:>8.2f}{lat['p99']:>8.2f}"
                f"{(f'{wait:.2f}' if wait is not None else '-'):>9}{worst:>22.2f}"
                f"{_figure(m, 'rows_resident_mean', '.2f'):>10}{_figure(m, 'rows_resident_max', 'd'):>5}"
                f"{_figure(m, 'rows_resident_mean_waiting', '.2f'):>8}"
                f"{_figure(m, 'rows_the_budget_holds', '.2f'):>7}"
                f"{_figure(m, 'admitted_kept_share', '.2f'):>6}{_figure(m, 'refresh_share', '.3f'):>8}"
                f"{_figure(m, 'peak_memory_bytes', '.0f', 2**20):>9}"
                + (f"{_under(m, limit):>9}" if limit else "")
                + (f"{_under(m, usable):>10}" if usable else "")
            )
    measures = sorted(
        {m["peak_measure"] for by in report["runs"].values() for m in by.values() if "peak_measure" in m}
    )
    lines += [f"peak memory: {measure}" for measure in measures]
    return "\n".join(lines + family_lines(report, width))


def add_memory_bounds(report: dict, profile) -> None:
    """The profile's (a ProfileSummary, or None) memory limit and the share of it it plans for, and each run's
    peak against them (``mark_peaks``)."""
    report["usable_memory_bytes"] = profile.usable_memory_bytes if profile else None
    report["memory_limit_bytes"] = profile.memory_limit_bytes if profile else None
    mark_peaks(report)


def mark_peaks(report: dict) -> None:
    """Each run's ``peak_within_limit`` and ``peak_within_usable``: its peak memory against the profile's
    memory limit and the share of it the profile plans for (where both are known)."""
    bounds = {"limit": report.get("memory_limit_bytes"), "usable": report.get("usable_memory_bytes")}
    for by_load in report["runs"].values():
        for metrics in by_load.values():
            for name, bound in bounds.items():
                if bound and metrics.get("peak_memory_bytes") is not None:
                    metrics[f"peak_within_{name}"] = metrics["peak_memory_bytes"] <= bound


def _under(metrics: dict, bound: int) -> str:
    """Whether the run's peak stayed within ``bound`` ('-' where not measured here)."""
    peak = metrics.get("peak_memory_bytes")
    return "-" if peak is None else "yes" if peak <= bound else "NO"


def _figure(metrics: dict, key: str, spec: str, unit: int = 1) -> str:
    """An engine figure for the table ('-' where the engine ran elsewhere: a server, the gateway)."""
    value = metrics.get(key)
    if value is None:
        return "-"
    return format(value / unit if unit != 1 else value, spec)


def family_lines(report: dict, width: int) -> list[str]:
    """Per task family and run: latency p50/p99 and first block p50, with the run's throughput, prefill
    chunks, the seconds decoding rows waited on them and the engine's CPU seconds over the run (its work);
    nothing for a workload of one family."""
    families = sorted(
        {f for by_load in report["runs"].values() for m in by_load.values() for f in m["latency_by_family_s"]}
    )
    if len(families) < 2:
        return []
    lines = [
        "by task family:",
        f"{'run':<{width}}{'load':<14}{'family':<10}{'lat p50':>9}{'p99':>8}{'1st blk p50':>12}"
        f"{'tok/s':>9}{'chunks':>8}{'chunk wait s':>13}{'engine cpu s':>13}",
    ]
    for name, by_load in report["runs"].items():
        for label, m in by_load.items():
            chunks = m.get("prefill_chunks", 0)
            chunk_wait = m.get("prefill_chunk_wait_s", 0.0)
            cpu = m.get("engine_cpu_s", 0.0)
            for family in families:
                lat = m["latency_by_family_s"].get(family) or {}
                first = m["first_block_by_family_s"].get(family) or {}
                lines.append(
                    f"{name:<{width}}{label:<14}{family:<10}{lat.get('p50', 0):>9.2f}{lat.get('p99', 0):>8.2f}"
                    f"{first.get('p50', 0):>12.2f}{m['tokens_per_s']:>9.1f}{chunks:>8}{chunk_wait:>13.2f}{cpu:>13.2f}"
                )
    return lines


def chunk_label(chunk: int | None) -> str:
    """How a run with this chunk is named beside its policy (as ``--prefill-chunk`` names it)."""
    return "off" if chunk == 0 else "auto" if chunk is None else str(chunk)
