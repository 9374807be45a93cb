"""Load a model and its tokenizer from a local directory, a Hugging Face repo id, or ``random:PRESET``."""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from dllm_contracts.model_source import ModelLoadError, resolve_model_dir
from engine_pod.models.block_transformer import BlockDiffusionTransformer
from engine_pod.models.config import ModelConfig
from engine_pod.models.config_readers import load_config
from engine_pod.models.diffusion_gemma.config import DiffusionGemmaConfig
from engine_pod.models.diffusion_gemma.model import DiffusionGemmaModel
from engine_pod.models.diffusion_gemma.random_init import random_init as diffusion_gemma_random_init
from engine_pod.models.diffusion_gemma.weights import load_model as load_diffusion_gemma
from engine_pod.models.presets import preset_config
from engine_pod.models.transformer import DiffusionTransformer
from engine_pod.models.weights import load_state_dict

logger = logging.getLogger(__name__)

DTYPES = {name: getattr(torch, name) for name in ("float32", "bfloat16", "float16", "float64")}
_END_TOKENS = ("<|eot_id|>", "<|endoftext|>", "<|im_end|>", "<eos>")


@dataclass
class LoadedModel:
    model: DiffusionTransformer | BlockDiffusionTransformer | DiffusionGemmaModel
    config: ModelConfig | DiffusionGemmaConfig
    tokenizer: Any  # a transformers tokenizer, or None when the directory has none
    source: str
    device: torch.device
    dtype: torch.dtype

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


def _eos_ids(config: ModelConfig | DiffusionGemmaConfig, model_dir: Path | None) -> tuple[int, ...]:
    if isinstance(config, DiffusionGemmaConfig):  # its generation config's, as its reference generate's
        return config.eos_token_ids
    ids = list(config.eos_token_ids)
    generation = model_dir / "generation_config.json" if model_dir else None
    if generation is not None and generation.is_file():
        value = json.loads(generation.read_text()).get("eos_token_id")
        ids += value if isinstance(value, list) else ([value] if value is not None else [])
    if model_dir is not None and _has_tokenizer(model_dir):
        ids += _end_token_ids(model_dir)
    return tuple(dict.fromkeys(int(i) for i in ids if i != config.mask_token_id))


def _has_tokenizer(model_dir: Path) -> bool:
    return any((model_dir / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json"))


class LazyTokenizer:
    """The directory's transformers tokenizer, loaded on first use: loading transformers costs about a
    second, which a process that only runs the model (a profiling child, a worker) need not pay."""

    def __init__(self, model_dir: Path) -> None:
        self.model_dir = model_dir
        self._tokenizer: Any = None

    def load(self) -> Any:
        if self._tokenizer is None:
            self._tokenizer = _load_tokenizer(self.model_dir)
            if self._tokenizer is None:
                raise ModelLoadError(f"could not load the tokenizer from {self.model_dir}")
        return self._tokenizer

    def __getattr__(self, name: str) -> Any:
        return getattr(self.load(), name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.load()(*args, **kwargs)


def _end_token_ids(model_dir: Path) -> list[int]:
    """The tokenizer's EOS and end-of-turn ids, read from its files with ``tokenizers`` (no transformers);
    the transformers tokenizer answers where the directory has no tokenizer.json."""
    if not (model_dir / "tokenizer.json").is_file():
        tokenizer = _load_tokenizer(model_dir)
        if tokenizer is None:
            return []
        vocab, eos = tokenizer.get_vocab(), tokenizer.eos_token
    else:
        from tokenizers import Tokenizer

        vocab = Tokenizer.from_file(str(model_dir / "tokenizer.json")).get_vocab(with_added_tokens=True)
        eos = _configured_eos(model_dir)
    return [vocab[token] for token in (eos, *_END_TOKENS) if token is not None and token in vocab]


def _configured_eos(model_dir: Path) -> str | None:
    """The EOS token's text, as tokenizer_config.json (or special_tokens_map.json) names it."""
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        path = model_dir / name
        value = json.loads(path.read_text()).get("eos_token") if path.is_file() else None
        value = value.get("content") if isinstance(value, dict) else value
        if value:
            return value
    return None


def _load_tokenizer(model_dir: Path) -> Any:
    if not _has_tokenizer(model_dir):
        return None
    from transformers import AutoTokenizer
    from transformers.utils import logging as transformers_logging

    transformers_logging.set_verbosity_error()  # it warns about our model_type, which it does not know
    try:
        return AutoTokenizer.from_pretrained(str(model_dir))
    except Exception as exc:  # a broken tokenizer should not stop id-level use of the model
        logger.warning("could not load the tokenizer from %s: %s", model_dir, exc)
        return None


def _random_init(model: DiffusionTransformer, seed: int) -> None:
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
def _no_initial_draws():
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


def build_model(
    config: ModelConfig, device: torch.device, dtype: torch.dtype
) -> DiffusionTransformer | BlockDiffusionTransformer:
    """The model's modules with uninitialised storage allocated once, directly in ``dtype`` on ``device``."""
    architecture = _architecture(config)
    if device.type != "meta":
        check_weights_fit(config, device, dtype)
    with torch.device("meta"), _no_initial_draws():
        model = architecture(config)
    return model.to(dtype).to_empty(device=device).eval()


def _architecture(config: ModelConfig | DiffusionGemmaConfig) -> type[torch.nn.Module]:
    if isinstance(config, DiffusionGemmaConfig):
        return DiffusionGemmaModel
    return BlockDiffusionTransformer if config.block_diffusion else DiffusionTransformer


def parameter_count(config: ModelConfig | DiffusionGemmaConfig) -> int:
    """The model's parameters, counted on a meta model of its distinct layers (every layer after the
    first dense ones is alike), in milliseconds where building all of a large MoE's experts takes seconds."""
    architecture = _architecture(config)
    if architecture is DiffusionGemmaModel:  # shared tensors counted once; meta experts cost nothing
        with torch.device("meta"), _no_initial_draws():
            return sum(p.numel() for p in architecture(config).parameters())
    distinct = min(config.num_layers, (config.moe.first_dense_layers if config.moe else 0) + 1)
    with torch.device("meta"), _no_initial_draws():
        model = architecture(replace(config, num_layers=distinct))
    last = sum(p.numel() for p in model.layers[-1].parameters())
    tied = (
        config.vocab_size * config.hidden_size if config.tied_embeddings else 0
    )  # one tensor, counted twice
    return sum(p.numel() for p in model.parameters()) + (config.num_layers - distinct) * last - tied


def check_weights_fit(config: ModelConfig, device: torch.device, dtype: torch.dtype) -> None:
    """Refuse, in one line naming both sizes, weights larger than the memory the device has for them
    (before any is allocated: a model that cannot fit would otherwise be killed for memory much later)."""
    from engine_pod.device_memory import available_memory

    needed = parameter_count(config) * dtype.itemsize
    available = available_memory(device)
    if needed > available:
        name = str(dtype).removeprefix("torch.")
        raise ModelLoadError(
            f"the model's weights need {_gib(needed)} in {name}, more than the {_gib(available)} of "
            f"memory on {device}; choose a smaller model, a lower-precision --dtype or a larger device"
        )


def _gib(size: int) -> str:
    return f"{size / 2**30:.1f} GiB"


def load_metadata(spec: str) -> tuple[ModelConfig, Any]:
    """The config (EOS ids resolved) and tokenizer of ``spec`` without loading any weights."""
    if spec.startswith("random:"):
        config = preset_config(spec.split(":", 1)[1])
        return config.with_eos(_eos_ids(config, None)), None
    model_dir = resolve_model_dir(spec)
    config = load_config(model_dir)
    tokenizer = LazyTokenizer(model_dir) if _has_tokenizer(model_dir) else None
    return config.with_eos(_eos_ids(config, model_dir)), tokenizer


def load_model(spec: str, device: str = "cpu", dtype: str = "float32", seed: int = 0) -> LoadedModel:
    """Load ``spec`` (directory, repo id, or random:PRESET) onto ``device`` in ``dtype``."""
    torch_device, torch_dtype = parse_device(device), parse_dtype(dtype)
    if spec.startswith("random:"):
        config = preset_config(spec.split(":", 1)[1])
        model = build_model(config, torch_device, torch_dtype)
        gemma = isinstance(config, DiffusionGemmaConfig)  # its own scales, under which canvases settle
        (diffusion_gemma_random_init if gemma else _random_init)(model, seed)
        _finish(model, config)
        config = config.with_eos(_eos_ids(config, None))
        return LoadedModel(model, config, None, spec, torch_device, torch_dtype)
    model_dir = resolve_model_dir(spec)
    config = load_config(model_dir)
    if isinstance(config, DiffusionGemmaConfig):  # its own checkpoint layout
        model = load_diffusion_gemma(model_dir, torch_device, torch_dtype)
    else:
        model = build_model(config, torch_device, torch_dtype)
        state = load_state_dict(config, model_dir)
        _check_complete(model, state)
        model.load_state_dict({k: v.to(torch_dtype) for k, v in state.items()})
        _finish(model, config)
    tokenizer = LazyTokenizer(model_dir) if _has_tokenizer(model_dir) else None
    config = config.with_eos(_eos_ids(config, model_dir))
    logger.info("loaded %s (%s) on %s as %s", spec, config.family, torch_device, dtype)
    return LoadedModel(model, config, tokenizer, str(model_dir), torch_device, torch_dtype)


def _finish(model, config: ModelConfig | DiffusionGemmaConfig) -> None:
    """What a model needs after its weights are in (DiffusionGemma's random one: its constants)."""
    if isinstance(config, DiffusionGemmaConfig):
        model.fill_constants(scalars=True)
        return
    _tie_embeddings(model, config)
    model.fuse_projections()


def _tie_embeddings(model, config: ModelConfig) -> None:
    """One tensor for the input embedding and the LM head where the checkpoint ties them."""
    if config.tied_embeddings:
        model.lm_head.weight = model.word_embeddings.weight


def _check_complete(model: DiffusionTransformer, state: dict[str, torch.Tensor]) -> None:
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
