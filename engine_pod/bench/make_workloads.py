"""Write the shipped named workloads (``python -m engine_pod.bench.make_workloads``)."""

from __future__ import annotations

import json
import logging
import random

from engine_pod.bench.workloads import WORKLOAD_DIR
from engine_pod.prompts import encode_prompt
from engine_pod.synthetic.tasks import TASKS, Example, eval_set
from engine_pod.training.tokenizer_build import build_tokenizer

logger = logging.getLogger(__name__)


def _line(tokenizer, index: int, example: Example, max_tokens: int) -> dict:
    return {
        "id": f"{example.task}-{index}",
        "task": example.task,
        "prompt": example.prompt,
        "prompt_tokens": len(encode_prompt(tokenizer, example.prompt, chat=True)),
        "max_tokens": max_tokens,
        "answer": example.answer,
    }


def heterogeneous(n: int = 128) -> list[Example]:
    """Every task mixed: prompts of 7 to ~260 tokens, answers of 1 to 128 tokens."""
    examples = eval_set(n, seed=2024, tasks=list(TASKS))
    random.Random(0).shuffle(examples)
    return examples


def homogeneous(n: int = 64) -> list[Example]:
    """Countdowns whose answers all span three blocks: little for BlockServe to win back."""
    rng = random.Random(5)
    examples = []
    for _ in range(n):
        start = rng.randint(66, 94)
        answer = " ".join(map(str, range(start, -1, -1)))
        examples.append(Example("countdown", f"count down from {start} to 0 .", answer))
    return examples


def write_all() -> None:
    tokenizer = build_tokenizer(320)
    WORKLOAD_DIR.mkdir(exist_ok=True)
    for name, examples in (("heterogeneous", heterogeneous()), ("homogeneous", homogeneous())):
        lines = [_line(tokenizer, i, e, 128) for i, e in enumerate(examples)]
        path = WORKLOAD_DIR / f"{name}.jsonl"
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
        logger.info("wrote %d requests to %s", len(lines), path)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    write_all()
