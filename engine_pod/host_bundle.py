"""One host-to-device copy for many host lists: a cycle's layout (slots, tokens, per-row settings) sent in
one transfer instead of one per list or per row (a GPU pays a copy's latency each time). On a GPU the copy
is made from pinned memory without blocking (``to_device``): the host goes on while it is in flight, and
the kernels that read it are queued behind it on the stream."""

from __future__ import annotations

import struct

import torch


def send(parts: list[list[int]], device: torch.device) -> list[torch.Tensor]:
    """Each list as an int64 tensor on ``device``, every one a slice of one copy."""
    flat = [value for part in parts for value in part]
    sent = to_device(torch.tensor(flat, dtype=torch.long), device)
    return list(sent.split([len(part) for part in parts]))


class Floats(list):
    """A list of floats for ``send_named``: its float64 bits travel in the int64 copy, and it arrives as a
    float64 tensor."""


def send_named(parts: dict[str, list[int] | Floats], device: torch.device) -> dict[str, torch.Tensor]:
    """Each named list on ``device``, every one a slice of one copy, read back by its name: int lists as
    int64, ``Floats`` as float64."""
    sent = send([float64_bits(v) if isinstance(v, Floats) else v for v in parts.values()], device)
    return {
        name: part.view(torch.float64) if isinstance(values, Floats) else part
        for (name, values), part in zip(parts.items(), sent)
    }


def to_device(host: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``host`` (a CPU tensor) on ``device``: on a GPU copied from pinned memory without blocking the host
    (torch's pinned-memory cache keeps the source until the copy has run); elsewhere ``host.to(device)``."""
    if torch.device(device).type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def float64_bits(values: list[float]) -> list[int]:
    """The float64 bit patterns of ``values`` as int64 (``tensor.view(torch.float64)`` reads them back)."""
    return [struct.unpack("<q", struct.pack("<d", value))[0] for value in values]
