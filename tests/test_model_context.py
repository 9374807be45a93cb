"""The torch-free reading of a model's context (what the gateway limits prompts by) agrees with the
engine's reading of the same config, for every preset and for configs that name no context."""

from __future__ import annotations

import pytest

from dllm_contracts.model_context import FAMILY_CONTEXT, context_length_of
from dllm_contracts.model_presets import PRESETS
from engine_pod.loading.config_readers import config_from_dict
from engine_pod.loading.presets import preset_config


def _context_fields(config: dict) -> dict:
    """``config`` without the fields that name its context (the family's default then applies)."""
    names = ("max_position_embeddings", "max_sequence_length")
    bare = {k: v for k, v in config.items() if k not in names}
    if "text_config" in config:
        bare["text_config"] = {k: v for k, v in config["text_config"].items() if k not in names}
    return bare


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_the_gateway_reads_the_context_the_engine_reads(name):
    assert context_length_of(PRESETS[name]) == preset_config(name).max_position_embeddings


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_a_config_without_its_context_gets_the_family_default_the_engine_fills_in(name):
    bare = _context_fields(PRESETS[name])
    assert context_length_of(bare) == config_from_dict(bare).max_position_embeddings


def test_every_family_has_a_default_and_an_unknown_model_none():
    assert context_length_of({"model_type": "gpt2"}) is None
    assert set(FAMILY_CONTEXT) >= {str(PRESETS[n]["model_type"]).lower() for n in PRESETS}
    assert context_length_of(PRESETS["llada2-tiny"]) == 32768  # the context the long-prompt benchmarks use
