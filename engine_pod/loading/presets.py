"""Randomly initialised models (``--model random:NAME``): a preset's config as the engine reads a
checkpoint's. The presets themselves (the real checkpoints' architectures) are data in
``dllm_contracts.model_presets``, which the gateway reads too.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from dllm_contracts.model_presets import GENERATION_CONFIGS, PRESETS, preset
from engine_pod.loading.config_readers import config_from_dict

__all__ = ["GENERATION_CONFIGS", "PRESETS", "preset", "preset_config"]


def preset_config(name: str) -> Any:
    """The preset's config as the engine reads a checkpoint's, with its generation config where it has one."""
    config = config_from_dict(preset(name))
    generation = GENERATION_CONFIGS.get(name)
    return replace(config, generation=dict(generation)) if generation else config
