"""The block-causal kind's object, which its families' records name."""

from __future__ import annotations

from engine_pod.kinds.block_causal.stepper import PagedCacheStepper
from engine_pod.runner.kind import CacheKind
from engine_pod.runner.model_interface import TokenModel

BLOCK_CAUSAL = CacheKind(name="paged", stepper=PagedCacheStepper, model_interface=TokenModel)
