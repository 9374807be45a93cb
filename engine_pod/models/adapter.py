"""Per-family decoding behaviour, kept out of the generic denoising loop.

- Dream predicts the token at position p from the hidden state at p-1 (a one-position logit shift).
- Dream's block sampler commits each block's first position from the refresh forward, unconditionally.
- Fast-dLLM's LLaDA dual-cache sampler gives a block at most S forwards, even with threshold decoding.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine_pod.models.config import ModelConfig


@dataclass(frozen=True)
class ModelAdapter:
    family: str
    logit_shift: int  # logits for position p come from hidden state p - shift
    commits_block_start_on_refresh: bool  # with a cache, the block's first token comes from the refresh
    caps_dual_cache_steps: bool  # with the dual cache, a block gets at most steps_per_block forwards

    def step_cap(self, cache: str, steps_per_block: int, quota_schedule: bool) -> int | None:
        """Most forwards one block may take, or None when only the block's completion ends it."""
        if quota_schedule or (cache == "dual" and self.caps_dual_cache_steps):
            return steps_per_block
        return None


_ADAPTERS = {
    "llada": ModelAdapter(
        "llada", logit_shift=0, commits_block_start_on_refresh=False, caps_dual_cache_steps=True
    ),
    "dream": ModelAdapter(
        "dream", logit_shift=1, commits_block_start_on_refresh=True, caps_dual_cache_steps=False
    ),
}


def adapter_for(config: ModelConfig) -> ModelAdapter:
    return _ADAPTERS[config.family]
