"""Which reader turns a checkpoint's ``config.json`` into a ModelConfig: one per family, by its
``model_type`` (a new family adds its reader here)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine_pod.models.block_config import llada2_config, sdar_config
from engine_pod.models.config import ModelConfig, ModelConfigError, dream_config, llada_config

READERS = {"llada": llada_config, "dream": dream_config, "llada2_moe": llada2_config, "sdar": sdar_config}


def config_from_dict(raw: dict[str, Any]) -> ModelConfig:
    """Build a ModelConfig from the fields of a real checkpoint's config.json."""
    model_type = str(raw.get("model_type", "")).lower()
    parsers = READERS
    if model_type not in parsers:
        raise ModelConfigError(
            f"unknown model_type {raw.get('model_type')!r} in config.json; "
            "supported: 'llada', 'Dream', 'llada2_moe', 'sdar'"
        )
    return parsers[model_type](raw)


def load_config(model_dir: Path) -> ModelConfig:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise ModelConfigError(f"no config.json in {model_dir}")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ModelConfigError(f"{path} is not valid JSON: {exc}") from exc
    return config_from_dict(raw)
