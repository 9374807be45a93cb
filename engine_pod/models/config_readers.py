"""Which reader turns a checkpoint's ``config.json`` into a ModelConfig: one per family, by its
``model_type`` (a new family adds its reader here)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine_pod.models.block_config import llada2_config, sdar_config
from engine_pod.models.config import ModelConfig, ModelConfigError, dream_config, llada_config
from engine_pod.models.diffusion_gemma import config as diffusion_gemma

READERS = {
    "llada": llada_config,
    "dream": dream_config,
    "llada2_moe": llada2_config,
    "sdar": sdar_config,
    diffusion_gemma.MODEL_TYPE: diffusion_gemma.config_from_dict,
}
# families whose directory holds more than config.json to read (DiffusionGemma: its generation config)
DIRECTORY_READERS = {diffusion_gemma.MODEL_TYPE: diffusion_gemma.load_config}


def config_from_dict(raw: dict[str, Any]) -> ModelConfig | diffusion_gemma.DiffusionGemmaConfig:
    """Build a ModelConfig from the fields of a real checkpoint's config.json."""
    model_type = str(raw.get("model_type", "")).lower()
    parsers = READERS
    if model_type not in parsers:
        raise ModelConfigError(
            f"unknown model_type {raw.get('model_type')!r} in config.json; "
            "supported: 'llada', 'Dream', 'llada2_moe', 'sdar', 'diffusion_gemma'"
        )
    return parsers[model_type](raw)


def load_config(model_dir: Path) -> ModelConfig | diffusion_gemma.DiffusionGemmaConfig:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise ModelConfigError(f"no config.json in {model_dir}")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ModelConfigError(f"{path} is not valid JSON: {exc}") from exc
    model_type = str(raw.get("model_type", "")).lower()
    if model_type in DIRECTORY_READERS:
        return DIRECTORY_READERS[model_type](Path(model_dir))
    return config_from_dict(raw)
