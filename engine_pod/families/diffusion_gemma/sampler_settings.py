"""DiffusionGemma's entropy-bound sampler settings: the per-request settings its family adds (no torch).

Declared once, here, with their defaults and ranges: the family's record names this class
(``ModelFamily.request_params``), scripts/generate_family_tables.py writes the declarations into the
family table (dllm_contracts/family_table.py), from which the gateway builds its request fields, and a
request carries the ones it sets in ``RequestParams.family``. The engine's sampler
(``engine_pod/decoding/entropy_bound.py``) reads an instance, which the canvas kind's stepper builds
from this class (``for_service``); a checkpoint's generation config and ``dllm generate``'s flags set a
service's. The defaults are the reference's (transformers 5.24.0,
``DiffusionGemmaGenerationConfig._get_default_generation_params()``), the ranges its generation config's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from dllm_contracts.request_params import FamilyParams
from dllm_contracts.request_setting import setting, settings_of

DEFAULT_MAX_DENOISING_STEPS = 48


@dataclass(frozen=True)
class EntropyBoundParams(FamilyParams):
    """One request's (or a service's) sampler settings."""

    max_denoising_steps: int = setting(
        DEFAULT_MAX_DENOISING_STEPS,
        "denoising steps per canvas at most (the service's steps per block or fewer)",
        low=1,
        ceiling="steps_per_block",
    )
    entropy_bound: float = setting(0.1, "summed entropy of the tokens a step accepts", low=0.0, low_open=True)
    t_min: float = setting(0.4, "temperature at the last step", low=0.0)
    t_max: float = setting(
        0.8, "temperature at the first step (above t_min)", low=0.0, low_open=True, above="t_min"
    )
    stability_threshold: int = setting(1, "earlier steps whose argmax must match for a canvas to stop", low=0)
    confidence_threshold: float = setting(
        0.005, "mean entropy below which a canvas may stop", low=0.0, low_open=True
    )

    @classmethod
    def from_generation_config(cls, raw: dict[str, Any]) -> EntropyBoundParams:
        """A checkpoint's generation_config.json (absent or null fields: the reference's defaults)."""
        sampler = raw.get("sampler_config") or {}
        values = {name: raw.get(name) for name in settings_of(cls)}
        values["entropy_bound"] = sampler.get("entropy_bound")
        return cls(**{key: value for key, value in values.items() if value is not None})

    @classmethod
    def for_service(cls, raw: dict[str, Any], steps_per_canvas: int) -> EntropyBoundParams:
        """A service's settings: its checkpoint's generation config with the engine's steps per canvas
        (``--steps-per-block``) as ``max_denoising_steps``."""
        return replace(cls.from_generation_config(raw), max_denoising_steps=steps_per_canvas)
