"""Whether long work shows a progress bar: on a terminal, or where the process that started this one
says its own output is a terminal (``dllm serve`` passes its children's output through)."""

from __future__ import annotations

import os

PROGRESS_ENV = "DLLM_PROGRESS"  # "1": show progress bars even though stderr is a pipe


def tqdm_disable() -> bool | None:
    """tqdm's ``disable``: never disabled when asked for, else decided by whether stderr is a terminal."""
    return False if os.environ.get(PROGRESS_ENV) == "1" else None
