"""Context rows' keys in one layer, packed row after row (each row's kept context, then its new
tokens): where they come from in the pool and go in the packed keys, on the device, and the rows' spans."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine_pod.models.ragged import RowSpans, VarlenBatch, varlen_on_device


@dataclass(frozen=True)
class ContextLayout:
    """A batch's keys in one layer, packed row after row: each row's kept context, then its new tokens."""

    spans: RowSpans  # each row's queries and keys (host ints)
    slots: torch.Tensor  # pool slots of every row's kept context, row after row
    context_at: torch.Tensor  # where they go in the packed keys
    new_at: torch.Tensor  # where the rows' new tokens go, row after row
    kept: torch.Tensor  # [R] each row's kept context tokens
    extents: torch.Tensor  # [3, R] each row's new tokens, key start and keys (spans' on the device)

    def varlen(self) -> VarlenBatch | None:
        """The varlen batch of these rows, whose queries follow each other in row order."""
        q_len, k_start, k_len = self.extents.view(3, -1).unbind(0)
        return varlen_on_device(q_len, k_start, k_len, self.spans, self.total)

    @property
    def total(self) -> int:
        """The packed keys' length (up to the last row's end)."""
        return self.spans.k_start[-1] + self.spans.k_len[-1] if self.spans.k_len else 0

    def rows(self, keep: list[int], index: torch.Tensor, tokens: int) -> ContextLayout:
        """Rows ``keep`` (``index`` on the device) of a layout of ``tokens`` new tokens per row: their
        context's places in the lists found with one repeat_interleave sized from the host's counts."""
        spans = self.spans
        kept = self.kept.index_select(0, index)
        firsts = (torch.cumsum(self.kept, 0) - self.kept).index_select(0, index)  # in this layout's lists
        shift = firsts - (torch.cumsum(kept, 0) - kept)  # a row's place in them less its place in the pick
        total = sum(spans.k_len[r] - tokens for r in keep)
        places = torch.repeat_interleave(shift, kept, output_size=total)
        places += torch.arange(total, device=places.device)
        picked = RowSpans(
            [j * tokens for j in range(len(keep))],
            [tokens] * len(keep),
            [spans.k_start[r] for r in keep],
            [spans.k_len[r] for r in keep],
        )
        new_at = self.new_at.view(-1, tokens).index_select(0, index).flatten()
        extents = self.extents.view(3, -1).index_select(1, index)
        extents[0] = tokens
        slots, context_at = self.slots.index_select(0, places), self.context_at.index_select(0, places)
        return ContextLayout(picked, slots, context_at, new_at, kept, extents)
