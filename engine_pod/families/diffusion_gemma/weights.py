"""DiffusionGemma's safetensors checkpoint under its Hugging Face names, as sources of its model's tensors.

``save_pretrained`` writes each tied tensor once, under the decoder's name (``model.decoder.*``); the
encoder contributes only its per-layer ``layer_scalar`` buffers (and, untied, its own layers and
embeddings under ``model.encoder.language_model.*``, with an ``lm_head.weight``). A tied checkpoint
written under the encoder's names loads too (the decoder's copy wins where both are present, as the
reference's tying does). The vision tower's tensors are skipped (``multimodal.py``); any other name,
or a missing one, is an error. Each tensor is a source that a process reads its part of (a rank's slice,
or the whole: ``loading/loader.py``), never held whole by a rank that keeps a slice.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from engine_pod.families.diffusion_gemma.config import DiffusionGemmaConfig
from engine_pod.families.diffusion_gemma.layer import LAYER_NORMS
from engine_pod.families.diffusion_gemma.multimodal import is_vision_weight
from engine_pod.models.checkpoint_files import CheckpointError, checkpoint_tensors
from engine_pod.models.tensor_sources import InMemory, TensorSource, whole_box

logger = logging.getLogger(__name__)

DECODER, ENCODER = "model.decoder.", "model.encoder.language_model."
_SCALAR = "layer_scalar"
_UNUSED = (ENCODER + "norm.weight",)


def _layer_names(config: DiffusionGemmaConfig, index: int) -> list[str]:
    """One layer's tensor names below ``layers.{index}.``, the same in the checkpoint and in our modules."""
    names = [f"{norm}.weight" for norm in LAYER_NORMS]
    projections = ["q_proj", "k_proj", "o_proj"] + (["v_proj"] if config.is_sliding(index) else [])
    kinds = ["weight"] + (["bias"] if config.attention_bias else [])
    names += [f"self_attn.{p}.{kind}" for p in projections for kind in kinds]
    names += ["self_attn.q_norm.weight", "self_attn.k_norm.weight"]
    names += [f"mlp.{p}_proj.weight" for p in ("gate", "up", "down")]
    names += ["router.proj.weight", "router.scale", "router.per_expert_scale"]
    return names + ["experts.gate_up_proj", "experts.down_proj"]


def _stack_names(config: DiffusionGemmaConfig, prefix: str, ours: str) -> dict[str, str]:
    mapping = {f"{prefix}embed_tokens.weight": f"{ours}embed_tokens.weight"}
    for index in range(config.num_layers):
        for name in _layer_names(config, index):
            mapping[f"{prefix}layers.{index}.{name}"] = f"{ours}layers.{index}.{name}"
    return mapping


def diffusion_gemma_name_map(config: DiffusionGemmaConfig) -> dict[str, str]:
    """Checkpoint name -> our parameter name, for every parameter the text path needs (the layer
    scalars apart: see ``_scalars``)."""
    mapping = _stack_names(config, DECODER, "")
    mapping[DECODER + "norm.weight"] = "norm.weight"
    for part in ("gate_proj", "up_proj", "down_proj", "pre_norm"):
        mapping[f"{DECODER}self_conditioning.{part}.weight"] = f"self_conditioning.{part}.weight"
    if not config.tie_word_embeddings:
        mapping |= _stack_names(config, ENCODER, "encoder_")
        mapping["lm_head.weight"] = "lm_head.weight"
    return mapping


def _alias(config: DiffusionGemmaConfig, key: str) -> str:
    """A tied checkpoint may name a shared tensor after the encoder: read it as the decoder's."""
    if config.tie_word_embeddings and key.startswith(ENCODER) and not key.endswith(_SCALAR):
        return DECODER + key.removeprefix(ENCODER)
    return key


def _scalar_slot(key: str) -> tuple[str, int] | None:
    """(our buffer, layer) of a ``layer_scalar`` tensor, or None for any other name."""
    for prefix, buffer in ((DECODER, "decoder_layer_scalars"), (ENCODER, "encoder_layer_scalars")):
        if key.startswith(prefix + "layers.") and key.endswith("." + _SCALAR):
            return buffer, int(key.removeprefix(prefix + "layers.").split(".")[0])
    return None


def _skipped(config: DiffusionGemmaConfig, key: str) -> bool:
    """The vision tower; untied, the encoder's final norm (its hidden states are never read); tied, an
    LM head (it is the embeddings)."""
    if config.tie_word_embeddings:
        return is_vision_weight(key) or key == "lm_head.weight"
    return is_vision_weight(key) or key in _UNUSED


def diffusion_gemma_sources(config: DiffusionGemmaConfig, model_dir: Path) -> dict[str, TensorSource]:
    """Each of our tensors in the checkpoint, as a source to read boxes of (nothing read but the layer
    scalars), every one present exactly once."""
    mapping = diffusion_gemma_name_map(config)
    state: dict[str, TensorSource] = {}
    scalars = {
        name: [None] * config.num_layers for name in ("encoder_layer_scalars", "decoder_layer_scalars")
    }
    skipped = 0
    for key, tensor in checkpoint_tensors(Path(model_dir)):
        slot = _scalar_slot(key)
        if slot is not None:
            scalars[slot[0]][slot[1]] = tensor.read(whole_box(tensor.shape)).reshape(())
        elif _skipped(config, key):
            skipped += 1
        elif _alias(config, key) in mapping:
            name = mapping[_alias(config, key)]
            if name not in state or key.startswith(DECODER):
                state[name] = tensor
        else:
            raise CheckpointError(f"unexpected tensor {key!r} in a diffusion_gemma checkpoint")
    missing = sorted(name for name in mapping.values() if name not in state)
    if missing:
        raise CheckpointError(f"checkpoint is missing {len(missing)} tensors, e.g. {missing[0]!r}")
    for name, values in scalars.items():
        if any(value is None for value in values):
            raise CheckpointError(f"checkpoint lacks a layer_scalar of some layer ({name})")
        state[name] = InMemory(torch.stack(values))
    logger.info("found %d tensors; skipped %d (vision tower and unused)", len(state), skipped)
    return state
