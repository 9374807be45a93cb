"""Torch threads against throughput: ``dllm bench`` (BlockServe, the engine alone) with the default thread
count, one thread and torch's own default, on a quiet machine and with one core kept busy.

    PYTHONPATH=. python scripts/threads_bench.py [--rounds 5] [--repeat 3] [--limit N] [--workloads ...]

Every run is a real ``dllm bench --policy blockserve --no-isolate`` in this process (the model loads in
each run; ``--no-isolate`` saves a spawned child per run). The settings alternate round by round (each
round starts with the next one), so whatever the machine does meanwhile falls on all of them alike; each
cell is the median of its rounds. The busy core is a ``python -c 'while True: pass'`` started before the
busy rounds and killed after them. Prints a markdown table of tokens/s.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dllm_contracts.engine_env import THREADS_ENV
from engine_pod.cli.main import main as dllm


@functools.cache
def torch_default() -> int:
    """torch's own thread count, read before any run sets it (``run`` reads it first; torch loads here, so
    --help answers at once)."""
    import torch

    return torch.get_num_threads()


def settings() -> dict[str, str | None]:
    """Column name -> the ``--threads`` value (None: the default choice, as a user without the flag gets:
    it samples the load when each run starts, so it may differ between the quiet and the busy rounds)."""
    default = torch_default()
    return {"default": None, "1 thread": "1", f"torch's default ({default})": str(default)}


def bench_once(
    workload: str, threads: str | None, limit: int | None, repeat: int, out: Path
) -> tuple[float, int]:
    """One ``dllm bench`` run of BlockServe: its tokens/s and the threads its report states (checked
    against ``threads`` where given)."""
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
    argv += ["--repeat", str(repeat)]  # the report: the median of these runs
    argv += ["--threads", threads] if threads else []
    errors = io.StringIO()  # and no progress bars: not a terminal
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(errors):
        code = dllm(argv)
    if code != 0:
        raise SystemExit(f"dllm {' '.join(argv)} exited {code}: {errors.getvalue().strip()}")
    report = json.loads(out.read_text())
    if threads and report["torch_threads"]["threads"] != int(threads):
        raise SystemExit(f"asked for {threads} threads, the report says {report['torch_threads']}")
    return report["policies"]["blockserve"]["tokens_per_s"], report["torch_threads"]["threads"]


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


def measure(workloads: list[str], rounds: int, limit: int | None, repeat: int) -> dict:
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
                            tok_s, used = bench_once(
                                workload, columns[name], limit, repeat, Path(tmp) / "report.json"
                            )
                            cell = results.setdefault((workload, load), {}).setdefault(name, [])
                            cell.append((tok_s, used))
    return {"columns": names, "cells": results}


def table(measured: dict, rounds: int) -> str:
    names = measured["columns"]
    lines = [
        f"| workload | load | {' | '.join(names)} |",
        "|---|---|" + "---|" * len(names),
    ]
    for (workload, load), cells in measured["cells"].items():
        medians = [_cell(cells[name], name == "default") for name in names]
        lines.append(f"| {workload} | {load} | {' | '.join(medians)} |")
    lines.append(
        f"\ntokens/s of `dllm bench --policy blockserve`, median (and range) of {rounds} rounds per cell"
    )
    return "\n".join(lines)


def _cell(runs: list[tuple[float, int]], say_threads: bool) -> str:
    """The median tokens/s and the rounds' range, and for the default the threads it chose (each if they
    varied)."""
    speeds = [tok_s for tok_s, _ in runs]
    median = f"{statistics.median(speeds):.0f} ({min(speeds):.0f}-{max(speeds):.0f})"
    chosen = sorted({used for _, used in runs})
    return f"{median}, {'/'.join(map(str, chosen))} thr." if say_threads else median


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5, help="rounds per setting (default: 5)")
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs in each round's dllm bench, its median taken (default: 3)"
    )
    parser.add_argument("--limit", type=int, help="use only the first N requests of each workload")
    parser.add_argument(
        "--workloads",
        default="heterogeneous,homogeneous",
        help="comma-separated dllm bench workloads (default: heterogeneous,homogeneous)",
    )
    return parser.parse_args()


def run() -> None:
    args = parse_args()
    torch_default()  # before any run sets the threads
    os.environ.pop(THREADS_ENV, None)  # the default column is what a user without the variable gets
    started = time.monotonic()
    measured = measure([w for w in args.workloads.split(",") if w], args.rounds, args.limit, args.repeat)
    sys.stdout.write(table(measured, args.rounds) + "\n")
    sys.stdout.write(f"({os.cpu_count()} CPUs, {time.monotonic() - started:.0f} s)\n")


if __name__ == "__main__":
    run()
