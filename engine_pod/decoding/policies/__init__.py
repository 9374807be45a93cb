"""Remasking policies, one small vectorised file each; ``make_policy`` picks one by name."""

from __future__ import annotations

from engine_pod.decoding.policies.base import RemaskingPolicy, StepContext
from engine_pod.decoding.policies.low_confidence import LowConfidencePolicy
from engine_pod.decoding.policies.scheduled_threshold import ScheduledThresholdPolicy
from engine_pod.decoding.policies.threshold import ThresholdPolicy
from engine_pod.decoding.policies.timestep import entropy_policy, maskgit_plus_policy, topk_margin_policy

_FACTORIES = {
    "low_confidence": LowConfidencePolicy,
    "threshold": ThresholdPolicy,
    "scheduled_threshold": ScheduledThresholdPolicy,
    "entropy": entropy_policy,
    "maskgit_plus": maskgit_plus_policy,
    "topk_margin": topk_margin_policy,
}


def make_policy(name: str) -> RemaskingPolicy:
    if name not in _FACTORIES:
        raise ValueError(f"unknown remasking policy {name!r}; choose one of {sorted(_FACTORIES)}")
    return _FACTORIES[name]()


__all__ = ["RemaskingPolicy", "StepContext", "make_policy"]
