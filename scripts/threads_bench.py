"""Torch threads against throughput: ``dllm bench`` (BlockServe, the engine alone) with the default thread
count, one thread and torch's own default, on a quiet machine and with one core kept busy.

    PYTHONPATH=. python scripts/threads_bench.py [--rounds 5] [--limit N] [--workloads heterogeneous,homogeneous]

Every run is a real ``dllm bench --policy blockserve --no-isolate`` in this process (the model loads in
each run; ``--no-isolate`` saves a spawned child per run). The settings alternate round by round (each
round starts with the next one), so whatever the machine does meanwhile falls on all of them alike; each
cell is the median of its rounds. The busy core is a ``python -c 'while True: pass'`` started before the
busy rounds and killed after them. Prints a markdown table of tokens/s.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from dllm_contracts.engine_env import THREADS_ENV
from engine_pod.cli.main import main as dllm
from engine_pod.cpu_threads import choose_threads

TORCH_DEFAULT = torch.get_num_threads()  # read before anything sets it


def settings() -> dict[str, str | None]:
    """Column name -> the ``--threads`` value (None: the default choice, as a user without the flag gets).
    Where the default is one of the others (one thread on two CPUs), it is one column, measured once: two
    columns of one setting would only show the machine's noise between them."""
    default = choose_threads(None, environ={}).threads
    same = {1: "1 thread", TORCH_DEFAULT: "torch's default"}.get(default)
    columns: dict[str, str | None] = {f"default = {same}" if same else f"default ({default})": None}
    if default != 1:
        columns["1 thread"] = "1"
    if default != TORCH_DEFAULT:
        columns[f"torch's default ({TORCH_DEFAULT})"] = str(TORCH_DEFAULT)
    return columns


def bench_once(workload: str, threads: str | None, limit: int | None, out: Path) -> float:
    """One ``dllm bench`` run of BlockServe: its tokens/s, after checking the threads its report states."""
    argv = [
        "-q",
        "bench",
        "--workload",
        workload,
        "--policy",
        "blockserve",
        "--no-isolate",
        "--json",
        str(out),
    ]
    argv += ["--limit", str(limit)] if limit else []
    argv += ["--threads", threads] if threads else []
    errors = io.StringIO()  # and no progress bars: not a terminal
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(errors):
        code = dllm(argv)
    if code != 0:
        raise SystemExit(f"dllm {' '.join(argv)} exited {code}: {errors.getvalue().strip()}")
    report = json.loads(out.read_text())
    if threads and report["torch_threads"]["threads"] != int(threads):
        raise SystemExit(f"asked for {threads} threads, the report says {report['torch_threads']}")
    return report["policies"]["blockserve"]["tokens_per_s"]


@contextlib.contextmanager
def core_busy(busy: bool):
    """A process spinning on one core while the block runs (nothing when ``busy`` is false)."""
    if not busy:
        yield
        return
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        burner.kill()
        burner.wait()


def measure(workloads: list[str], rounds: int, limit: int | None) -> dict:
    columns = settings()
    names = list(columns)
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for load in ("quiet", "one core busy"):
            with core_busy(load != "quiet"):
                for round_number in range(rounds):
                    order = names[round_number % len(names) :] + names[: round_number % len(names)]
                    for workload in workloads:
                        for name in order:
                            tok_s = bench_once(workload, columns[name], limit, Path(tmp) / "report.json")
                            results.setdefault((workload, load), {}).setdefault(name, []).append(tok_s)
    return {"columns": names, "cells": results}


def table(measured: dict, rounds: int) -> str:
    names = measured["columns"]
    lines = [
        f"| workload | load | {' | '.join(names)} |",
        "|---|---|" + "---|" * len(names),
    ]
    for (workload, load), cells in measured["cells"].items():
        medians = [f"{statistics.median(cells[name]):.0f}" for name in names]
        lines.append(f"| {workload} | {load} | {' | '.join(medians)} |")
    lines.append(f"\ntokens/s of `dllm bench --policy blockserve`, median of {rounds} rounds per cell")
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5, help="rounds per setting (default: 5)")
    parser.add_argument("--limit", type=int, help="use only the first N requests of each workload")
    parser.add_argument(
        "--workloads",
        default="heterogeneous,homogeneous",
        help="comma-separated dllm bench workloads (default: heterogeneous,homogeneous)",
    )
    return parser.parse_args()


def run() -> None:
    args = parse_args()
    os.environ.pop(THREADS_ENV, None)  # the default column is what a user without the variable gets
    started = time.monotonic()
    measured = measure([w for w in args.workloads.split(",") if w], args.rounds, args.limit)
    sys.stdout.write(table(measured, args.rounds) + "\n")
    sys.stdout.write(f"({os.cpu_count()} CPUs, {time.monotonic() - started:.0f} s)\n")


if __name__ == "__main__":
    run()
