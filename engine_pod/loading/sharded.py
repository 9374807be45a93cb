"""One rank's shard of a model: each process of a tensor-parallel group builds and loads only its slices.

A checkpoint's tensors are read one at a time and cut to the rank's slice as they are read (no rank holds
the whole model); a random preset is drawn whole on the host, as one process draws it, and cut, so every
group size holds the same model. The preflight judges the rank's own parameters against its device.
"""

from __future__ import annotations

import logging

import torch

from dllm_contracts.model_source import ModelLoadError, resolve_model_dir
from engine_pod.families.registry import family_of
from engine_pod.loading.config_readers import load_config
from engine_pod.loading.loader import (
    LoadedModel,
    check_weights_fit,
    expect_family,
    load_model,
    no_initial_draws,
    parse_device,
    parse_dtype,
)
from engine_pod.loading.presets import preset_config
from engine_pod.loading.tokenizer_files import LazyTokenizer, eos_ids, has_tokenizer
from engine_pod.loading.weights import load_state_dict
from engine_pod.parallel.group import TensorParallel

logger = logging.getLogger(__name__)


def load_shard(
    spec: str,
    parallel: TensorParallel,
    device: str = "cpu",
    dtype: str = "float32",
    seed: int = 0,
    family: str | None = None,
) -> LoadedModel:
    """This rank's part of ``spec`` on ``device`` in ``dtype`` (see ``load_model``)."""
    torch_device, torch_dtype = parse_device(device), parse_dtype(dtype)
    random = spec.startswith("random:")
    model_dir = None if random else resolve_model_dir(spec)
    config = preset_config(spec.split(":", 1)[1]) if random else load_config(model_dir)
    config = expect_family(config, family, spec)
    record = family_of(config)
    if record.tensor_parallel is None:
        raise ModelLoadError(
            f"{record.display_name} does not run tensor-parallel yet: use --tensor-parallel 1"
        )
    shards = record.tensor_parallel(config, parallel)
    with torch.device("meta"), no_initial_draws():
        model = shards.build(record.architecture)
    check_weights_fit(config, torch_device, torch_dtype, sum(p.numel() for p in model.parameters()))
    model = model.to(torch_dtype).to_empty(device=torch_device).eval()
    if model_dir is not None and record.name_map is not None:
        state = load_state_dict(config, model_dir, keep=shards.shard)
    elif model_dir is not None and record.read_state is not None:  # the family's own layout, cut as read
        state = record.read_state(config, model_dir, shards.shard)
    else:  # drawn whole (or a layout only its family's loader reads): then cut
        whole = load_model(spec, "cpu", dtype, seed, family).model.state_dict()
        state = {name: shards.shard(name, tensor) for name, tensor in whole.items()}
        del whole
    model.load_state_dict({name: tensor.to(torch_dtype) for name, tensor in state.items()})
    shards.finish(model)  # the family's inference layout (fused projections, tied embeddings, constants)
    tokenizer = LazyTokenizer(model_dir) if model_dir is not None and has_tokenizer(model_dir) else None
    config = config.with_eos(eos_ids(config, model_dir))
    logger.debug("loaded rank %d of %d of %s on %s", parallel.rank, parallel.size, spec, torch_device)
    source = spec if random else str(model_dir)
    return LoadedModel(model, config, tokenizer, source, torch_device, torch_dtype, parallel)
