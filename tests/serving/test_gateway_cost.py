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


def test_the_gateway_cost_script_runs_the_gateway_of_another_checkout(tmp_path):
    """``--gateway-source DIR`` runs ``python -m gateway`` from DIR: a tree whose gateway exits at once
    with status 3 is the one that ran."""
    package = tmp_path / "gateway"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text("import sys\nsys.exit(3)\n")
    argv = [sys.executable, "scripts/gateway_cost.py", "--requests", "4", "--bursts", "1"]
    done = subprocess.run(
        [*argv, "--kinds", "completions", "--gateway-source", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=os.environ | {"PYTHONPATH": str(ROOT)},
    )
    assert done.returncode != 0
    assert "the gateway exited with status 3" in done.stderr
