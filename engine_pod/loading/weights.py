"""A checkpoint's tensors under our parameter names, through its family's name map (its module in
``engine_pod/families/``), and our state dict written back under the checkpoint's names."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import save_file
from tqdm import tqdm

from engine_pod.families.registry import family_of
from engine_pod.models.checkpoint_files import PART, CheckpointError, iter_checkpoint, join_parts, part_sizes
from engine_pod.models.config import ModelConfig
from engine_pod.progress import tqdm_disable


def name_map(config: ModelConfig) -> dict[str, str]:
    """Checkpoint parameter name -> our module's parameter name, for every parameter (the family's map)."""
    mapping = family_of(config).name_map
    if mapping is None:
        raise CheckpointError(f"{config.family} checkpoints are read by the family's own loader")
    return mapping(config)


def load_state_dict(
    config: ModelConfig, model_dir: Path, keep: Callable[[str, torch.Tensor], torch.Tensor] | None = None
) -> dict[str, torch.Tensor]:
    """Our state dict from the checkpoint, checking that every parameter is present exactly once; ``keep``:
    what to keep of each tensor as it is read (a tensor-parallel rank's slice: the whole is never held)."""
    mapping = name_map(config)
    state: dict[str, torch.Tensor] = {}
    tensors = tqdm(  # a bar on a terminal only (an 8B checkpoint takes a while to read)
        iter_checkpoint(model_dir),
        total=len(mapping),
        desc="loading weights",
        unit="tensor",
        disable=tqdm_disable(),
    )
    for key, tensor in tensors:
        if key not in mapping:
            if key.endswith("rotary_emb.inv_freq"):
                continue
            raise CheckpointError(f"unexpected parameter {key!r} for a {config.family} checkpoint")
        ours = mapping[key]
        state[ours] = tensor if keep is None or PART in ours else keep(ours, tensor)
    missing = sorted(set(mapping) - {k for k, v in mapping.items() if v in state})
    if missing:
        raise CheckpointError(f"checkpoint is missing {len(missing)} parameters, e.g. {missing[0]!r}")
    joined = {key.split(PART)[0] for key in state if PART in key}
    state = join_parts(state)
    for name in joined if keep is not None else ():  # a fused parameter is cut once it is whole
        state[name] = keep(name, state[name])
    if config.tied_embeddings:
        state["lm_head.weight"] = state["word_embeddings.weight"]
    return state


def save_checkpoint(config: ModelConfig, state: dict[str, torch.Tensor], model_dir: Path) -> None:
    """Write our state dict under the real checkpoint's parameter names."""
    inverse = {ours: theirs for theirs, ours in name_map(config).items()}
    state = dict(state)
    for name in [n for n in state if f"{n}{PART}0" in inverse]:  # pieces the checkpoint keeps apart
        for index, piece in enumerate(state.pop(name).split(part_sizes(config, name))):
            state[f"{name}{PART}{index}"] = piece
    tensors = {inverse[name]: tensor.contiguous() for name, tensor in state.items() if name in inverse}
    save_file(tensors, str(Path(model_dir) / "model.safetensors"), metadata={"format": "pt"})
