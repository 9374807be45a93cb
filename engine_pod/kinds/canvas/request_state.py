"""What DiffusionGemma's stepper (kinds/canvas/stepper.py) keeps for one request between its cycles."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine_pod.kinds.canvas.context_cache import ContextCache


@dataclass
class CanvasRequest:
    """What the runner keeps for one request between its cycles."""

    generator: torch.Generator
    cache: ContextCache  # its context's keys and values, in pages of the runner's pool
    chunks: list[int] = field(default_factory=list)  # tokens of each encoder forward, in order
    encoded: tuple[int, ...] = ()  # the context tokens the cache holds

    def pending(self, prefix: tuple[int, ...]) -> list[tuple[int, ...]]:
        """The chunks to encode of ``prefix`` (this cycle's context: a chunk row's up to its chunk's end):
        a rebuild's as first written, as far as they lie within it (a new request has none), then the
        rest."""
        chunks, start = [], len(self.encoded)
        if not self.encoded:
            for length in self.chunks:
                if start + length > len(prefix):
                    break
                chunks.append(prefix[start : start + length])
                start += length
        return chunks + ([prefix[start:]] if len(prefix) > start else [])
