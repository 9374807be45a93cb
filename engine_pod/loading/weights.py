"""A checkpoint's tensors under our parameter names, through its family's name map (its module in
``engine_pod/families/``), as sources each process reads its part of; and our state dict written back
under the checkpoint's names."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file

from engine_pod.families.registry import family_of
from engine_pod.models.checkpoint_files import (
    PART,
    CheckpointError,
    checkpoint_tensors,
    join_parts,
    part_sizes,
)
from engine_pod.models.config import ModelConfig
from engine_pod.models.tensor_sources import TensorSource


def name_map(config: ModelConfig) -> dict[str, str]:
    """Checkpoint parameter name -> our module's parameter name, for every parameter (the family's map)."""
    mapping = family_of(config).name_map
    if mapping is None:
        raise CheckpointError(f"{config.family} checkpoints are read by the family's own loader")
    return mapping(config)


def checkpoint_sources(config: ModelConfig, model_dir: Path) -> dict[str, TensorSource]:
    """Each of our parameters' tensor in the checkpoint, as a source to read boxes of (nothing read yet),
    checking that every parameter is present exactly once (pieces stored apart read as one)."""
    mapping = name_map(config)
    state: dict[str, TensorSource] = {}
    for key, tensor in checkpoint_tensors(model_dir):
        if key not in mapping:
            if key.endswith("rotary_emb.inv_freq"):
                continue
            raise CheckpointError(f"unexpected parameter {key!r} for a {config.family} checkpoint")
        state[mapping[key]] = tensor
    missing = sorted(set(mapping) - {k for k, v in mapping.items() if v in state})
    if missing:
        raise CheckpointError(f"checkpoint is missing {len(missing)} parameters, e.g. {missing[0]!r}")
    return join_parts(state)


def save_checkpoint(config: ModelConfig, state: dict[str, torch.Tensor], model_dir: Path) -> None:
    """Write our state dict under the real checkpoint's parameter names."""
    inverse = {ours: theirs for theirs, ours in name_map(config).items()}
    state = dict(state)
    for name in [n for n in state if f"{n}{PART}0" in inverse]:  # pieces the checkpoint keeps apart
        for index, piece in enumerate(state.pop(name).split(part_sizes(config, name))):
            state[f"{name}{PART}{index}"] = piece
    tensors = {inverse[name]: tensor.contiguous() for name, tensor in state.items() if name in inverse}
    save_file(tensors, str(Path(model_dir) / "model.safetensors"), metadata={"format": "pt"})
