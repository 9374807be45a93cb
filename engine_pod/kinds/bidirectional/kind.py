"""The bidirectional kind's object, which its families' records name."""

from __future__ import annotations

from dllm_contracts.run_rules import BIDIRECTIONAL_NAME
from engine_pod.kinds.bidirectional.split_stepper import SplitRefreshStepper
from engine_pod.runner.kind import CacheKind
from engine_pod.runner.model_interface import DualCacheModel

BIDIRECTIONAL = CacheKind(
    name=BIDIRECTIONAL_NAME,
    stepper=SplitRefreshStepper,
    model_interface=DualCacheModel,
    records_margins=True,
    refreshes=True,
)
