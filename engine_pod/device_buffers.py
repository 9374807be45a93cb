"""A runner's persistent device buffers: the lists a cycle sends (token ids, positions, slots, per-row
settings) written into named regions of one buffer that lives as long as the runner, in one host-to-device
copy per cycle, instead of a new device tensor each cycle.

The device buffer is int64; a region sent as ``Floats`` holds float64 values and is read back as a float64
view of its bytes. On a GPU a pinned host staging buffer of the same layout lives beside it: the host writes
a cycle's lists into their regions there and one ``copy_`` (not blocking the host) moves the bytes from the
first region written to the end of the last one; before writing the staging again the host waits for that
copy (its event), never for the kernels behind it. Elsewhere the staging is ordinary host memory and the
copy an ordinary one, through the same code.

Each region keeps its offset while the cycles' lists fit, so every view handed back of a region starts at
the same address from cycle to cycle (what a captured CUDA graph reads from). A runner sizes its regions
from its token budget when it is made (``reserve``); a list longer than its region grows that region
(to a power of two, at least twice its size: rarely) and moves every region to a new buffer, logged at
debug; a region seen for the first time is made the power of two at or above its list (at least
``MIN_REGION``). Views handed out before a growth keep the old buffer alive and stay valid. A cycle's views are overwritten by the next send of the same names: the
engine runs one cycle at a time, and each of its sends is consumed before the next one of those names.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

log = logging.getLogger(__name__)

MIN_REGION = 64  # elements: the least a region seen for the first time is given
GROWTH = 2  # a region too small for a list is made at least this many times larger


class Floats(list):
    """A list of floats for ``DeviceBuffers.send``: written as float64 values, read back as a float64 tensor."""


class DeviceBuffers:
    """One device buffer (and its host staging) split into named regions at fixed offsets; ``send`` writes
    a cycle's lists into them in one copy and hands back views by name."""

    def __init__(self, device: torch.device | str, sizes: dict[str, int] | None = None) -> None:
        self.device = torch.device(device)
        self.pinned = self.device.type == "cuda"
        self.capacity: dict[str, int] = {}  # elements per region, in their order in the buffer
        self.offsets: dict[str, int] = {}
        self.growths = 0  # times the buffer moved to a larger one
        self._copied: torch.cuda.Event | None = None  # on a GPU: recorded after the last copy
        self._allocate(dict(sizes or {}))

    def reserve(self, sizes: dict[str, int]) -> None:
        """Regions of at least ``sizes`` elements (a runner's, from its token budget); new ones after the
        existing ones. Moves the buffer only where something is larger than before."""
        wanted = {name: max(size, self.capacity.get(name, 0)) for name, size in sizes.items()}
        if any(size > self.capacity.get(name, -1) for name, size in wanted.items()):
            self._allocate(self.capacity | wanted)

    def send(self, parts: dict[str, list[int] | Floats]) -> dict[str, torch.Tensor]:
        """Each named list in its region on the device, all in one copy: int lists as int64 views, ``Floats``
        as float64 views (read back by name, in the order given)."""
        needs = {name: len(values) for name, values in parts.items()}
        self._fit(needs)
        if self._copied is not None:
            self._copied.synchronize()  # the last copy has read the staging: it may be written again
        written = [name for name, count in needs.items() if count]
        for name in written:
            start, values = self.offsets[name], parts[name]
            target = self._floats if isinstance(values, Floats) else self._ints
            target[start : start + needs[name]] = values
        if written:
            low = min(self.offsets[name] for name in written)
            high = max(self.offsets[name] + needs[name] for name in written)
            source = torch.from_numpy(self._ints[low:high])  # the staging's bytes (host memory)
            self.buffer[low:high].copy_(source, non_blocking=self.pinned)  # the one host-to-device copy
            if self.pinned:
                self._copied = torch.cuda.Event()
                self._copied.record()
        return self._views(parts, needs)

    def _views(self, parts: dict[str, list[int] | Floats], needs: dict[str, int]) -> dict[str, torch.Tensor]:
        """The sent lists' views, cut from the buffer in one split (each region: what was sent, the rest)."""
        sizes, at = [], {}
        for name, capacity in self.capacity.items():
            at[name] = len(sizes)
            sizes += [needs[name], capacity - needs[name]] if name in needs else [capacity]
        pieces = self.buffer.split(sizes)
        return {
            name: pieces[at[name]].view(torch.float64) if isinstance(values, Floats) else pieces[at[name]]
            for name, values in parts.items()
        }

    def addresses(self) -> dict[str, int]:
        """Each region's device address (constant while no list outgrows its region)."""
        base, size = self.buffer.data_ptr(), self.buffer.element_size()
        return {name: base + offset * size for name, offset in self.offsets.items()}

    def _fit(self, needs: dict[str, int]) -> None:
        """Grow the regions too small for ``needs`` (new ones too), all in one move."""
        short = {name: count for name, count in needs.items() if count > self.capacity.get(name, -1)}
        if not short:
            return
        grown = {
            name: max(_bucket(count), GROWTH * self.capacity.get(name, MIN_REGION // GROWTH))
            for name, count in short.items()
        }
        moved = [name for name in short if name in self.capacity]
        if moved:
            self.growths += 1
            log.debug("device buffers: regions %s grow to %s elements", moved, [grown[n] for n in moved])
        self._allocate(self.capacity | grown)

    def _allocate(self, capacity: dict[str, int]) -> None:
        """A new device buffer and staging holding ``capacity``'s regions in order (the old ones stay alive
        as long as views of them do)."""
        if self._copied is not None:
            self._copied.synchronize()  # the old staging is read by no copy in flight when it is let go
        offsets, total = {}, 0
        for name, size in capacity.items():
            offsets[name], total = total, total + size
        self.capacity, self.offsets = capacity, offsets
        self.buffer = torch.empty(total, dtype=torch.int64, device=self.device)
        self._staging = torch.empty(total, dtype=torch.int64, pin_memory=self.pinned)
        self._ints = self._staging.numpy()
        self._floats = self._ints.view(np.float64)
        self._copied = None  # a new staging: no copy reads it yet


def _bucket(count: int) -> int:
    """The power of two at or above ``count`` (at least ``MIN_REGION``): what a growing region is given."""
    return max(MIN_REGION, 1 << max(count - 1, 0).bit_length())
