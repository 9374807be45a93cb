"""The op census's grid (no torch: ``dllm census --help`` reads it): its policies, models and requests."""

from __future__ import annotations

from dllm_contracts.family_table import FAMILY_TABLE

# policy: (finished rows leave the forwards, packed layout)
POLICIES = {
    "static": (False, False),
    "blockserve-packed": (True, True),
    "blockserve-dense": (True, False),
    "dllm-serve": (True, True),
    "dllm-serve-step-level": (True, True),
}
# policies whose cycles stagger their refreshes: one step refreshes at most this share of the cycle's rows'
# positions (or its widest row), so refreshing and reusing rows share steps (dual-cache models only)
STAGGERED = {"dllm-serve": 0.3, "dllm-serve-step-level": 0.3}
# of those, the policies whose cycles end at the first step after which a row's block is complete, the rows
# going on carrying their blocks and caches into the next cycle (dLLM-Serve's step-level batching)
STEP_LEVEL = ("dllm-serve-step-level",)
# one CPU-sized random model per family, in the registry's order (each record's tiny_preset)
MODELS = tuple(f"random:{row['tiny_preset']}" for row in FAMILY_TABLE)
# constrained: every other row's answer keeps to a JSON schema (structured outputs), the others greedy
REQUESTS = ("greedy", "sampled", "logprobs", "constrained")
# the schemas constrained rows take in turn (engine_pod/bench/structured_schemas.py)
CONSTRAINED_SCHEMAS = ("nested", "order", "tags", "person")
# remasking rules run besides the engine's default (threshold decoding): Dream's timestep schedule
REMASKINGS = {"random:dream-tiny": ("threshold", "entropy")}
DEFAULT_REMASKING = ("threshold",)
# each row's own confidence threshold, in turn: 1e-9 (below any token's probability) commits its whole
# block at its first step, None keeps the engine's; rows of one cycle so leave its forwards at different
# steps, as real traffic's do
ROW_THRESHOLDS = (1e-9, None, 0.3, None)
