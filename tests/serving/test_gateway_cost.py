"""scripts/gateway_cost.py runs (a small version): the gateway's CPU per request and its requests per
second for every kind of request, with an instant peer in place of the engine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_gateway_cost_script_reports_every_kind():
    argv = [sys.executable, "scripts/gateway_cost.py", "--requests", "16", "--bursts", "2"]
    done = subprocess.run(
        argv,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=os.environ | {"PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    kinds = {"completions", "chat", "completions-stream", "chat-stream"}
    words = [line.split() for line in done.stderr.splitlines()]
    rows = {row[0]: row[1:] for row in words if row and row[0] in kinds}
    assert set(rows) == kinds
    for values in rows.values():
        gateway_ms, _, per_second = map(float, values)
        assert gateway_ms > 0 and per_second > 0
