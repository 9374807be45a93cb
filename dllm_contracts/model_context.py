"""A model's context length, read from its config.json without torch: how many positions a prompt and
its generation may take together (what the gateway's default prompt limit derives from).

A checkpoint that does not name its context gets its family's default, the same one the engine's family
readers (engine_pod/families/) fill in (tests/test_model_context.py holds them alike)."""

from __future__ import annotations

from typing import Any

from dllm_contracts.family_table import FAMILY_TABLE

CONTEXT_FIELDS = ("max_position_embeddings", "max_sequence_length", "n_positions")
# a family's context where its config names none, by config.json's model_type (the engine's readers' default)
FAMILY_CONTEXT = {kind.lower(): row["default_context"] for row in FAMILY_TABLE for kind in row["model_types"]}


def context_length_of(config: dict[str, Any]) -> int | None:
    """The context ``config`` (config.json's fields) gives its model: a field naming it (a multimodal
    config's under text_config), else its family's default; None when neither says."""
    for fields in (config, config.get("text_config") or {}):
        for name in CONTEXT_FIELDS:
            value = fields.get(name)
            if isinstance(value, int) and value > 0:
                return value
    return FAMILY_CONTEXT.get(str(config.get("model_type", "")).lower())
