"""Load a model and its tokenizer from a local directory, a Hugging Face repo id, or ``random:PRESET``:
the whole model in one process (``loading/sharded.py`` loads a rank's part by the same path)."""

from __future__ import annotations

from typing import Any

import torch

from dllm_contracts.defaults import RANDOM_TOKENIZER_DIR
from dllm_contracts.model_source import resolve_model_dir
from engine_pod.families.registry import family_of
from engine_pod.loading.config_readers import load_config
from engine_pod.loading.loaded import (
    DTYPES,
    LoadedModel,
    expect_family,
    no_initial_draws,
    parse_device,
    parse_dtype,
)
from engine_pod.loading.materialize import materialize
from engine_pod.loading.memory_check import check_weights_fit, parameter_count
from engine_pod.loading.presets import preset_config
from engine_pod.loading.sharded import load_shard
from engine_pod.loading.tokenizer_files import LazyTokenizer, eos_ids, has_tokenizer

__all__ = [
    "DTYPES",
    "LoadedModel",
    "build_model",
    "check_weights_fit",
    "expect_family",
    "load_metadata",
    "load_model",
    "no_initial_draws",
    "parameter_count",
    "parse_device",
    "parse_dtype",
]


def build_model(config: Any, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """The model's modules with uninitialised storage allocated once, directly in ``dtype`` on ``device``."""
    architecture = family_of(config).architecture
    if device.type != "meta":
        check_weights_fit(config, device, dtype)
    with torch.device("meta"), no_initial_draws():
        model = architecture(config)
    return materialize(model.to(dtype), device).eval()


def load_metadata(spec: str, family: str | None = None) -> tuple[Any, Any]:
    """The config (EOS ids resolved) and tokenizer of ``spec`` without loading any weights; ``family``:
    the family the caller expects (None: any), refused in one line for a checkpoint of another."""
    if spec.startswith("random:"):
        config = expect_family(preset_config(spec.split(":", 1)[1]), family, spec)
        return config.with_eos(eos_ids(config, None)), LazyTokenizer(RANDOM_TOKENIZER_DIR)
    model_dir = resolve_model_dir(spec)
    config = expect_family(load_config(model_dir), family, spec)
    tokenizer = LazyTokenizer(model_dir) if has_tokenizer(model_dir) else None
    return config.with_eos(eos_ids(config, model_dir)), tokenizer


def load_model(
    spec: str, device: str = "cpu", dtype: str = "float32", seed: int = 0, family: str | None = None
) -> LoadedModel:
    """Load ``spec`` (directory, repo id, or random:PRESET) onto ``device`` in ``dtype``; ``family``: the
    family expected (None: any), a checkpoint of another refused in one line before any weight is read."""
    return load_shard(spec, None, device, dtype, seed, family)
