"""A safetensors file's tensors as sources a rank reads boxes of: its header parsed once, each box read
with ``preadv`` straight into the tensor that holds it.

Not through a memory map: the pages of a mapped file count in the process's resident memory while it is
mapped, so reading one rank's slices of every tensor that way would show the whole file in the rank's
resident set. Plain reads leave the file in the page cache, which no process's resident set counts.
A box's rows that lie apart in the file (a slice of columns) are read one run at a time.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

from engine_pod.models.tensor_sources import Box

DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


class SafetensorsError(ValueError):
    """A file that is not a safetensors file this reader takes."""


@dataclass(frozen=True)
class FileTensor:
    """One tensor of a safetensors file, read a box at a time."""

    path: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int  # where its data begins in the file

    def read(self, box: Box) -> torch.Tensor:
        out = torch.empty([stop - start for start, stop in box], dtype=self.dtype)
        if not out.numel():
            return out
        buffer = out.view(-1).view(torch.uint8).numpy()
        size, at = self.dtype.itemsize, 0
        with open(self.path, "rb") as handle:
            for first, count in _runs(self.shape, box):
                _read_exactly(handle.fileno(), buffer[at : at + count * size], self.offset + first * size)
                at += count * size
        return out


def _runs(shape: tuple[int, ...], box: Box) -> list[tuple[int, int]]:
    """(first element, elements) of each stretch of the box that lies together in the file, in order."""
    if not shape:
        return [(0, 1)]
    strides = [math.prod(shape[i + 1 :]) for i in range(len(shape))]
    partial = len(shape) - 1  # the last dimension the box does not take whole (the rest lie together)
    while partial > 0 and box[partial] == (0, shape[partial]):
        partial -= 1
    count = (box[partial][1] - box[partial][0]) * strides[partial]
    outer = itertools.product(*(range(start, stop) for start, stop in box[:partial]))
    return [
        (sum(i * s for i, s in zip(index, strides)) + box[partial][0] * strides[partial], count)
        for index in outer
    ]


def _read_exactly(fd: int, target, offset: int) -> None:
    view = memoryview(target).cast("B")
    while len(view):
        done = os.preadv(fd, [view], offset)
        if done <= 0:
            raise SafetensorsError(f"the file ended {len(view)} bytes early")
        view, offset = view[done:], offset + done


def file_tensors(path: Path) -> dict[str, FileTensor]:
    """Every tensor of the file, in the order its header lists them (no data read)."""
    with open(path, "rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            raise SafetensorsError(f"{path} is not a safetensors file (too short)")
        (length,) = struct.unpack("<Q", prefix)
        try:
            header = json.loads(handle.read(length))
        except ValueError as exc:
            raise SafetensorsError(f"{path} has no readable safetensors header: {exc}") from None
    tensors = {}
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        dtype = DTYPES.get(entry["dtype"])
        if dtype is None:
            raise SafetensorsError(f"{path}: tensor {key!r} has dtype {entry['dtype']}, which is not read")
        shape, (begin, end) = tuple(entry["shape"]), entry["data_offsets"]
        if end - begin != math.prod(shape) * dtype.itemsize:
            raise SafetensorsError(f"{path}: tensor {key!r} has {end - begin} bytes for shape {list(shape)}")
        tensors[key] = FileTensor(Path(path), dtype, shape, 8 + length + begin)
    return tensors
