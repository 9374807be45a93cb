"""What of DiffusionGemma's multimodal side the engine refuses, and what it sets aside.

DiffusionGemma is an image-and-text model; the engine serves its text path only. Every checkpoint
carries a ``vision_config`` section and a vision tower (``model.encoder.vision_tower.*``,
``model.encoder.embed_vision.*``): the section is accepted and the tower's weights are skipped, since
refusing them would refuse every real checkpoint. Refused by name: other modality sections (audio,
video), image inputs on a request (``pixel_values`` and the fields that go with it) and image tokens
in a prompt, which only an image input can fill.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from engine_pod.models.config import ModelConfigError

VISION_WEIGHT_PREFIXES = ("model.encoder.vision_tower.", "model.encoder.embed_vision.")
_REFUSED_SECTIONS = ("audio_config", "video_config")
_KNOWN_SECTIONS = ("text_config", "vision_config")
MULTIMODAL_INPUTS = (
    "pixel_values",
    "image_position_ids",
    "mm_token_type_ids",
    "mm_encoder_outputs",
    "pixel_values_videos",
    "input_features",
)


class MultimodalInputError(ValueError):
    """A request carries an input of a modality the engine does not serve (text only)."""


def check_config_sections(raw: Mapping[str, Any]) -> None:
    """Refuse, by name, a config section of a modality the engine does not serve."""
    for key in raw:
        if key in _REFUSED_SECTIONS or (key.endswith("_config") and key not in _KNOWN_SECTIONS):
            raise ModelConfigError(
                f"config.json section {key!r} is a modality the engine does not serve (text only)"
            )


def is_vision_weight(name: str) -> bool:
    """The vision tower's and its projection's tensors, which the text path never reads."""
    return name.startswith(VISION_WEIGHT_PREFIXES)


def refuse_multimodal_inputs(inputs: Mapping[str, Any]) -> None:
    """Refuse a request that names an image, video or audio input (even an empty one)."""
    named = [key for key in MULTIMODAL_INPUTS if key in inputs]
    if named:
        raise MultimodalInputError(
            f"multimodal input(s) {named} are not supported: DiffusionGemma is served text only"
        )


def refuse_image_tokens(prompt_ids: Iterable[int], special: Mapping[str, int]) -> None:
    """Refuse a prompt holding an image placeholder or image-boundary token (``special``: the config's
    field name -> id), which the reference fills from pixel values."""
    present = set(prompt_ids)
    named = [f"{name}={token}" for name, token in special.items() if token in present]
    if named:
        raise MultimodalInputError(
            f"the prompt holds image token(s) {named}: image inputs are not supported (text only)"
        )
