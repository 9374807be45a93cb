"""Host data for the device outside a runner's persistent buffers (``device_buffers.py``): a tensor moved in
one copy (``to_device``: on a GPU from pinned memory without blocking, so the host goes on while it is in
flight and the kernels that read it are queued behind it on the stream), and floats' bit patterns carried
in int64 columns (``float64_bits``)."""

from __future__ import annotations

import struct

import torch


def to_device(host: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``host`` (a CPU tensor) on ``device``: on a GPU copied from pinned memory without blocking the host
    (torch's pinned-memory cache keeps the source until the copy has run); elsewhere ``host.to(device)``."""
    if torch.device(device).type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def float64_bits(values: list[float]) -> list[int]:
    """The float64 bit patterns of ``values`` as int64 (``tensor.view(torch.float64)`` reads them back)."""
    return [struct.unpack("<q", struct.pack("<d", value))[0] for value in values]
