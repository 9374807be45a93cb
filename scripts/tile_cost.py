"""What ``--batch-invariant``'s tiles cost one linear layer on this CPU, at a real model's widths.

For each shape, the CPU time of ``F.linear`` (the library's own kernel for the whole batch) and of
``row_invariant.linear`` (the same product as tiles of TILE_ROWS rows, one batched call) on one torch
thread, alternating the two, the median of ``--pairs`` pairs; printed as milliseconds a call and the ratio.
The default shapes are LLaDA-8B's layers (hidden 4096, MLP 12288): q/k/v fused, the attention output, the
MLP's gate or up, its down projection.

Usage: python scripts/tile_cost.py [--rows 256] [--shape 4096x12288 ...] [--pairs 5] [--dtype float32]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time

SHAPES = ("4096x12288", "4096x4096", "4096x12288", "12288x4096")  # (inputs x outputs), LLaDA-8B's layers
LLADA_8B = ("q/k/v fused", "attention out", "MLP gate or up", "MLP down")

logger = logging.getLogger("tile_cost")


def _shape(text: str) -> tuple[int, int]:
    try:
        inputs, outputs = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected INPUTSxOUTPUTS, e.g. 4096x12288; got {text!r}") from None
    if inputs < 1 or outputs < 1:
        raise argparse.ArgumentTypeError(f"both widths must be positive, got {text!r}")
    return inputs, outputs


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def _cpu_ms(product, x, weight, calls: int) -> float:
    start = time.process_time()
    for _ in range(calls):
        product(x, weight)
    return (time.process_time() - start) / calls * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=_positive, default=256, help="rows multiplied at once (default: 256)")
    parser.add_argument(
        "--shape",
        type=_shape,
        action="append",
        help="a layer's INPUTSxOUTPUTS, repeatable (default: LLaDA-8B's four)",
    )
    parser.add_argument("--pairs", type=_positive, default=5, help="alternating pairs (default: 5)")
    parser.add_argument("--calls", type=_positive, default=3, help="calls per measurement (default: 3)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    import torch
    import torch.nn.functional as F

    from engine_pod.models.row_invariant import TILE_ROWS, linear

    torch.set_num_threads(1)
    dtype = getattr(torch, args.dtype)
    shapes = args.shape or [_shape(text) for text in SHAPES]
    names = LLADA_8B if args.shape is None else [""] * len(shapes)
    logger.info(
        "%d rows, %s, one torch thread, tiles of %d rows; median of %d pairs",
        args.rows,
        args.dtype,
        TILE_ROWS,
        args.pairs,
    )
    for (inputs, outputs), name in zip(shapes, names):
        generator = torch.Generator().manual_seed(0)
        weight = torch.randn(outputs, inputs, generator=generator).to(dtype)
        x = torch.randn(args.rows, inputs, generator=generator).to(dtype)
        plain, tiled = [], []
        for pair in range(args.pairs):
            order = (
                ((F.linear, plain), (linear, tiled))
                if pair % 2 == 0
                else ((linear, tiled), (F.linear, plain))
            )
            for product, times in order:
                times.append(_cpu_ms(product, x, weight, args.calls))
        a, b = statistics.median(plain), statistics.median(tiled)
        logger.info(
            "%6d x %-6d %-15s plain %8.2f ms  tiles %8.2f ms  %.2fx", inputs, outputs, name, a, b, b / a
        )


if __name__ == "__main__":
    main()
