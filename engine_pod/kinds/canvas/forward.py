"""The decoder forwards of one canvas cycle: which rows each computes and what they are fed."""

from __future__ import annotations

import torch

from engine_pod.kinds.canvas.context_cache import ContextRows
from engine_pod.kinds.canvas.model_interface import CanvasModel


class CanvasForward:
    """What the decoder's forwards of one cycle take: the rows sampled (``gather_rows``: only those still
    running, picked out of the batch on the device as rows stop) or every computed row (a static batch:
    stopped rows keep their last input, unsampled ones their padding)."""

    def __init__(
        self, model: CanvasModel, batch: ContextRows, running_at: torch.Tensor, gather_rows: bool
    ) -> None:
        self.model, self.batch, self.gather_rows = model, batch, gather_rows
        self.running_at = running_at  # the running rows' places in a static batch
        self.rows = len(running_at) if gather_rows else len(batch.caches)
        self.soft: torch.Tensor | None = None  # the self-conditioning input (None: the first step's zeros)
        self.canvas: torch.Tensor | None = None  # a static batch's canvases, every computed row's
        self.everyone = not gather_rows and len(running_at) == len(batch.caches)

    def logits(self, canvas: torch.Tensor) -> torch.Tensor:
        """The running rows' logits [n, L, V] for their canvases [n, L]."""
        if self.gather_rows:
            return self.model.denoise(canvas, self.batch, self.soft)
        if self.canvas is None:
            pad = self.model.config.pad_token_id or 0
            self.canvas = canvas.new_full((len(self.batch.caches), canvas.shape[1]), pad)
        self.canvas.index_copy_(0, self.running_at, canvas)
        logits = self.model.denoise(self.canvas, self.batch, self.soft)
        return logits if self.everyone else logits.index_select(0, self.running_at)

    def keep(self, keep: list[int], index: torch.Tensor) -> None:
        """Only the running rows at ``keep`` (``index`` on the device) go on."""
        self.everyone = False
        if self.gather_rows:
            self.batch = self.batch.rows(keep, index)
            self.rows = len(keep)
        else:
            self.running_at = self.running_at.index_select(0, index)

    def condition(self, soft: torch.Tensor) -> None:
        """The running rows' next self-conditioning input [n, L, D]."""
        if self.gather_rows:
            self.soft = soft
            return
        if self.soft is None:
            self.soft = soft.new_zeros(len(self.batch.caches), *soft.shape[1:])
        self.soft.index_copy_(0, self.running_at, soft)
