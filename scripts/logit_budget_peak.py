"""The profiled peak of one block cycle with the LM head's logits chunked and not, at a fixed batch.

Usage: python scripts/logit_budget_peak.py [--model random:llada-tiny-8b-vocab] [--rows 8] [--width 256]
    [--chunks 64,auto,unbounded] [--threads 1]

Each setting's peak is measured in a fresh child process of its own (its peak resident memory on a CPU,
the allocator's peak on CUDA, as ``dllm profile`` measures a grid point) with ``--max-materialized-logits``
in force; then the same cycle runs again in this process under every setting and its committed blocks
are compared (they must be equal). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys

UNBOUNDED = 1 << 30


def _setting(text: str) -> int | None:
    return {"auto": None, "unbounded": UNBOUNDED}[text] if text in ("auto", "unbounded") else int(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="random:llada-tiny-8b-vocab")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--width", type=int, default=256, help="tokens per row, the block included")
    parser.add_argument("--block-length", type=int, default=32)
    parser.add_argument("--chunks", default="64,auto,unbounded")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)

    import torch

    from engine_pod.decoding.config import DecodingConfig
    from engine_pod.isolation import run_in_child
    from engine_pod.loading.loader import load_model
    from engine_pod.profiling.grid import Point
    from engine_pod.profiling.points import ProfileConfig, _rows_for, measure_in_fresh_process
    from engine_pod.runner.factory import make_runner
    from engine_pod.scheduler.output import SchedulerOutput

    torch.set_num_threads(args.threads)
    names = [part.strip() for part in args.chunks.split(",") if part.strip()]
    point = Point(args.rows, args.width)
    report: dict = {"model": args.model, "rows": args.rows, "width": args.width, "threads": args.threads}
    loaded = load_model(args.model)
    vocab = loaded.config.vocab_size
    blocks, peaks = {}, {}
    for name in names:
        positions = _setting(name)
        cfg = ProfileConfig(
            model=args.model, block_length=args.block_length, max_materialized_logits=positions
        )
        peaks[name] = run_in_child(measure_in_fresh_process, cfg, point).peak_bytes
        decoding = DecodingConfig(
            block_length=args.block_length,
            steps_per_block=cfg.steps,
            remasking="low_confidence",
            max_materialized_logits=positions,
        )
        runner = make_runner(loaded, decoding, pool_tokens=point.tokens)
        rows = _rows_for(point, loaded, args.block_length, cfg.seed)
        blocks[name] = runner.run(SchedulerOutput.of_rows(rows, gather_rows=False, packed=True)).blocks
    chunk = {
        name: DecodingConfig(max_materialized_logits=_setting(name)).logit_budget.chunk(vocab)
        for name in names
    }
    positions = (
        args.rows * args.block_length
    )  # the positions a step's head runs over (dual cache: the blocks)
    report["vocab"] = vocab
    report["settings"] = {
        name: {
            "positions_per_chunk": min(chunk[name], positions),
            "logits_bytes_at_once": min(chunk[name], positions) * vocab * 4,
            "peak_mib": round(peaks[name] / 2**20, 1),
        }
        for name in names
    }
    report["outputs_equal"] = all(blocks[name] == blocks[names[0]] for name in names)
    sys.stdout.write(json.dumps(report, indent=2) + "\n")
    return 0 if report["outputs_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
