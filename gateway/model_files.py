"""The model files the gateway reads for ``DLLM_MODEL_DIR`` (its tokenizer, and the configs that name its
EOS ids), without torch: a directory, or a model named as ``dllm serve`` takes it. ``builtin:NAME`` is a
model shipped in the package; ``random:PRESET`` (randomly initialised weights of a preset's shape) is
served with the random presets' byte-level tokenizer and the preset's config, as ``dllm serve`` serves it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from dllm_contracts.defaults import RANDOM_TOKENIZER_DIR
from dllm_contracts.model_presets import GENERATION_CONFIGS, preset
from dllm_contracts.model_source import builtin_model_dir
from gateway.settings import missing_setting


@dataclass(frozen=True)
class ModelFiles:
    tokenizer_dir: Path  # tokenizer.json, and tokenizer_config.json and chat_template.jinja if it has them
    config: dict  # config.json's fields
    generation_config: dict  # generation_config.json's fields ({} without one)


def model_files(spec: str) -> ModelFiles:
    """The files of the model ``spec`` names (a ``ValueError`` in one line when there is none)."""
    if not spec:
        raise missing_setting("model_dir")
    if spec.startswith("random:"):
        name = spec.split(":", 1)[1]
        return ModelFiles(RANDOM_TOKENIZER_DIR, preset(name), dict(GENERATION_CONFIGS.get(name, {})))
    directory = builtin_model_dir(spec.split(":", 1)[1]) if spec.startswith("builtin:") else Path(spec)
    directory = directory.expanduser()
    return ModelFiles(
        directory, _json_of(directory / "config.json"), _json_of(directory / "generation_config.json")
    )


def _json_of(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}
