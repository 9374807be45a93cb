"""Run block cycles of a model under the op census and reduce them to the figures a GPU cares about.

A scenario is a model, a policy (static: a dense box, every row in every forward; BlockServe packed or
dense: finished rows leave the forwards; dLLM-Serve: packed, its refreshes staggered under a quota), a number of rows, how many distinct prompt lengths they have,
and what the requests ask: greedy tokens, sampled ones (temperature, top-p, top-k, each row its seed) or
greedy tokens with log probabilities. As in real traffic, rows leave at different steps (each row its
own confidence threshold, from committing everything at its first step to the engine's default) and at
different cycles (a request ends after each cycle). Its cycles run back to back (each row's committed
block joins its prefix, as the scheduler does); the first is the warm-up for "new attention shapes".
``dllm census`` runs the grid for every family and mix (engine_pod/cli/census.py).
"""

from __future__ import annotations

import logging
import random
from dataclasses import asdict, dataclass, replace

import torch

from dllm_contracts.request_params import RequestParams
from dllm_contracts.run_rules import stagger_problem
from dllm_contracts.structured_output import ResponseGrammar, json_grammar
from engine_pod.bench.census_grid import (
    CONSTRAINED_SCHEMAS,
    DEFAULT_REMASKING,
    POLICIES,
    REMASKINGS,
    REQUESTS,
    ROW_THRESHOLDS,
    STAGGERED,
    STEP_LEVEL,
)
from engine_pod.bench.op_census import Census, Segment, counting
from engine_pod.bench.structured_schemas import SCHEMAS
from engine_pod.decoding.config import DecodingConfig
from engine_pod.loading.loader import LoadedModel, load_model
from engine_pod.runner.factory import make_runner
from engine_pod.scheduler.cycle_row import CycleRow
from engine_pod.scheduler.output import SchedulerOutput

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Scenario:
    model: str
    policy: str
    rows: int
    distinct: int  # distinct prompt lengths among the rows
    cycles: int = 3
    requests: str = "greedy"  # one of REQUESTS
    remasking: str = "threshold"  # the engine's remasking rule
    shortest: int = 8  # the shortest prompt; the others are 5 tokens apart


@dataclass
class Figures:
    """One scenario's reduction: worst cases over its forwards, steps and cycles."""

    attention_calls_per_layer: float  # most attention calls per attention layer in one forward
    syncs_per_forward: int  # most syncs inside one model forward
    syncs_per_step: int  # most syncs in one denoising step (its forward and the host work after it)
    syncs_per_cycle: int  # most syncs in one cycle, setup and end included
    host_to_device_per_cycle: int  # most host-to-device copies in one cycle
    new_attention_shapes: int  # most shapes first seen in one cycle after the first
    first_forward_ops: int  # aten ops of the first cycle's first forward
    host_ops_per_step: (
        int  # the median step's aten ops between its forward and the next (work per row grows it)
    )
    host_to_device_per_step: int  # most host-to-device copies between two forwards of a cycle
    forwards: int  # forwards of all cycles
    moe_ops_per_call: list[int]  # the distinct op counts of the MoE layer calls (empty: no MoE)
    sync_kinds: dict[str, int]  # every sync in the run, by kind


def prompt_lengths(rows: int, distinct: int, shortest: int) -> list[int]:
    return [shortest + 5 * (i % distinct) for i in range(rows)]


def _rows(loaded: LoadedModel, lengths: list[int], seed: int, requests: str = "greedy") -> list[CycleRow]:
    """Rows of random prompts, each with its own threshold (and, as ``requests`` asks, its own sampling
    seed or log probabilities)."""
    draw = random.Random(seed)
    vocab = loaded.config.vocab_size
    special = {loaded.config.mask_token_id, *getattr(loaded.config, "eos_token_ids", ())}
    words = [t for t in range(min(vocab, 4096)) if t not in special]
    rows = []
    for i, n in enumerate(lengths):
        sampled = {"temperature": 0.8, "top_p": 0.9, "top_k": 50, "seed": i} if requests == "sampled" else {}
        grammar = None
        if requests == "constrained" and i % 2:
            schema = SCHEMAS[CONSTRAINED_SCHEMAS[(i // 2) % len(CONSTRAINED_SCHEMAS)]][0]
            grammar = ResponseGrammar(json_grammar(schema), "json_schema")
        params = RequestParams(
            max_tokens=512,
            threshold=ROW_THRESHOLDS[i % len(ROW_THRESHOLDS)],
            logprobs=2 if requests == "logprobs" else None,
            grammar=grammar,
            **sampled,
        )
        prompt = tuple(draw.choice(words) for _ in range(n))
        rows.append(CycleRow(prompt, owner=f"census-{i}", prompt_len=n, params=params))
    return rows


def run_scenario(loaded: LoadedModel, scenario: Scenario, decoding: DecodingConfig) -> Figures:
    """Every cycle of the scenario under its own census; after each cycle one request ends."""
    gather_rows, packed = POLICIES[scenario.policy]
    runner = make_runner(loaded, decoding, pool_tokens=1 << 15)
    lengths = prompt_lengths(scenario.rows, scenario.distinct, scenario.shortest)
    rows = _rows(loaded, lengths, 0, scenario.requests)
    censuses = []
    for _ in range(scenario.cycles):
        cycle = SchedulerOutput.of_rows(rows, gather_rows=gather_rows, packed=packed)
        if scenario.policy in STAGGERED:
            widths = [row.width + decoding.block_length for row in rows]
            cycle.refresh_quota = max(max(widths), int(STAGGERED[scenario.policy] * sum(widths)))
            cycle.step_level = scenario.policy in STEP_LEVEL  # rows going on carry their blocks and caches
        with counting(loaded.model) as census:
            output = runner.run(cycle)
        censuses.append(census)
        carried = output.carried or [False] * len(rows)
        rows = [
            row if going else replace(row, prefix_ids=row.prefix_ids + tuple(block))
            for row, block, going in zip(rows, output.blocks, carried)
        ]
        rows = rows[:-1] if len(rows) > 1 else rows
    runner.forget()
    return reduce(censuses)


def _steps(segments: list[Segment]) -> list[int]:
    """Syncs of each forward plus the host work up to the next forward (the last forward's own only)."""
    steps = []
    for i, segment in enumerate(segments):
        if segment.kind == "host":
            continue
        after = segments[i + 1] if i + 2 < len(segments) else None  # the final host work is the cycle's
        steps.append(segment.sync_count + (after.sync_count if after is not None else 0))
    return steps


def _median(values: list[int]) -> int:
    return sorted(values)[len(values) // 2] if values else 0


def reduce(censuses: list[Census]) -> Figures:
    forwards = [s for c in censuses for s in c.segments if s.kind != "host"]
    seen: set = set()
    new_shapes = []
    for census in censuses:
        shapes = set().union(*(s.attention_shapes for s in census.segments))
        new_shapes.append(len(shapes - seen))
        seen |= shapes
    kinds: dict[str, int] = {}
    for census in censuses:
        for segment in census.segments:
            for kind, count in segment.syncs.items():
                kinds[kind] = kinds.get(kind, 0) + count
    first = next(s for s in censuses[0].segments if s.kind != "host")
    return Figures(
        attention_calls_per_layer=max(s.attention_calls / max(s.layers, 1) for s in forwards),
        syncs_per_forward=max(s.sync_count for s in forwards),
        syncs_per_step=max(x for c in censuses for x in _steps(c.segments)),
        syncs_per_cycle=max(sum(s.sync_count for s in c.segments) for c in censuses),
        host_to_device_per_cycle=max(sum(s.host_to_device for s in c.segments) for c in censuses),
        new_attention_shapes=max(new_shapes[1:], default=0),
        first_forward_ops=first.aten_ops,
        host_ops_per_step=_median(
            [s.aten_ops for c in censuses for s in c.segments[1:-1] if s.kind == "host"]
        ),
        host_to_device_per_step=max(
            (s.host_to_device for c in censuses for s in c.segments[1:-1] if s.kind == "host"), default=0
        ),
        forwards=len(forwards),
        moe_ops_per_call=sorted({n for c in censuses for n in c.moe_calls}),
        sync_kinds=kinds,
    )


def decoding_for(loaded: LoadedModel, remasking: str = "threshold") -> DecodingConfig:
    """The engine's default decoding, every family's (threshold decoding with the dual cache, blocks of 32),
    or another remasking rule with it."""
    return DecodingConfig(remasking=remasking)


def run_census(
    models: list[str],
    policies: list[str],
    row_counts: list[int],
    distinct: list[str],
    cycles: int,
    requests: tuple[str, ...] = REQUESTS,
) -> list[dict]:
    """Every scenario of the grid, one torch thread (as the batch-invariance tests), each logged as it ends."""
    torch.set_num_threads(1)
    grid = [
        (policy, rows, text, kind)
        for policy in policies
        for rows in row_counts
        for text in distinct
        for kind in requests
    ]
    results = []
    for spec in models:
        loaded = load_model(spec)
        for policy, rows, text, kind in grid:
            for remasking in REMASKINGS.get(spec, DEFAULT_REMASKING):
                if policy in STAGGERED and stagger_problem(
                    loaded.family.name, loaded.family.kind.name, "dual", remasking
                ):
                    continue  # staggered refreshes need a dual cache and a policy that does not count steps
                lengths = rows if text == "all" else min(int(text), rows)
                scenario = Scenario(spec, policy, rows, lengths, cycles, requests=kind, remasking=remasking)
                figures = run_scenario(loaded, scenario, decoding_for(loaded, remasking))
                results.append({"scenario": asdict(scenario), "figures": asdict(figures)})
                log.info("scenario %d: %s", len(results), _line(scenario, figures))
    return results


COLUMNS = (
    ("attention calls per layer", "attention_calls_per_layer", max),
    ("syncs in a forward", "syncs_per_forward", max),
    ("syncs per step", "syncs_per_step", max),
    ("host-to-device copies per cycle", "host_to_device_per_cycle", max),
    ("copies between forwards", "host_to_device_per_step", max),
    ("new attention shapes per cycle", "new_attention_shapes", max),
)


def markdown_table(results: list[dict]) -> str:
    """One row per model and policy: the worst of its mixes for each figure, and how much the first
    forward's ops and the MoE layers' ops vary across them (1 = not at all)."""
    by_row: dict[tuple[str, str, str], list[dict]] = {}
    for result in results:
        scenario = result["scenario"]
        model = scenario["model"] + (
            "" if scenario["remasking"] == "threshold" else f" ({scenario['remasking']})"
        )
        key = (model, scenario["policy"], scenario["requests"])
        by_row.setdefault(key, []).append(result["figures"])
    header = [
        "model",
        "policy",
        "requests",
        *(name for name, _, _ in COLUMNS),
        "first-forward ops, max/min",
        "MoE ops per call",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for (model, policy, requests), figures in by_row.items():
        cells = [model, policy, requests, *(f"{pick(f[key] for f in figures):g}" for _, key, pick in COLUMNS)]
        first = [f["first_forward_ops"] for f in figures]
        moe = sorted({n for f in figures for n in f["moe_ops_per_call"]})
        cells.append(f"{max(first) / min(first):.3f}")
        cells.append(
            "-" if not moe else str(moe[0]) if len(moe) == 1 else f"{moe[0]}-{moe[-1]} ({len(moe)} counts)"
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _line(scenario: Scenario, f: Figures) -> str:
    """One scenario's figures, each named (worst over its forwards, steps and cycles)."""
    moe = f.moe_ops_per_call
    moe_text = "no MoE" if not moe else f"MoE ops per call {moe[0]}" + (f"-{moe[-1]}" if len(moe) > 1 else "")
    return (
        f"{scenario.model} {scenario.remasking} {scenario.policy} {scenario.requests}, {scenario.rows} rows of "
        f"{scenario.distinct} prompt "
        f"length{'s' if scenario.distinct > 1 else ''}: "
        f"attention calls per layer {f.attention_calls_per_layer:.2f}, syncs {f.syncs_per_forward} per "
        f"forward / {f.syncs_per_step} per step / {f.syncs_per_cycle} per cycle, host-to-device copies "
        f"{f.host_to_device_per_cycle} per cycle, new attention shapes {f.new_attention_shapes}, first "
        f"forward {f.first_forward_ops} ops, {moe_text}"
    )
