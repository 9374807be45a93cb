"""What the canvas kind needs of a model (runner/model_interface.py declares the rest; its config:
``ContextConfig``, context_cache.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from engine_pod.runner.model_interface import EngineModel

if TYPE_CHECKING:  # tensors: named here, never imported at run time
    import torch

    from engine_pod.device_buffers import DeviceBuffers
    from engine_pod.kinds.canvas.context_cache import ContextCache, ContextConfig, ContextRows


class CanvasModel(EngineModel, Protocol):
    """A causal encoder writing a context's keys and values, and a decoder denoising canvases over them."""

    config: ContextConfig

    def encode_chunks(
        self, chunks: list[tuple[int, ...]], caches: list[ContextCache], buffers: DeviceBuffers | None = None
    ) -> None:
        """Append ``chunks[r]`` (context tokens, any lengths) to ``caches[r]`` in one encoder forward."""
        ...

    def denoise(
        self,
        canvas: torch.Tensor,
        caches: ContextCache | list[ContextCache] | ContextRows,
        soft: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Float32 logits [R, L, V] of the canvases [R, L], row r over its cache, given the previous step's
        soft embeddings (None: the first step)."""
        ...

    def soft_embeddings(
        self, processed_logits: torch.Tensor, probabilities: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The next step's self-conditioning input [R, L, D] from this step's processed logits [R, L, V]."""
        ...
