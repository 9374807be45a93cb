"""The checkpoint-name map of a Llama-style family whose checkpoint names its layers' parameters one by one
(LLaDA, Dream): its top-level names, then every layer's under the layer's prefix."""

from __future__ import annotations

from engine_pod.models.config import ModelConfig


def layered_name_map(
    config: ModelConfig, top_level: dict[str, str], layer_prefix: str, layer_names: dict[str, str]
) -> dict[str, str]:
    """Checkpoint name -> ours for every parameter: ``top_level`` as given, and each layer's
    ``layer_names`` under ``layer_prefix.format(index)`` (q/k/v biases only where the config has them)."""
    mapping = dict(top_level)
    for index in range(config.num_layers):
        for theirs, ours in layer_names.items():
            if theirs.endswith(".bias") and not config.qkv_bias:
                continue
            mapping[layer_prefix.format(index) + theirs] = f"layers.{index}.{ours}"
    return mapping
