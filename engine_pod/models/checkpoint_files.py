"""A checkpoint's files: ``model.safetensors`` or a sharded set listed in ``model.safetensors.index.json``,
its tensors as sources to read boxes of (``loading/safetensors_file.py``), and the parameters some
checkpoints keep in pieces that the engine fuses (SDAR's q, k and v)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from engine_pod.models.config import ModelConfig
from engine_pod.models.safetensors_file import FileTensor, SafetensorsError, file_tensors
from engine_pod.models.tensor_sources import JoinedPieces, TensorSource


class CheckpointError(ValueError):
    """The checkpoint's files are missing or do not match its config."""


PART = "#"  # ours#i: the i-th piece of one of our parameters that the checkpoint stores in pieces


def part_sizes(config: ModelConfig, name: str) -> list[int]:
    """Rows of each piece of a parameter stored in pieces (the fused q/k/v projection)."""
    if "query_key_value" not in name:
        raise CheckpointError(f"{name} is not stored in pieces")
    hd = config.head_dim
    return [config.num_heads * hd, config.num_kv_heads * hd, config.num_kv_heads * hd]


def join_parts(state: dict[str, TensorSource]) -> dict[str, TensorSource]:
    """Pieces ``name#0``, ``name#1``... read as one ``name`` (side by side along the output rows)."""
    pieces: dict[str, dict[int, TensorSource]] = {}
    for key in [k for k in state if PART in k]:
        name, index = key.split(PART)
        pieces.setdefault(name, {})[int(index)] = state.pop(key)
    for name, parts in pieces.items():
        state[name] = JoinedPieces(tuple(parts[i] for i in sorted(parts)))
    return state


def weight_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [model_dir / shard for shard in shards]
    single = model_dir / "model.safetensors"
    if single.is_file():
        return [single]
    raise CheckpointError(f"no model.safetensors or model.safetensors.index.json in {model_dir}")


def checkpoint_tensors(model_dir: Path) -> Iterator[tuple[str, FileTensor]]:
    """Every tensor of the checkpoint as a source to read boxes of (no data read here)."""
    for path in weight_files(model_dir):
        if not path.is_file():
            raise CheckpointError(f"missing weight shard {path}")
        try:
            yield from file_tensors(path).items()
        except SafetensorsError as exc:
            raise CheckpointError(str(exc)) from None
