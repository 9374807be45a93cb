"""Where a block cycle's time goes: one BlockServe-shaped cycle of a LLaDA/Dream model under torch.profiler.

    python scripts/cycle_profile.py [--layout packed|dense] [--rows 59] [--width 138] [--mixed]
        [--model builtin:tiny-llada] [--device cpu|cuda] [--dtype float32|bfloat16]

Prints the cycle's wall time, positions computed and the share of time per operator group (CPU time; on a
GPU the kernels' time too, the operators dispatched and the host's time beside the device's: a cycle whose
host time far exceeds its kernels' is bound by launches and bookkeeping, not by the GPU).
"""

from __future__ import annotations

import argparse
import random
import time
from collections import defaultdict
from typing import TYPE_CHECKING

from dllm_contracts.defaults import DEFAULT_MODEL
from engine_pod.allocators import tune_cpu_allocator
from engine_pod.decoding.config import DecodingConfig
from engine_pod.runner.contract import Runner
from engine_pod.scheduler.cycle_row import CycleRow
from engine_pod.scheduler.output import SchedulerOutput

if TYPE_CHECKING:  # torch loads in main, once the arguments are read (--help answers at once)
    import torch

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


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layout", choices=("packed", "dense"), default="packed")
    parser.add_argument("--rows", type=int, default=59)
    parser.add_argument("--width", type=int, default=138, help="prompt + committed blocks per row")
    parser.add_argument("--mixed", action="store_true", help="prefix lengths drawn from 7..width")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="a LLaDA or Dream model (random:PRESET too)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--steps", type=int, default=32, help="denoising steps per block (at most)")
    parser.add_argument("--repeats", type=int, default=REPEATS, help="cycles timed; the median is reported")
    return parser.parse_args()


def _timed(runner: Runner, cycle: SchedulerOutput, device: torch.device):
    """One cycle, its wall time (the device's queue drained)."""
    import torch

    start = time.perf_counter()
    out = runner.run(cycle)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return out, time.perf_counter() - start


def _print_shares(prof, cuda: bool) -> None:
    cpu_shares: dict[str, float] = defaultdict(float)
    cuda_shares: dict[str, float] = defaultdict(float)
    calls = 0
    for event in prof.key_averages():
        cpu_shares[_group(event.key)] += event.self_cpu_time_total
        cuda_shares[_group(event.key)] += getattr(event, "self_device_time_total", 0)
        calls += event.count if event.key.startswith("aten::") else 0
    print(f"{calls} operators dispatched")
    for label, shares in (("CPU", cpu_shares), ("GPU kernels", cuda_shares))[: 2 if cuda else 1]:
        total = sum(shares.values())
        print(f"{label}: {total / 1e3:.1f} ms")
        for name, value in sorted(shares.items(), key=lambda item: -item[1]):
            print(f"  {value / max(total, 1e-9):6.1%}  {name}")


def main() -> None:
    args = _arguments()
    import torch
    from torch.profiler import ProfilerActivity, profile

    from engine_pod.loading.loader import load_model
    from engine_pod.runner.factory import make_runner

    tune_cpu_allocator()  # as every dllm command does
    loaded = load_model(args.model, args.device, args.dtype)
    decoding = DecodingConfig(
        block_length=32, steps_per_block=args.steps, remasking="threshold", threshold=0.9
    )
    runner = make_runner(loaded, decoding)
    rng = random.Random(0)
    vocab = min(loaded.config.vocab_size, 300)
    widths = [rng.randint(7, args.width) if args.mixed else args.width for _ in range(args.rows)]
    rows = [CycleRow(tuple(rng.randrange(4, vocab) for _ in range(w))) for w in widths]
    cycle = SchedulerOutput.of_rows(rows, packed=args.layout == "packed")
    _timed(runner, cycle, loaded.device)  # warm up
    walls = sorted(_timed(runner, cycle, loaded.device)[1] for _ in range(max(args.repeats, 1)))
    wall = walls[len(walls) // 2]
    cuda = loaded.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        out, _ = _timed(runner, cycle, loaded.device)
    print(
        f"{args.model} on {args.device} ({args.dtype}), layout {args.layout}, {args.rows} rows, torch {torch.__version__}"
    )
    print(
        f"cycle {wall * 1e3:.0f} ms, {out.stats.forwards} forwards, {out.stats.computed_positions} positions"
    )
    print(f"{wall / out.stats.computed_positions * 1e6:.1f} us per computed position")
    _print_shares(prof, cuda)


if __name__ == "__main__":
    main()
