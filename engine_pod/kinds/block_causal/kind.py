"""The block-causal kind's object, which its families' records name."""

from __future__ import annotations

from dllm_contracts.run_rules import BLOCK_CAUSAL_NAME
from engine_pod.kinds.block_causal.stepper import BlockCausalStepper
from engine_pod.runner.kind import CacheKind
from engine_pod.runner.model_interface import TokenModel

BLOCK_CAUSAL = CacheKind(name=BLOCK_CAUSAL_NAME, stepper=BlockCausalStepper, model_interface=TokenModel)
