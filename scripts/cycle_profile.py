"""Where a block cycle's time goes: one BlockServe-shaped cycle of the shipped model under torch.profiler.

    python scripts/cycle_profile.py [--layout packed|dense] [--rows 59] [--width 138] [--mixed]

Prints the cycle's wall time, positions computed and the share of CPU time per operator group. Runs on
older checkouts too (without a layout parameter the runner is dense), which is how docs/benchmarks.md's "before"
column was measured.
"""

from __future__ import annotations

import argparse
import inspect
import random
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from dllm_contracts.defaults import DEFAULT_MODEL
from engine_pod.allocators import tune_cpu_allocator
from engine_pod.decoding.config import DecodingConfig
from engine_pod.models.loader import load_model
from engine_pod.runner.block_cycle import BlockCycleRunner
from engine_pod.scheduler.cycle_row import CycleRow

GROUPS = {  # operator -> what it is part of
    "aten::mm": "matmul (projections, MLP, LM head)",
    "aten::addmm": "matmul (projections, MLP, LM head)",
    "aten::bmm": "matmul (projections, MLP, LM head)",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "attention kernel",
    "aten::_scaled_dot_product_attention_math": "attention kernel",
    "aten::index": "gather / scatter / copies",
    "aten::index_put_": "gather / scatter / copies",
    "aten::_index_put_impl_": "gather / scatter / copies",
    "aten::index_select": "gather / scatter / copies",
    "aten::gather": "gather / scatter / copies",
    "aten::cat": "gather / scatter / copies",
    "aten::copy_": "gather / scatter / copies",
}


REPEATS = 7  # cycles timed; the median is reported (a shared machine moves single ones by a third)


def _group(name: str) -> str:
    if name in GROUPS:
        return GROUPS[name]
    if name in (
        "aten::mul",
        "aten::mul_",
        "aten::add",
        "aten::add_",
        "aten::addcmul_",
        "aten::neg",
        "aten::sub",
    ):
        return "elementwise (RoPE, norms, residuals, SwiGLU)"
    if name in (
        "aten::silu",
        "aten::silu_",
        "aten::pow",
        "aten::rsqrt",
        "aten::mean",
        "aten::_fused_rms_norm",
    ):
        return "elementwise (RoPE, norms, residuals, SwiGLU)"
    return "other (scoring, masks, bookkeeping)"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layout", choices=("packed", "dense"), default="packed")
    parser.add_argument("--rows", type=int, default=59)
    parser.add_argument("--width", type=int, default=138, help="prompt + committed blocks per row")
    parser.add_argument("--mixed", action="store_true", help="prefix lengths drawn from 7..width")
    args = parser.parse_args()
    tune_cpu_allocator()  # as every dllm command does
    loaded = load_model(DEFAULT_MODEL, "cpu", "float32")
    decoding = DecodingConfig(block_length=32, steps_per_block=32, remasking="threshold", threshold=0.9)
    runner = BlockCycleRunner(loaded, decoding)
    rng = random.Random(0)
    widths = [rng.randint(7, args.width) if args.mixed else args.width for _ in range(args.rows)]
    rows = [CycleRow(tuple(rng.randrange(4, 300) for _ in range(w))) for w in widths]
    kwargs = (
        {"packed": args.layout == "packed"} if "packed" in inspect.signature(runner.run).parameters else {}
    )
    runner.run(rows, **kwargs)  # warm up
    walls = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        out = runner.run(rows, **kwargs)
        walls.append(time.perf_counter() - start)
    wall = sorted(walls)[REPEATS // 2]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        runner.run(rows, **kwargs)
    shares: dict[str, float] = defaultdict(float)
    for event in prof.key_averages():
        shares[_group(event.key)] += event.self_cpu_time_total
    total = sum(shares.values())
    print(
        f"layout {args.layout if kwargs else 'dense (no layout parameter)'}, {args.rows} rows, torch {torch.__version__}"
    )
    print(
        f"cycle {wall * 1e3:.0f} ms, {out.stats.forwards} forwards, {out.stats.computed_positions} positions"
    )
    print(f"{wall / out.stats.computed_positions * 1e6:.1f} us per computed position")
    for name, value in sorted(shares.items(), key=lambda item: -item[1]):
        print(f"  {value / total:6.1%}  {name}")


if __name__ == "__main__":
    main()
