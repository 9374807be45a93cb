"""CPU seconds of one context encoding of a canvas model (DiffusionGemma): the encoder's forward over a
prompt of ``--tokens`` tokens into a context cache of its own, at ``--threads`` torch threads, the median of
``--repeat`` encodings after one to warm up. CPU seconds of this process hold on a host that other work
keeps busy, where wall seconds do not.

    PYTHONPATH=. python scripts/context_encoding_cost.py --model random:diffusion-gemma-tiny --tokens 7500
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time

LOG = logging.getLogger("context_encoding_cost")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", default="random:diffusion-gemma-tiny", help="a canvas model (default: %(default)s)"
    )
    parser.add_argument("--tokens", type=int, default=7500, help="the prompt's tokens (default: %(default)s)")
    parser.add_argument("--repeat", type=int, default=3, help="encodings measured (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: %(default)s)")
    parser.add_argument("--dtype", default="float32", help="the model's dtype (default: %(default)s)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    import torch

    from engine_pod.kinds.canvas.context_cache import ContextCache
    from engine_pod.loading.loader import load_model

    torch.set_num_threads(args.threads)
    model = load_model(args.model, dtype=args.dtype).model
    dtype = next(model.parameters()).dtype
    tokens = torch.randint(
        3, model.config.vocab_size, (1, args.tokens), generator=torch.Generator().manual_seed(0)
    )
    seconds = []
    for _ in range(args.repeat + 1):
        cache = ContextCache.alone(model.config, args.tokens, dtype, torch.device("cpu"))
        start = time.process_time()
        model.encode(tokens, cache)
        seconds.append(time.process_time() - start)
        cache.release()
    LOG.info(
        "%s, %s, %d threads: one %d-token encoding %.3f CPU s (median of %d; each: %s)",
        args.model,
        dtype,
        args.threads,
        args.tokens,
        statistics.median(seconds[1:]),
        args.repeat,
        " ".join(f"{s:.3f}" for s in seconds[1:]),
    )


if __name__ == "__main__":
    main()
