"""DiffusionGemma's entropy-bound sampler settings: their names, defaults and valid ranges (no torch).

The one home of these settings for every process: the engine's sampler (``engine_pod/decoding/
entropy_bound.py``) and a checkpoint's generation config, ``dllm generate``'s flags, the API's request
fields (the gateway's schema takes each field's range from ``SETTINGS``) and the queue's payload
(``QueuedRequest.sampler`` holds the settings a request sets, by these names). The defaults are the
reference's (transformers 5.24.0, ``DiffusionGemmaGenerationConfig._get_default_generation_params()``), its
validation the reference generation config's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any

DEFAULT_MAX_DENOISING_STEPS = 48
DEFAULT_ENTROPY_BOUND = 0.1
DEFAULT_T_MIN, DEFAULT_T_MAX = 0.4, 0.8
DEFAULT_STABILITY_THRESHOLD = 1
DEFAULT_CONFIDENCE_THRESHOLD = 0.005


@dataclass(frozen=True)
class Bound:
    """A setting's type and lower bound (there is no upper one but ``t_max`` above ``t_min``)."""

    kind: type  # int or float (a float setting takes an int too, never a bool, never inf or NaN)
    low: float
    inclusive: bool  # low itself is valid
    description: str

    def check(self, name: str, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int if self.kind is int else (int, float)):
            raise ValueError(
                f"{name} must be {'an integer' if self.kind is int else 'a number'}, got {value!r}"
            )
        if not math.isfinite(value) or not (value >= self.low if self.inclusive else value > self.low):
            raise ValueError(f"{name} must be {'>=' if self.inclusive else '>'} {self.low:g}, got {value}")


SETTINGS: dict[str, Bound] = {
    "max_denoising_steps": Bound(int, 1, True, "denoising steps per canvas at most"),
    "entropy_bound": Bound(float, 0.0, False, "summed entropy of the tokens a step accepts"),
    "t_min": Bound(float, 0.0, True, "temperature at the last step"),
    "t_max": Bound(float, 0.0, False, "temperature at the first step (above t_min)"),
    "stability_threshold": Bound(int, 0, True, "earlier steps whose argmax must match for a canvas to stop"),
    "confidence_threshold": Bound(float, 0.0, False, "mean entropy below which a canvas may stop"),
}


@dataclass(frozen=True)
class EntropyBoundParams:
    """One request's sampler settings, validated as the reference's generation config validates them."""

    max_denoising_steps: int = DEFAULT_MAX_DENOISING_STEPS
    entropy_bound: float = DEFAULT_ENTROPY_BOUND
    t_min: float = DEFAULT_T_MIN
    t_max: float = DEFAULT_T_MAX
    stability_threshold: int = DEFAULT_STABILITY_THRESHOLD
    confidence_threshold: float = DEFAULT_CONFIDENCE_THRESHOLD

    def __post_init__(self) -> None:
        for name, bound in SETTINGS.items():
            bound.check(name, getattr(self, name))
        if self.t_max <= self.t_min:
            raise ValueError(f"need t_min < t_max, got t_min={self.t_min}, t_max={self.t_max}")

    @classmethod
    def from_generation_config(cls, raw: dict[str, Any]) -> EntropyBoundParams:
        """A checkpoint's generation_config.json (absent or null fields: the reference's defaults)."""
        sampler = raw.get("sampler_config") or {}
        values = {name: raw.get(name) for name in SETTINGS} | {"entropy_bound": sampler.get("entropy_bound")}
        return cls(**{key: value for key, value in values.items() if value is not None})

    @classmethod
    def for_service(cls, raw: dict[str, Any], steps_per_canvas: int) -> EntropyBoundParams:
        """A service's settings: its checkpoint's generation config with the engine's steps per canvas
        (``--steps-per-block``) as ``max_denoising_steps``."""
        return replace(cls.from_generation_config(raw), max_denoising_steps=steps_per_canvas)

    def for_request(self, settings: dict[str, Any] | None) -> EntropyBoundParams:
        """These settings (the service's) with those a request sets (``settings``: by name; None or empty:
        none). ValueError naming what is wrong: an unknown name, a value out of range, t_min not below
        t_max once merged, or more steps per canvas than the service's."""
        if not settings:
            return self
        unknown = sorted(set(settings) - {f.name for f in fields(self)})
        if unknown:
            raise ValueError(f"unknown sampler settings: {', '.join(unknown)}")
        merged = replace(self, **settings)
        if merged.max_denoising_steps > self.max_denoising_steps:
            raise ValueError(
                f"max_denoising_steps {merged.max_denoising_steps} is above this service's "
                f"{self.max_denoising_steps} steps per canvas"
            )
        return merged
