"""Benchmark figures from policy runs: throughput, latency, padding efficiency, output agreement."""

from __future__ import annotations

import hashlib
import json
import statistics
from dataclasses import asdict

from dllm_contracts.text import completion_tokens
from engine_pod.bench.results import PolicyRun, PreparedRequest

NEAR_TIE = 1e-4  # a divergence must start where the top-2 probability gap is below this


def _percentile(values: list[float], fraction: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


def policy_metrics(run: PolicyRun, eos_ids) -> dict:
    generated = sum(completion_tokens(o.generated, eos_ids) for o in run.outcomes.values())
    latencies = [o.latency_s for o in run.outcomes.values()]
    computed = sum(c.computed_positions for c in run.cycles)
    useful = sum(c.useful_positions for c in run.cycles)
    return (
        {
            "requests": len(run.outcomes),
            "generated_tokens": generated,
            "wall_s": round(run.wall_s, 4),
            "tokens_per_s": round(generated / run.wall_s, 3) if run.wall_s else 0.0,
            "requests_per_s": round(len(run.outcomes) / run.wall_s, 4) if run.wall_s else 0.0,
            "latency_p50_s": round(_percentile(latencies, 0.5), 4),
            "latency_p99_s": round(_percentile(latencies, 0.99), 4),
            "padding_efficiency": round(useful / computed, 4) if computed else 0.0,
            "num_forward_passes": sum(c.forwards for c in run.cycles),
            "block_cycles": len(run.cycles),
            "max_rows": max((c.rows for c in run.cycles), default=0),
            "max_cost_tokens": max((c.cost for c in run.cycles), default=0),
            "preemptions": sum(c.preempted for c in run.cycles),
            "peak_memory_bytes": run.peak_memory_bytes,
            "computed_positions": computed,
            "logits_materialized": sum(c.logits_materialized for c in run.cycles),
            "peak_logits_at_once": max((c.peak_logits for c in run.cycles), default=0),
            # the dual cache's keys and values over the run's cycles (every cached position), and what
            # it held (less under the head-sparse cache)
            "kv_dense_bytes": sum(c.kv_dense_bytes for c in run.cycles),
            "kv_kept_bytes": sum(c.kv_kept_bytes for c in run.cycles),
        }
        | ({"cores": run.cores} if run.cores else {})
        | group_metrics(run)
        | _cpu_metrics(run, generated)
        | refresh_metrics(run.cycles)
        | chunk_metrics(run.cycles)
    )


def work_metrics(cycles) -> dict:
    """The engine's work over the run: its cycles' wall seconds and this process's CPU seconds in them (on
    a host shared with other work, the CPU seconds are what the cycles cost; with one torch thread and an
    idle core, about their wall time)."""
    return {
        "engine_busy_s": round(sum(c.duration_s for c in cycles), 4),
        "engine_cpu_s": round(sum(c.cpu_s for c in cycles), 4),
    }


def chunk_metrics(cycles) -> dict:
    """Chunked prefill over the engine's cycle records: the chunks, their prompt tokens, and the seconds
    decoding rows waited on them (the chunks' share of the forwards they shared); nothing without chunks."""
    chunks = sum(c.prefill_chunks for c in cycles)
    if not chunks:
        return {}
    return {
        "prefill_chunks": chunks,
        "prefill_chunk_tokens": sum(c.prefill_chunk_tokens for c in cycles),
        "prefill_chunk_wait_s": round(sum(c.chunk_wait_s for c in cycles), 4),
    }


# what a forward makes (a cycle's broadcast is the leader's)
FORWARD_COLLECTIVES = ("all_reduce", "all_gather")


def group_metrics(run: PolicyRun) -> dict:
    """A group's collectives over the run (rank 0's: every rank makes the same), and per forward pass those
    the forwards make and the bytes a rank puts into them (empty for one process)."""
    if run.collectives is None:
        return {}
    forwards = sum(c.forwards for c in run.cycles) or 1
    made = sum(run.collectives.get(kind, 0) for kind in FORWARD_COLLECTIVES)
    sent = sum((run.collective_bytes or {}).get(kind, 0) for kind in FORWARD_COLLECTIVES)
    return {
        "collectives": run.collectives,
        "collectives_per_forward": round(made / forwards, 2),
        "bytes_sent_per_forward": round(sent / forwards),
    }


def refresh_metrics(cycles) -> dict:
    """Refreshes (forwards that rewrite a dual cache) over the engine's cycle records: their share of the
    positions computed, the most one step computed and the quota it was held to (dLLM-Serve's; None: none)."""
    refreshed = sum(c.refresh_positions for c in cycles)
    if not refreshed:
        return {}
    computed = sum(c.computed_positions for c in cycles)
    quotas = [c.refresh_quota for c in cycles if c.refresh_quota is not None]
    return {
        "refresh_share": round(refreshed / computed, 4) if computed else 0.0,
        "peak_refresh_positions": max(c.peak_refresh_positions for c in cycles),
        "refresh_quota_positions": max(quotas) if quotas else None,
        "cycles_ended_at_a_step": sum(1 for c in cycles if c.carried),
    }


def residency_metrics(cycles, waited: list, scheduler) -> dict:
    """Rows resident per cycle (the batch each block cycle ran: mean and maximum), and over the ``waited``
    cycles, those that left an arrived request waiting (the budget bound them), the mean rows and their mean
    width, beside the rows ``scheduler``'s budget holds at that width (what admission predicts); and the
    most cache bytes one cycle held (dense, and kept: less under the head-sparse cache)."""
    if not cycles:
        return {}
    rows = [c.rows for c in cycles]
    figures = {
        "rows_resident_mean": round(sum(rows) / len(rows), 3),
        "rows_resident_max": max(rows),
        "cycles": len(cycles),
        "cycles_with_requests_waiting": len(waited),
        "peak_kv_dense_bytes": max(c.kv_dense_bytes for c in cycles),
        "peak_kv_kept_bytes": max(c.kv_kept_bytes for c in cycles),
    }
    held = getattr(scheduler, "held_row_width", None)
    if waited and held is not None:
        waited_rows = sum(c.rows for c in waited)
        width = sum(c.cost for c in waited) / waited_rows
        figures |= {
            "rows_resident_mean_waiting": round(waited_rows / len(waited), 3),
            "row_width_mean_waiting": round(width, 1),
            "rows_the_budget_holds": round(scheduler.token_budget / held(round(width)), 2),
        }
    return figures


def _cpu_metrics(run: PolicyRun, generated: int) -> dict:
    if not run.cpu_s:
        return {}
    return {"engine_cpu_s": round(run.cpu_s, 3), "tokens_per_cpu_s": round(generated / run.cpu_s, 3)}


def timeline(run: PolicyRun) -> list[dict]:
    return [asdict(c) for c in run.cycles]


def _first_difference(a: list[int], b: list[int]) -> int | None:
    for index, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return index
    return None if len(a) == len(b) else min(len(a), len(b))


def compare_outputs(runs: dict[str, PolicyRun], requests: list[PreparedRequest], block_length: int) -> dict:
    """Every policy's tokens against the first policy's (the reference: ideally 'sequential')."""
    names = list(runs)
    reference = runs[names[0]]
    report = {"reference_policy": names[0], "per_policy": {}}
    identical = True
    for name in names[1:]:
        same, tokens, agreeing, divergences = 0, 0, 0, []
        for item in requests:
            ours, theirs = runs[name].outcomes[item.request_id], reference.outcomes[item.request_id]
            tokens += max(len(ours.generated), len(theirs.generated))
            agreeing += sum(x == y for x, y in zip(ours.generated, theirs.generated))
            first = _first_difference(ours.generated, theirs.generated)
            if first is None:
                same += 1
                continue
            divergences.append(
                _divergence(item.request_id, first, ours.margins, theirs.margins, block_length)
            )
        identical = identical and not divergences
        report["per_policy"][name] = {
            "identical_requests": same,
            "requests": len(requests),
            "token_agreement": round(agreeing / tokens, 6) if tokens else 1.0,
            "divergences": divergences,
            "all_divergences_at_near_ties": all(d["near_tie"] for d in divergences),
        }
    report["outputs_identical"] = identical
    return report


def _divergence(
    request_id: str, first: int, ours: list[float], theirs: list[float], block_length: int
) -> dict:
    start = (first // block_length) * block_length
    gaps = [
        g
        for g in ours[start : start + block_length] + theirs[start : start + block_length]
        if g != float("inf")
    ]
    gap = min(gaps) if gaps else None
    return {
        "request_id": request_id,
        "first_differing_token": first,
        "min_top2_gap_in_block": gap,
        "near_tie": gap is not None and gap < NEAR_TIE,
    }


def summarise(values: list[int]) -> dict:
    return {
        "min": min(values),
        "median": statistics.median(values),
        "max": max(values),
        "mean": round(statistics.mean(values), 2),
    }


def outputs_digest(run: PolicyRun) -> str:
    """SHA-256 of every request's generated tokens, by request id."""
    answers = {request_id: outcome.generated for request_id, outcome in run.outcomes.items()}
    return hashlib.sha256(json.dumps(answers, sort_keys=True).encode()).hexdigest()
