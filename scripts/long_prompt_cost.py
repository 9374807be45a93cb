"""CPU seconds of one long-prompt request on a block-diffusion model (LLaDA2.0, SDAR): the engine's cycles
over a prompt of ``--tokens`` tokens (``--new`` tokens generated, greedy), its keys and values computed in
chunks of ``--prefill-chunk`` tokens (0: whole), at ``--threads`` torch threads; the cycles' CPU seconds
split into those that compute a chunk and those that decode. With ``--profile`` the same run under
torch.profiler, its operators' CPU seconds (the attention kernel, the products, the rest). CPU seconds of
this process hold on a host that other work keeps busy, where wall seconds do not.

    PYTHONPATH=. python scripts/long_prompt_cost.py --model random:llada2-tiny --tokens 12000 --prefill-chunk 512
"""

from __future__ import annotations

import argparse
import logging
import random
import time
from dataclasses import replace

LOG = logging.getLogger("long_prompt_cost")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", default="random:llada2-tiny", help="a block-diffusion model (default: %(default)s)"
    )
    parser.add_argument(
        "--tokens", type=int, default=12000, help="the prompt's tokens (default: %(default)s)"
    )
    parser.add_argument("--new", type=int, default=64, help="tokens generated (default: %(default)s)")
    parser.add_argument(
        "--prefill-chunk", type=int, default=512, help="0: the prompt whole (default: %(default)s)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: %(default)s)")
    parser.add_argument("--dtype", default="float32", help="the model's dtype (default: %(default)s)")
    parser.add_argument("--profile", action="store_true", help="also the operators' CPU seconds")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    import torch

    from dllm_contracts.request_params import GREEDY
    from dllm_contracts.scheduler_config import SchedulerConfig
    from engine_pod.allocators import tune_cpu_allocator
    from engine_pod.decoding.config import DecodingConfig
    from engine_pod.engine import Engine
    from engine_pod.loading.loader import load_model
    from engine_pod.runner.contract import scheduling_facts
    from engine_pod.runner.factory import make_runner
    from engine_pod.scheduler.blockserve import BlockServeScheduler

    tune_cpu_allocator()  # as every dllm process: tensors of 1 MiB and more from their own mappings
    torch.set_num_threads(args.threads)
    loaded = load_model(args.model, dtype=args.dtype)
    decoding = DecodingConfig(block_length=32, steps_per_block=32, remasking="threshold", threshold=0.9)
    budget = max(32768, args.tokens + 4 * args.new)
    rng = random.Random(0)
    prompt = [rng.randrange(3, loaded.model.config.vocab_size - 32) for _ in range(args.tokens)]
    runner = make_runner(loaded, decoding, budget)
    config = SchedulerConfig(token_budget=budget, prefill_chunk=args.prefill_chunk)
    scheduler = BlockServeScheduler(decoding.block_length, [], config, **scheduling_facts(runner))
    engine = Engine(runner, scheduler)
    engine.add_request(scheduler.request_for("long", prompt, replace(GREEDY, max_tokens=args.new)))
    profiler = None
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        profiler = profile(activities=[ProfilerActivity.CPU])
        profiler.__enter__()
    start = time.process_time()
    engine.run(lambda request: None)
    seconds = time.process_time() - start
    if profiler is not None:
        profiler.__exit__(None, None, None)
    chunks = sum(r.cpu_s for r in engine.records if r.prefill_chunks)
    LOG.info(
        "%s, %d threads, a %d-token prompt in chunks of %s, %d new tokens: %.2f CPU s (cycles computing a "
        "chunk %.2f s, the others %.2f s; %d cycles)",
        args.model,
        args.threads,
        args.tokens,
        args.prefill_chunk or "(whole)",
        args.new,
        seconds,
        chunks,
        sum(r.cpu_s for r in engine.records) - chunks,
        len(engine.records),
    )
    if profiler is not None:
        LOG.info("%s", profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


if __name__ == "__main__":
    main()
