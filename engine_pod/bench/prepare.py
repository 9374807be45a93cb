"""Turn workload items into token ids for a given model."""

from __future__ import annotations

import random
from typing import Any

from engine_pod.bench.results import PreparedRequest
from engine_pod.bench.workloads import WorkloadError, WorkloadItem
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
    prepared: dict[str, PreparedRequest] = {}
    shared: dict[int, list[int]] = {}  # one common run of tokens per length
    for item in items:
        if item.prompt is not None and tokenizer is not None and getattr(tokenizer, "chat_template", None):
            ids = encode_prompt(tokenizer, item.prompt, chat=True)
        else:
            ids = _random_ids(rng, max(1, item.prompt_tokens), config)
        if item.shared_prefix_tokens:
            length = item.shared_prefix_tokens
            ids = shared.setdefault(length, _random_ids(random.Random(seed + length), length, config)) + ids
        request = PreparedRequest(item.request_id, ids, item.max_tokens, item.follows)
        if item.follows is not None:
            before = prepared.get(item.follows)
            if before is None:
                raise WorkloadError(
                    f"request {item.request_id} follows {item.follows!r}, not an earlier request"
                )
            request.history_tokens = before.longest_prompt + before.max_tokens
        prepared[item.request_id] = request
    return list(prepared.values())
