"""A checkpoint's ``config.json`` read by its family's reader, which its ``model_type`` picks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine_pod.families.registry import family_for_model_type
from engine_pod.models.config import ModelConfigError


def config_from_dict(raw: dict[str, Any]) -> Any:
    """The config of a real checkpoint's config.json fields."""
    return family_for_model_type(raw.get("model_type")).read(raw)


def load_config(model_dir: Path) -> Any:
    """The config of the checkpoint in ``model_dir`` (a family may read more than config.json there)."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise ModelConfigError(f"no config.json in {model_dir}")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ModelConfigError(f"{path} is not valid JSON: {exc}") from exc
    return family_for_model_type(raw.get("model_type")).read(raw, Path(model_dir))
