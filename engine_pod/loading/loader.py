"""Load a model and its tokenizer from a local directory, a Hugging Face repo id, or ``random:PRESET``."""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from dllm_contracts.defaults import RANDOM_TOKENIZER_DIR
from dllm_contracts.model_source import ModelLoadError, resolve_model_dir
from engine_pod.families.record import ModelFamily
from engine_pod.families.registry import family_of
from engine_pod.loading.config_readers import load_config
from engine_pod.loading.presets import preset_config
from engine_pod.loading.tokenizer_files import LazyTokenizer, eos_ids, has_tokenizer
from engine_pod.loading.weights import load_state_dict
from engine_pod.models.config import ModelConfig
from engine_pod.parallel.group import TensorParallel

logger = logging.getLogger(__name__)

DTYPES = {name: getattr(torch, name) for name in ("float32", "bfloat16", "float16", "float64")}


@dataclass
class LoadedModel:
    model: torch.nn.Module  # its family's architecture
    config: Any  # its family's config (a ModelConfig for the Llama-style families)
    tokenizer: Any  # a transformers tokenizer, or None when the directory has none
    source: str
    device: torch.device
    dtype: torch.dtype
    parallel: TensorParallel = field(default_factory=TensorParallel)  # its rank's place (one: the whole)

    @property
    def family(self) -> ModelFamily:
        return family_of(self.config)

    @property
    def weights_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters())


def parse_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ModelLoadError(f"unknown dtype {name!r}; choose one of {sorted(DTYPES)}")
    return DTYPES[name]


def parse_device(name: str) -> torch.device:
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ModelLoadError(f"unknown device {name!r}: {exc}") from exc
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ModelLoadError(f"device {name!r} requested but CUDA is not available on this machine")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ModelLoadError(
                f"device {name!r} does not exist: {torch.cuda.device_count()} CUDA device(s)"
            )
    elif device.type not in ("cpu", "mps"):
        raise ModelLoadError(f"unsupported device {name!r}; use cpu or cuda[:N]")
    return device


def _random_init(model: torch.nn.Module, seed: int) -> None:
    """Normal(0, 0.02) weights and unit norms, drawn in place on the model's device and in its dtype.

    An 8B model initialises in seconds on a GPU this way (no float32 copy, no host round trip); the
    draw is deterministic for a given seed, device type and dtype.
    """
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.normal_(0.0, 0.02, generator=generator)


_INITIALISERS = ("normal_", "uniform_", "kaiming_uniform_", "trunc_normal_", "ones_", "zeros_")


@contextlib.contextmanager
def no_initial_draws():
    """Modules built without drawing their initial weights, which are loaded (or drawn) afterwards: even on
    the meta device a draw imports torch's compiler stack, most of a second of every model load."""
    saved = {name: getattr(torch.nn.init, name) for name in _INITIALISERS}
    for name in _INITIALISERS:
        setattr(torch.nn.init, name, lambda tensor, *_args, **_kwargs: tensor)
    try:
        yield
    finally:
        for name, function in saved.items():
            setattr(torch.nn.init, name, function)


def build_model(config: Any, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """The model's modules with uninitialised storage allocated once, directly in ``dtype`` on ``device``."""
    architecture = family_of(config).architecture
    if device.type != "meta":
        check_weights_fit(config, device, dtype)
    with torch.device("meta"), no_initial_draws():
        model = architecture(config)
    return model.to(dtype).to_empty(device=device).eval()


def parameter_count(config: Any) -> int:
    """The model's parameters, counted on a meta model without drawing any weights: by the family's own
    count where it has one, else on a model of its distinct layers (every layer after the first dense ones
    is alike), in milliseconds where building all of a large MoE's experts takes seconds."""
    family = family_of(config)
    if family.count_parameters is not None:
        with no_initial_draws():
            return family.count_parameters(config)
    distinct = min(config.num_layers, (config.moe.first_dense_layers if config.moe else 0) + 1)
    with torch.device("meta"), no_initial_draws():
        model = family.architecture(replace(config, num_layers=distinct))
    last = sum(p.numel() for p in model.layers[-1].parameters())
    tied = (
        config.vocab_size * config.hidden_size if config.tied_embeddings else 0
    )  # one tensor, counted twice
    return sum(p.numel() for p in model.parameters()) + (config.num_layers - distinct) * last - tied


def check_weights_fit(
    config: Any, device: torch.device, dtype: torch.dtype, parameters: int | None = None
) -> None:
    """Refuse, in one line naming both sizes, weights larger than the memory the device has for them
    (before any is allocated: a model that cannot fit would otherwise be killed for memory much later);
    ``parameters``: those this process holds (a tensor-parallel rank's), else the whole model's."""
    from engine_pod.device_memory import available_memory

    needed = (parameter_count(config) if parameters is None else parameters) * dtype.itemsize
    available = available_memory(device)
    if needed > available:
        name = str(dtype).removeprefix("torch.")
        raise ModelLoadError(
            f"the model's weights need {_gib(needed)} in {name}, more than the {_gib(available)} of "
            f"memory on {device}; choose a smaller model, a lower-precision --dtype, a larger device or more --tensor-parallel ranks"
        )


def _gib(size: int) -> str:
    return f"{size / 2**30:.1f} GiB"


def load_metadata(spec: str, family: str | None = None) -> tuple[Any, Any]:
    """The config (EOS ids resolved) and tokenizer of ``spec`` without loading any weights; ``family``:
    the family the caller expects (None: any), refused in one line for a checkpoint of another."""
    if spec.startswith("random:"):
        config = expect_family(preset_config(spec.split(":", 1)[1]), family, spec)
        return config.with_eos(eos_ids(config, None)), LazyTokenizer(RANDOM_TOKENIZER_DIR)
    model_dir = resolve_model_dir(spec)
    config = expect_family(load_config(model_dir), family, spec)
    tokenizer = LazyTokenizer(model_dir) if has_tokenizer(model_dir) else None
    return config.with_eos(eos_ids(config, model_dir)), tokenizer


def expect_family(config: Any, family: str | None, spec: str) -> Any:
    """``config``, unless the caller expects another family: then ModelLoadError in one line."""
    if family is not None and config.family != family:
        raise ModelLoadError(
            f"{spec} is a {config.family} checkpoint, not the {family} one expected "
            f"(--family {family}, a DLLMService's spec.model.family): name its family, or another model"
        )
    return config


def load_model(
    spec: str, device: str = "cpu", dtype: str = "float32", seed: int = 0, family: str | None = None
) -> LoadedModel:
    """Load ``spec`` (directory, repo id, or random:PRESET) onto ``device`` in ``dtype``; ``family``: the
    family expected (None: any), a checkpoint of another refused in one line before any weight is read."""
    torch_device, torch_dtype = parse_device(device), parse_dtype(dtype)
    if spec.startswith("random:"):
        config = expect_family(preset_config(spec.split(":", 1)[1]), family, spec)
        record = family_of(config)
        model = build_model(config, torch_device, torch_dtype)
        (record.random_init or _random_init)(model, seed)
        _finish(model, config)
        config = config.with_eos(eos_ids(config, None))
        return LoadedModel(
            model, config, LazyTokenizer(RANDOM_TOKENIZER_DIR), spec, torch_device, torch_dtype
        )
    model_dir = resolve_model_dir(spec)
    config = expect_family(load_config(model_dir), family, spec)
    record = family_of(config)
    if record.load_weights is not None:  # its own checkpoint layout
        check_weights_fit(config, torch_device, torch_dtype)
        model = record.load_weights(model_dir, torch_device, torch_dtype)
    else:
        model = build_model(config, torch_device, torch_dtype)
        state = load_state_dict(config, model_dir)
        _check_complete(model, state)
        model.load_state_dict({k: v.to(torch_dtype) for k, v in state.items()})
        _finish(model, config)
    tokenizer = LazyTokenizer(model_dir) if has_tokenizer(model_dir) else None
    config = config.with_eos(eos_ids(config, model_dir))
    logger.info("loaded %s (%s) on %s as %s", spec, config.family, torch_device, dtype)
    return LoadedModel(model, config, tokenizer, str(model_dir), torch_device, torch_dtype)


def _finish(model: torch.nn.Module, config: Any) -> None:
    """What a model needs after its weights are in: the family's own step, else tied embeddings and
    fused projections."""
    finish = family_of(config).finish
    if finish is not None:
        finish(model, config)
        return
    _tie_embeddings(model, config)
    model.fuse_projections()


def _tie_embeddings(model, config: ModelConfig) -> None:
    """One tensor for the input embedding and the LM head where the checkpoint ties them."""
    if config.tied_embeddings:
        model.lm_head.weight = model.word_embeddings.weight


def _check_complete(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    expected = {name for name, _ in model.named_parameters()}
    missing = expected - set(state)
    if missing:
        raise ModelLoadError(f"checkpoint lacks parameters {sorted(missing)[:3]}")
    for name, param in model.named_parameters():
        if tuple(param.shape) != tuple(state[name].shape):
            raise ModelLoadError(
                f"parameter {name} has shape {tuple(state[name].shape)} in the checkpoint, "
                f"expected {tuple(param.shape)} from config.json"
            )
