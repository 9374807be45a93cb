"""What a row's queries may see of its keys (``Masking``) and how the reference calls SDPA (``SdpaStyle``):
the two settings of an attention plan (models/ragged.py) that differ between families.

Masks are for rows whose queries are their last ``q_len`` key positions (block diffusion's rows, the
DiffusionGemma encoder's new tokens after the context they keep); a bidirectional row sees every key.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Masking:
    """Bidirectional (the default); block-causal with ``block`` tokens a block; or causal, within a
    sliding ``window`` (a query sees itself and the ``window - 1`` keys before it) where one is given."""

    block: int = 0
    causal: bool = False
    window: int | None = None

    def group_mask(self, queries: int, keys: int, device) -> tuple[torch.Tensor | None, bool]:
        """The [queries, keys] mask rows of these lengths share (None: none needed), and whether SDPA's
        own causal flag stands for it (plainly causal: as many queries as keys)."""
        if self.block:
            if queries <= self.block:  # the active block alone sees every key before its end
                return None, False
            positions = torch.arange(keys, device=device)
            return positions[None] // self.block <= positions[keys - queries :, None] // self.block, False
        if not self.causal:
            return None, False
        if (queries == 1 or keys == queries) and (self.window is None or keys < self.window):
            return None, queries > 1
        return self.window_mask(keys - queries, queries, keys, device), False

    def window_mask(self, first: int, queries: int, keys: int, device) -> torch.Tensor:
        """The causal mask [queries, keys] of queries at key positions ``first``.. over keys ``0..keys``:
        a query sees the keys up to its own position, within the sliding window where there is one."""
        query_positions = torch.arange(first, first + queries, device=device)[:, None]
        key_positions = torch.arange(keys, device=device)[None, :]
        mask = key_positions <= query_positions
        if self.window is not None:
            mask &= key_positions > query_positions - self.window
        return mask


@dataclass(frozen=True)
class SdpaStyle:
    """How a family's reference calls SDPA, so that its outputs are reproduced bit for bit: the scale
    (None: 1/sqrt(head_dim)); ``native_gqa``: grouped K/V heads passed with ``enable_gqa`` where no mask
    is given (else repeated for every query head); ``head_major``: keys and values (and queries) as
    contiguous [rows, heads, tokens, hd] tensors, as a concatenation along the tokens makes them."""

    scale: float | None = None
    native_gqa: bool = False
    head_major: bool = False


BIDIRECTIONAL = Masking()
DEFAULT_STYLE = SdpaStyle()
