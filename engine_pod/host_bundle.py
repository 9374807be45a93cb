"""One host-to-device copy for many host lists: a cycle's layout (slots, tokens, per-row settings) sent in
one transfer instead of one per list or per row (a GPU pays a copy's latency each time)."""

from __future__ import annotations

import struct

import torch


def send(parts: list[list[int]], device: torch.device) -> list[torch.Tensor]:
    """Each list as an int64 tensor on ``device``, every one a slice of one copy."""
    flat = [value for part in parts for value in part]
    sent = torch.tensor(flat, dtype=torch.long).to(device)
    return list(sent.split([len(part) for part in parts]))


def float64_bits(values: list[float]) -> list[int]:
    """The float64 bit patterns of ``values`` as int64 (``tensor.view(torch.float64)`` reads them back)."""
    return [struct.unpack("<q", struct.pack("<d", value))[0] for value in values]
