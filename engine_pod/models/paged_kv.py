"""The exact, persistent KV cache of block-diffusion models: pages of one pool, a page table per request.

A committed block's keys and values never change (attention is causal across blocks), so they are
written once and kept across block cycles. Each request holds the pages covering its committed
tokens plus its active block; the active block's entries are rewritten at every step until the block
is committed. Slots are flat (page x page_size + offset); the last slot is a scratch slot that padded
queries write to and padded keys read from, never attended.
"""

from __future__ import annotations

import torch


class PoolExhausted(RuntimeError):
    """The pool has fewer free pages than a request needs."""


class PagedKVPool:
    """Keys (after RoPE) and values of every layer, ``[slots + 1, kv_heads, head_dim]`` each."""

    def __init__(
        self,
        num_layers: int,
        num_pages: int,
        page_size: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        if num_pages < 1 or page_size < 1:
            raise ValueError("a KV pool needs at least one page of at least one slot")
        self.page_size = page_size
        self.scratch = num_pages * page_size
        shape = (self.scratch + 1, kv_heads, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.device = device
        self._free = list(range(num_pages - 1, -1, -1))
        self._tables: dict[str, list[int]] = {}

    @property
    def free_pages(self) -> int:
        return len(self._free)

    def pages_for(self, tokens: int) -> int:
        return -(-tokens // self.page_size)

    def reserve(self, owner: str, tokens: int) -> None:
        """Make ``owner``'s pages cover positions ``[0, tokens)``."""
        table = self._tables.setdefault(owner, [])
        needed = self.pages_for(tokens) - len(table)
        if needed > len(self._free):
            raise PoolExhausted(f"{owner} needs {needed} more KV pages; {len(self._free)} are free")
        for _ in range(max(0, needed)):
            table.append(self._free.pop())

    def release(self, owner: str) -> None:
        """Give ``owner``'s pages back (finished, cancelled or preempted)."""
        self._free.extend(reversed(self._tables.pop(owner, [])))

    def slots(self, owner: str, start: int, end: int) -> torch.Tensor:
        """Flat slots of positions ``[start, end)`` of ``owner`` (reserved beforehand)."""
        table = torch.tensor(self._tables[owner], dtype=torch.long)
        positions = torch.arange(start, end)
        flat = table[positions // self.page_size] * self.page_size + positions % self.page_size
        return flat.to(self.device)

    def write(self, layer: int, slots: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
        self.keys[layer][slots] = keys
        self.values[layer][slots] = values

    def read(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.keys[layer][slots], self.values[layer][slots]

    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.keys) + sum(t.nbytes for t in self.values)
