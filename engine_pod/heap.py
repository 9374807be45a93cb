"""Keeping the garbage collector off what a long-running process loaded once (torch-free: the gateway
uses it too)."""

from __future__ import annotations

import gc


def freeze_loaded_objects() -> None:
    """Move every object alive now (a model's modules, a tokenizer, imported code) to the permanent
    generation, which collections do not walk. Measured on the shipped model: with the serving path's
    allocations beside them, a worker's block cycles ran about 15% slower while each full collection
    walked the ~350,000 objects loaded at start; the gateway spent 3% of a request's CPU on them.
    Garbage is collected first, so that none is kept for good."""
    gc.collect()
    gc.freeze()
