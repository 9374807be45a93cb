"""Turn workload items into token ids for a given model."""

from __future__ import annotations

import random
from typing import Any

from engine_pod.bench.results import PreparedRequest
from engine_pod.bench.workloads import WorkloadItem
from engine_pod.models.config import ModelConfig
from engine_pod.prompts import encode_prompt


def _random_ids(rng: random.Random, length: int, config: ModelConfig) -> list[int]:
    special = {config.mask_token_id, *config.eos_token_ids}
    ids = []
    while len(ids) < length:
        token = rng.randrange(config.vocab_size)
        if token not in special:
            ids.append(token)
    return ids


def prepare_requests(
    items: list[WorkloadItem], config: ModelConfig, tokenizer: Any, seed: int = 0
) -> list[PreparedRequest]:
    """Chat-formatted prompts when the model has a tokenizer; random ids of the same length otherwise."""
    rng = random.Random(seed)
    prepared = []
    for item in items:
        if item.prompt is not None and tokenizer is not None and getattr(tokenizer, "chat_template", None):
            ids = encode_prompt(tokenizer, item.prompt, chat=True)
        else:
            ids = _random_ids(rng, max(1, item.prompt_tokens), config)
        prepared.append(PreparedRequest(item.request_id, ids, item.max_tokens))
    return prepared
