"""One request through a block-diffusion model, as LLaDA2.0's ``generate`` defines the result.

The canvas covers ``ceil((P + G) / L)`` blocks of the absolute grid; blocks are completed left to
right from the one holding the prompt's end; generation stops after a block that holds an EOS after
the prompt. The result is the G tokens after the prompt, cut after the first EOS.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from engine_pod.block_diffusion.runner import BlockDiffusionRunner, BlockRow
from engine_pod.models.loader import LoadedModel


@dataclass
class BlockGeneration:
    output_ids: list[int]  # the generated tokens, up to and including the first EOS
    finished_by_eos: bool
    forwards: int
    elapsed_s: float


def generate_blocks(
    loaded: LoadedModel,
    prompt_ids: list[int],
    gen_length: int,
    block_length: int,
    steps: int,
    threshold: float,
    exact_cache: bool = True,
) -> BlockGeneration:
    """Greedy block-diffusion generation of ``gen_length`` tokens after ``prompt_ids``."""
    if not prompt_ids:
        raise ValueError("the prompt is empty")
    if gen_length < 1 or block_length < 1 or steps < 1:
        raise ValueError("gen_length, block_length and steps must be positive")
    steps = min(steps, gen_length)
    prompt_length, eos = len(prompt_ids), set(loaded.config.eos_token_ids)
    blocks = -(-(prompt_length + gen_length) // block_length)
    pages = blocks + 1
    pool = loaded.model.new_pool(pages, block_length, loaded.device)
    runner = BlockDiffusionRunner(loaded.model, pool, block_length, steps, exact_cache)
    row = BlockRow("generate", list(prompt_ids), threshold=threshold)
    started = time.perf_counter()
    stopped = False
    while len(row.tokens) < blocks * block_length and not stopped:
        runner.run_cycle([row])
        stopped = any(token in eos for token in row.tokens[prompt_length:])
    generated = row.tokens[prompt_length : prompt_length + gen_length]
    cut = next((i + 1 for i, token in enumerate(generated) if token in eos), len(generated))
    return BlockGeneration(
        generated[:cut], cut < len(generated) or stopped, row.forwards, time.perf_counter() - started
    )
