"""Markdown tables from the JSON reports in docs/results (what docs/benchmarks.md quotes).

Usage: python scripts/results_tables.py [docs/results] > docs/results/tables.md
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

MIB = 2**20
BENCH_COLUMNS = (
    "tokens_per_s",
    "speedup_vs_static",
    "throughput_vs_engine",
    "padding_efficiency",
    "num_forward_passes",
    "latency_p50_s",
    "latency_p99_s",
    "peak_memory_bytes",
)


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def bench_table(report: dict) -> str:
    workload = report["workload"]
    lines = [
        f"**{workload['name']}** ({workload['requests']} requests, prompt tokens "
        f"{workload['prompt_tokens']['min']}-{workload['prompt_tokens']['max']}, max_tokens "
        f"{workload['max_tokens']['min']}-{workload['max_tokens']['max']}; token budget "
        f"{report['token_budget']}, static batch {report['static_batch_size']}; "
        f"outputs_identical: **{str(report['outputs_identical']).lower()}**)",
        "",
        "| policy | " + " | ".join(c.replace("_bytes", " MiB") for c in BENCH_COLUMNS) + " |",
        "|---|" + "---|" * len(BENCH_COLUMNS),
    ]
    for name, metrics in report["policies"].items():
        cells = [
            _cell(round(metrics[c] / MIB))
            if c == "peak_memory_bytes" and c in metrics
            else _cell(metrics.get(c))
            for c in BENCH_COLUMNS
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def budget_table(profile: dict, runs: dict[str, dict]) -> str:
    fit = profile["fit"]
    held = max(h["relative_error"] for h in profile["held_out"])
    lines = [
        f"Profile: usable {profile['usable_memory_bytes'] / MIB:.0f} MiB "
        f"(limit {profile['memory_limit_bytes'] / MIB:.0f} MiB x utilization {profile['utilization']}), weights "
        f"{profile['weights_bytes'] / MIB:.1f} MiB, fit {fit['bytes_per_token']:.0f} bytes/token + "
        f"{fit['intercept_bytes'] / MIB:.0f} MiB, R^2 {fit['r_squared']:.4f}, worst held-out error "
        f"{held:.1%}, **token budget {profile['token_budget']}**.",
        "",
        "| run | token budget | largest batch (tokens) | peak RSS MiB | under the limit |",
        "|---|---|---|---|---|",
    ]
    limit = profile["memory_limit_bytes"]
    for label, report in runs.items():
        metrics = report["policies"]["blockserve"]
        peak = metrics["peak_memory_bytes"]
        lines.append(
            f"| {label} | {report['token_budget']} | {metrics['max_cost_tokens']} | {peak / MIB:.0f} | "
            f"{'yes' if peak <= limit else '**no**'} |"
        )
    return "\n".join(lines)


def layout_table(profiles: dict[str, dict], runs: dict[str, dict]) -> str:
    """Packed against dense at one memory limit: each layout's profiled budget and what it admits."""
    lines = [
        "| layout | bytes/token | token budget | most concurrent requests | mean rows per cycle | "
        "peak RSS MiB | peak / usable |",
        "|---|---|---|---|---|---|---|",
    ]
    for layout, profile in profiles.items():
        report = runs[layout]
        name = "blockserve" if layout == "packed" else "blockserve-dense"
        metrics, cycles = report["policies"][name], report["timelines"][name]
        peak, usable = metrics["peak_memory_bytes"], profile["usable_memory_bytes"]
        lines.append(
            f"| {layout} | {profile['fit']['bytes_per_token']:.0f} | {profile['token_budget']} | "
            f"{metrics['max_rows']} | {sum(c['rows'] for c in cycles) / len(cycles):.1f} | {peak / MIB:.0f} | "
            f"{peak / usable:.3f} |"
        )
    return "\n".join(lines)


def eval_table(report: dict) -> str:
    policies = report["policies"]
    tasks = sorted(next(iter(policies.values()))["per_task"])
    lines = [
        "| policy | exact match | length accuracy | "
        + " | ".join(f"{t} (exact / length)" for t in tasks)
        + " | agreement |",
        "|---|---|---|" + "---|" * (len(tasks) + 1),
    ]
    agreement = report.get("output_agreement", {})
    for name, figures in policies.items():
        per_task = [
            f"{figures['per_task'][t]['exact_match']:.2f} / {figures['per_task'][t]['length_accuracy']:.2f}"
            for t in tasks
        ]
        same = agreement.get(name, 1.0 if name == report.get("agreement_with") else None)
        lines.append(
            f"| {name} | {figures['exact_match']:.3f} | {figures['length_accuracy']:.3f} | "
            + " | ".join(per_task)
            + f" | {_cell(same)} |"
        )
    return "\n".join(lines)


def main(results: Path) -> str:
    def load(name: str) -> dict | None:
        path = results / name
        return json.loads(path.read_text()) if path.is_file() else None

    sections = []
    for workload in ("heterogeneous", "homogeneous"):
        report = load(f"bench-{workload}.json")
        if report:
            sections.append(bench_table(report))
    profile = load("profile.json")
    if profile:
        runs = {label: load(f"budget-{label}.json") for label in ("1x", "2x")}
        sections.append(budget_table(profile, {k: v for k, v in runs.items() if v}))
    layouts = {layout: load(f"profile-{layout}.json") for layout in ("packed", "dense")}
    layout_runs = {layout: load(f"layout-{layout}.json") for layout in ("packed", "dense")}
    if all(layouts.values()) and all(layout_runs.values()):
        sections.append("Packed and dense at the same memory limit:\n\n" + layout_table(layouts, layout_runs))
    evaluation = load("eval.json")
    if evaluation:
        sections.append(f"Evaluation on {evaluation['n']} held-out examples:\n\n" + eval_table(evaluation))
    return "\n\n".join(sections) + "\n"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "results", nargs="?", type=Path, default=Path("docs/results"), help="(default: %(default)s)"
    )
    sys.stdout.write(main(parser.parse_args().results))
