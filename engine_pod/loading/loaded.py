"""A loaded model (this process's part of it) and what a load is asked for: device, dtype, family."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import torch

from dllm_contracts.model_source import ModelLoadError
from engine_pod.families.record import ModelFamily
from engine_pod.families.registry import family_of
from engine_pod.parallel.group import TensorParallel

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


def expect_family(config: Any, family: str | None, spec: str) -> Any:
    """``config``, unless the caller expects another family: then ModelLoadError in one line."""
    if family is not None and config.family != family:
        raise ModelLoadError(
            f"{spec} is a {config.family} checkpoint, not the {family} one expected "
            f"(--family {family}, a DLLMService's spec.model.family): name its family, or another model"
        )
    return config
