"""Where a forward's keys and values are gathered from the paged pool on a CPU: two buffers kept by the pool.

Every layer of a block-diffusion forward gathers its rows' keys and values from their pages (``PoolSlots``),
at every denoising step: a 12,000-token row's prefix is 3 MiB a layer on LLaDA2.0's tiny preset, in keys and
again in values. On a CPU every ``dllm`` process serves tensors of 1 MiB and more from fresh mappings
(allocators.py), whose pages fault in at first touch, so a fresh tensor per gather cost about 18 times the
copy itself (measured: 1.5 ms against 0.08 ms for 12,000 slots). Here the gathers write into two buffers the
pool keeps, one for keys and one for values, taken in turn: a forward's layers read their keys and then their
values, and attend over them before the next layer gathers again. A buffer grows to the largest gather seen
(at most the keys of the largest forward); off a CPU a fresh tensor is taken from the device's caching
allocator instead (no page faults there, and a captured graph keeps its own addresses).
"""

from __future__ import annotations

import torch


class GatherScratch:
    """Two gather buffers on the CPU, used in turn (keys, values, keys, ...)."""

    def __init__(self) -> None:
        self._buffers: list[torch.Tensor | None] = [None, None]
        self._turn = 0

    def gather(self, stored: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """``stored.index_select(0, slots)``, on a CPU written into this turn's buffer: valid until the
        gather after next."""
        if stored.device.type != "cpu":
            return stored.index_select(0, slots)
        turn, self._turn = self._turn, 1 - self._turn
        shape = (slots.shape[0], *stored.shape[1:])
        count = slots.shape[0] * stored[0].numel()
        buffer = self._buffers[turn]
        if buffer is None or buffer.dtype != stored.dtype or buffer.numel() < count:
            buffer = self._buffers[turn] = stored.new_empty(max(count, 1))
        return torch.index_select(stored, 0, slots, out=buffer[:count].view(shape))
