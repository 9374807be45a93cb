"""Masked-diffusion SFT batches: the prompt is never masked, the answer and its EOS padding are.

Four kinds of sample teach the model the canvases the engine uses:
- ``uniform`` (LLaDA SFT): every generated position is masked with probability t;
- ``block_suffix``: blocks before a random block b are clean, block b is masked with probability t,
  later blocks are fully masked (the Fast-dLLM canvas);
- ``block_cut``: as above, but the sequence ends with block b (the BlockServe canvas);
- ``frontier``: the answer is clean up to a random position and masked after it (t = 1), the state
  confidence decoding reaches when it commits left to right.
Each masked position's loss is weighted by 1/t, the EOS padding exactly like the answer: any lower
weight makes the model sure an answer goes on where the reference has already ended.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch

from engine_pod.synthetic.tasks import Example

SAMPLE_KINDS = ("uniform", "block_suffix", "block_cut", "frontier")


@dataclass
class Encoded:
    prompt: list[int]
    answer: list[int]  # answer tokens followed by one EOS


@dataclass
class TrainingBatch:
    input_ids: torch.Tensor  # [B, T] left-padded
    position_ids: torch.Tensor  # [B, T]
    key_mask: torch.Tensor  # [B, T]
    targets: torch.Tensor  # [B, T] token to predict (only where loss_weight > 0)
    loss_weight: torch.Tensor  # [B, T] 1/t at masked positions, else 0
    normaliser: float  # total generated positions in the batch

    @property
    def tokens(self) -> int:
        return int(self.key_mask.sum())


def encode(tokenizer, example: Example) -> Encoded:
    messages = [{"role": "user", "content": example.prompt}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
    answer = tokenizer(example.answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return Encoded(prompt, answer)


def _layout(encoded: Encoded, rng: random.Random, block: int, eos: int, max_extra_blocks: int) -> list[int]:
    blocks = math.ceil(len(encoded.answer) / block) + rng.randint(0, max_extra_blocks)
    return encoded.answer + [eos] * (blocks * block - len(encoded.answer))


def _noise(generated: list[int], rng: random.Random, block: int, answer_len: int, kind: str, t: float):
    """(masked, in loss, kept length) for one row's generated region."""
    if kind == "frontier":
        return _frontier(generated, rng, block, answer_len)
    if kind == "uniform":
        masked = [rng.random() < t for _ in generated]
        if not any(masked):
            masked[rng.randrange(len(masked))] = True
        return masked, masked, len(generated)
    current = rng.randrange(min(math.ceil(answer_len / block) + 1, len(generated) // block))
    start, end = current * block, (current + 1) * block
    noisy = [start <= i < end and rng.random() < t for i in range(len(generated))]
    if not any(noisy):
        noisy[rng.randrange(start, end)] = True
    masked = [m or i >= end for i, m in enumerate(noisy)]
    return masked, noisy, end if kind == "block_cut" else len(generated)


def _frontier(generated: list[int], rng: random.Random, block: int, answer_len: int):
    """Everything before a random position k is clean, everything from k on is masked: the state
    decoding reaches when it commits left to right, where the next token (or EOS) follows from the
    previous one."""
    k = rng.randint(0, answer_len)
    masked = [i >= k for i in range(len(generated))]
    end = min((k // block + 1) * block, len(generated))
    return masked, masked, end if rng.random() < 0.5 else len(generated)


def mask_ratio(rng: random.Random) -> float:
    """t in [0.02, 1), skewed towards heavily masked answers (mean 2/3): decoding starts from a fully
    masked block, and copying from the prompt is only learnt where the answer's own tokens are hidden."""
    return max(0.02, 1.0 - rng.random() ** 2)


def _sample(
    encoded: Encoded, rng: random.Random, block: int, eos: int, mask: int, kind: str
) -> tuple[list[int], list[int], list[float], int]:
    """(input ids, targets, loss weights, generated positions) of one training row."""
    generated = _layout(encoded, rng, block, eos, max_extra_blocks=1)
    t = 1.0 if kind == "frontier" else mask_ratio(rng)
    masked, in_loss, keep = _noise(generated, rng, block, len(encoded.answer), kind, t)
    generated = generated[:keep]
    inputs = encoded.prompt + [mask if m else tok for tok, m in zip(generated, masked)]
    weights = [0.0] * len(encoded.prompt) + [1.0 / t if in_loss[i] else 0.0 for i in range(keep)]
    return inputs, encoded.prompt + generated, weights, keep


def collate(rows: list[tuple[list[int], list[int], list[float], int]], pad: int) -> TrainingBatch:
    width = max(len(r[0]) for r in rows)
    ids, targets, weights, key_mask = [], [], [], []
    for inputs, target, weight, _ in rows:
        padding = width - len(inputs)
        ids.append([pad] * padding + inputs)
        targets.append([pad] * padding + target)
        weights.append([0.0] * padding + weight)
        key_mask.append([False] * padding + [True] * len(inputs))
    key = torch.tensor(key_mask)
    return TrainingBatch(
        input_ids=torch.tensor(ids),
        position_ids=(key.long().cumsum(1) - 1).clamp(min=0),
        key_mask=key,
        targets=torch.tensor(targets),
        loss_weight=torch.tensor(weights),
        normaliser=float(sum(r[3] for r in rows)),
    )


def make_batches(
    encoded: list[Encoded], rng: random.Random, block: int, eos: int, mask: int, token_budget: int
) -> list[TrainingBatch]:
    """Length-sorted batches of at most ``token_budget`` tokens (padding included)."""
    rows = [_sample(e, rng, block, eos, mask, rng.choice(SAMPLE_KINDS)) for e in encoded]
    rows.sort(key=lambda r: len(r[0]))
    batches, current = [], []
    for row in rows:
        if current and (len(current) + 1) * len(row[0]) > token_budget:
            batches.append(collate(current, eos))
            current = []
        current.append(row)
    if current:
        batches.append(collate(current, eos))
    return batches
