"""CPU seconds of one dual-cache block cycle (LLaDA, Dream) with and without a long row: ``--shorts`` rows
of short prompts, then the same rows beside one row of a ``--long``-token prompt, and that row alone; each
cycle once as it runs (``--threshold``: on random weights one token a step, every step over the block) and
once as its refresh forward alone (a threshold that commits the whole block at the first forward), so that
a long row's cost splits into its refresh (every position it attends, recomputed at each of its blocks)
and its steps (its block's queries over all its keys). The median of ``--repeat`` cycles after one to warm
up, at ``--threads`` torch threads; CPU seconds of this process hold on a host that other work keeps busy.

    PYTHONPATH=. python scripts/long_row_cycle_cost.py --model random:llada-tiny --long 3500
"""

from __future__ import annotations

import argparse
import logging
import random
import statistics
import time

LOG = logging.getLogger("long_row_cycle_cost")
REFRESH_ONLY = 1e-9  # a threshold every candidate passes: the block commits at its first forward


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", default="random:llada-tiny", help="a LLaDA or Dream model (default: %(default)s)"
    )
    parser.add_argument(
        "--long", type=int, default=3500, help="the long row's prompt tokens (default: %(default)s)"
    )
    parser.add_argument(
        "--shorts",
        default="80,110,60,95",
        help="the short rows' prompt tokens, comma-separated (default: %(default)s)",
    )
    parser.add_argument(
        "--threshold", type=float, default=0.9, help="the decoding threshold (default: %(default)s)"
    )
    parser.add_argument("--repeat", type=int, default=5, help="cycles measured (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: %(default)s)")
    return parser.parse_args()


def main() -> None:
    args = _arguments()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    import torch

    from engine_pod.allocators import tune_cpu_allocator
    from engine_pod.decoding.config import DecodingConfig
    from engine_pod.loading.loader import load_model
    from engine_pod.runner.factory import make_runner
    from engine_pod.scheduler.cycle_row import CycleRow
    from engine_pod.scheduler.output import SchedulerOutput

    torch.set_num_threads(args.threads)
    tune_cpu_allocator()  # as every dllm command does
    loaded = load_model(args.model, "cpu", "float32")
    rng = random.Random(0)
    vocab = min(loaded.config.vocab_size, 900)

    def row(width: int) -> CycleRow:
        return CycleRow(tuple(rng.randrange(4, vocab) for _ in range(width)))

    shorts = [row(int(w)) for w in args.shorts.split(",")]
    long_row = row(args.long)
    batches = {"shorts": shorts, "shorts + long": [*shorts, long_row], "long alone": [long_row]}
    for label, threshold in (("cycle", args.threshold), ("refresh forward only", REFRESH_ONLY)):
        decoding = DecodingConfig(
            block_length=32, steps_per_block=32, remasking="threshold", threshold=threshold
        )
        runner = make_runner(loaded, decoding)
        for name, rows in batches.items():
            cycle = SchedulerOutput.of_rows(rows, packed=True)
            seconds = []
            for _ in range(args.repeat + 1):
                start = time.process_time()
                out = runner.run(cycle)
                seconds.append(time.process_time() - start)
            LOG.info(
                "%s, %s: %s: %.3f CPU s (median of %d), %d forwards, %d positions",
                label,
                name,
                " ".join(str(len(r.prefix_ids)) for r in rows),
                statistics.median(seconds[1:]),
                args.repeat,
                out.stats.forwards,
                out.stats.computed_positions,
            )


if __name__ == "__main__":
    main()
