"""The small profile of the shipped model with its heads scored, which ``test_profile`` (the budget, its
check, the operator's summary) and ``test_profile_heads`` (the stored importance) both read: measured once
a run (a profile spawns a process per grid point)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from engine_pod.cli.main import main
from tests.computed_once import computed_once

SMALL_MAX_TOKENS = 512  # a small grid (four shapes fit, two held out: two fitted shapes alone let a 3 MB
# wobble of peak resident memory tip the slope below zero), a budget far past it
HEADS_EXAMPLES = "8"  # calibration examples: enough to score the shipped model's heads, quick on CI's cores


class _Lines(logging.Handler):
    """What `dllm profile` logged (its warnings reach the terminal through the root logger)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _profile(out: Path) -> dict:
    argv = ["profile", "--memory-limit", "600M", "--max-tokens", str(SMALL_MAX_TOKENS), "--threads", "1"]
    argv += ["--score-heads", "--heads-examples", HEADS_EXAMPLES]
    argv += ["--json", str(out / "p.json"), "--termination-log", str(out / "term")]
    logged = _Lines()
    logging.getLogger().addHandler(logged)
    try:
        assert main(argv) == 0
    finally:
        logging.getLogger().removeHandler(logged)
    return {"logged": logged.lines}


def scored_small_profile(factory: pytest.TempPathFactory) -> tuple[Path, str, list[str]]:
    """The profile's JSON path, its termination message and the warnings it logged."""
    out, observed = computed_once(factory, "scored-small-profile", _profile)
    return out / "p.json", (out / "term").read_text(), observed["logged"]
