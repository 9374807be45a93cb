"""A result several test files check, computed once per pytest run: under xdist the first worker to ask
computes it into the run's shared temporary directory (under a file lock) and the others read it there."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock


def computed_once(
    factory: pytest.TempPathFactory, name: str, compute: Callable[[Path], dict]
) -> tuple[Path, dict]:
    """``compute(directory)`` writes its files into ``directory`` and returns what else it observed (JSON);
    the directory and that record, computed by whichever process asked first in this run."""
    shared = factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # every worker's base directory lies in the run's own
    directory = shared / f"once-{name}"
    done = directory / "observed.json"
    with FileLock(str(shared / f"once-{name}.lock")):
        if not done.is_file():
            directory.mkdir(exist_ok=True)
            done.write_text(json.dumps(compute(directory)))
    return directory, json.loads(done.read_text())
