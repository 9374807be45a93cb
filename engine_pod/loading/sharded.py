"""Loading this process's part of a model, and only that: one process loads the whole, a rank of a group
its shard (``parallel/``), by one path.

The process's modules are built on the meta device and allocated in the target dtype (no bytes touched);
then each of its tensors is written straight from its source, a bounded chunk at a time: a checkpoint's
tensors read box by box from the file (``models/safetensors_file.py``: only the rank's slices, never the
whole tensor, never a memory map), a random preset's parameters drawn tile by tile
(``models/random_weights.py``: only the tiles a rank's slices overlap, the same model at every group
size). A process so holds its share and one chunk while it loads: no whole state dict, no second copy.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from dllm_contracts.defaults import RANDOM_TOKENIZER_DIR
from dllm_contracts.model_source import ModelLoadError, resolve_model_dir
from engine_pod.families.registry import family_of
from engine_pod.loading.config_readers import load_config
from engine_pod.loading.loaded import LoadedModel, expect_family, no_initial_draws, parse_device, parse_dtype
from engine_pod.loading.materialize import materialize
from engine_pod.loading.memory_check import check_weights_fit
from engine_pod.loading.presets import preset_config
from engine_pod.loading.tokenizer_files import LazyTokenizer, eos_ids, has_tokenizer
from engine_pod.loading.weights import checkpoint_sources
from engine_pod.models.random_weights import normal_law, random_sources
from engine_pod.models.tensor_sources import TensorSource
from engine_pod.parallel.cuts import Cut
from engine_pod.parallel.group import TensorParallel
from engine_pod.progress import tqdm_disable

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WholeModel:
    """One process's plan: the whole model, each tensor whole."""

    config: Any

    def build(self, architecture: Callable[[Any], torch.nn.Module]) -> torch.nn.Module:
        return architecture(self.config)

    def cut(self, name: str, shape: tuple[int, ...]) -> Cut:
        return Cut.whole(shape)

    def finish(self, model: torch.nn.Module, random: bool = False) -> None:
        """The family's own step, else tied embeddings and fused projections."""
        finish = family_of(self.config).finish
        if finish is not None:
            finish(model, self.config, random)
            return
        if self.config.tied_embeddings:
            model.lm_head.weight = model.word_embeddings.weight
        model.fuse_projections()


def source_config(spec: str, family: str | None) -> tuple[Any, Path | None]:
    """The config of ``spec`` and its checkpoint directory (None: a random preset), its family checked."""
    if spec.startswith("random:"):
        return expect_family(preset_config(spec.split(":", 1)[1]), family, spec), None
    model_dir = resolve_model_dir(spec)
    return expect_family(load_config(model_dir), family, spec), model_dir


def model_plan(config: Any, parallel: TensorParallel) -> Any:
    """How this process holds the model: whole, or its rank's shard (the family's split, which refuses a
    group it cannot divide in one line)."""
    if parallel.size == 1:
        return WholeModel(config)
    record = family_of(config)
    if record.tensor_parallel is None:
        raise ModelLoadError(
            f"{record.display_name} does not run tensor-parallel yet: use --tensor-parallel 1"
        )
    return record.tensor_parallel(config, parallel)


def build_part(plan: Any) -> torch.nn.Module:
    """The plan's modules on the meta device (no weights drawn)."""
    with torch.device("meta"), no_initial_draws():
        return plan.build(family_of(plan.config).architecture)


def load_shard(
    spec: str,
    parallel: TensorParallel | None = None,
    device: str = "cpu",
    dtype: str = "float32",
    seed: int = 0,
    family: str | None = None,
) -> LoadedModel:
    """This process's part of ``spec`` (directory, repo id, or random:PRESET) on ``device`` in ``dtype``:
    the whole for one process, a rank's shard in a group; ``family``: the family expected (None: any), a
    checkpoint of another refused in one line before any weight is read."""
    torch_device, torch_dtype = parse_device(device), parse_dtype(dtype)
    parallel = parallel or TensorParallel()
    config, model_dir = source_config(spec, family)
    plan = model_plan(config, parallel)
    model = build_part(plan)
    if torch_device.type != "meta":
        check_weights_fit(config, torch_device, torch_dtype, sum(p.numel() for p in model.parameters()))
    model = materialize(model.to(torch_dtype), torch_device).eval()
    random = model_dir is None
    sources = (
        _random_sources(config, seed, torch_device) if random else _checkpoint_sources(config, model_dir)
    )
    fill_model(model, sources, plan.cut, random)
    # the family's inference layout (fused projections, tied embeddings, constants)
    plan.finish(model, random)
    tokenizer = _tokenizer(model_dir)
    config = config.with_eos(eos_ids(config, model_dir))
    where = f"rank {parallel.rank} of {parallel.size} of " if parallel.size > 1 else ""
    logger.info("loaded %s%s (%s) on %s as %s", where, spec, config.family, torch_device, dtype)
    source = spec if random else str(model_dir)
    return LoadedModel(model, config, tokenizer, source, torch_device, torch_dtype, parallel)


def _tokenizer(model_dir: Path | None) -> LazyTokenizer | None:
    """A checkpoint's own tokenizer (None where it ships none); a random preset's: the byte-level one."""
    if model_dir is None:
        return LazyTokenizer(RANDOM_TOKENIZER_DIR)
    return LazyTokenizer(model_dir) if has_tokenizer(model_dir) else None


def _checkpoint_sources(config: Any, model_dir: Path) -> dict[str, TensorSource]:
    read = family_of(config).read_sources
    return read(config, model_dir) if read is not None else checkpoint_sources(config, model_dir)


def _random_sources(config: Any, seed: int, device: torch.device) -> dict[str, TensorSource]:
    """A source for each of the whole model's parameters (its shapes from a meta build of the whole)."""
    whole = build_part(WholeModel(config))
    shapes = {name: tuple(p.shape) for name, p in whole.named_parameters()}
    return random_sources(shapes, family_of(config).random_law or normal_law, seed, device)


def draw_random(model: torch.nn.Module, config: Any, seed: int) -> None:
    """A whole model's parameters drawn as its random preset's (``load_model("random:...")``'s draw)."""
    device = next(model.parameters()).device
    fill_model(model, _random_sources(config, seed, device), WholeModel(config).cut, random=True)


def fill_model(model: torch.nn.Module, sources: dict[str, TensorSource], cut_of, random: bool) -> None:
    """Write each source's cut (``cut_of(name, whole shape)``; None: not this process's) into the model's
    tensor of that name; refuse, in one line, a tensor of another shape or one left without a source
    (a random model's buffers and a tied LM head are the finish's)."""
    targets = model.state_dict(keep_vars=True)
    filled = set()
    bar = tqdm(sources.items(), desc="loading weights", unit="tensor", disable=tqdm_disable())
    with torch.no_grad():
        for name, source in bar:
            cut = cut_of(name, tuple(source.shape))
            if cut is None:
                continue
            target = targets.get(name)
            if target is None:
                raise ModelLoadError(f"the checkpoint's {name} has no place in the model")
            if cut.shape != tuple(target.shape):
                raise ModelLoadError(
                    f"parameter {name} has shape {tuple(source.shape)} in the checkpoint, expected "
                    f"{tuple(target.shape)} from config.json"
                )
            cut.fill(target.data, source)
            filled.add(name)
    parameters = {name for name, _ in model.named_parameters()}
    missing = sorted(
        name
        for name in targets
        if name not in filled and not (random and name not in parameters) and not _tied_head(model, name)
    )
    if missing:
        raise ModelLoadError(f"the checkpoint lacks parameters {missing[:3]}")


def _tied_head(model: torch.nn.Module, name: str) -> bool:
    """The LM head of a model whose config ties it to the embedding (the finish ties them)."""
    return name == "lm_head.weight" and bool(getattr(model.config, "tied_embeddings", False))
