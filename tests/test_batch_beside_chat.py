"""scripts/batch_beside_chat.py on a small load: its JSON result, and a terminal that says what happens
in a few lines (not a line per request and per poll of the batch)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from engine_pod.serve.redis_server import free_port
from tests.doc_commands import ROOT

SMALL = ["--requests", "6", "--clients", "3", "--batch-lines", "12"]


def test_the_script_reports_its_result_and_prints_progress_sparingly():
    done = subprocess.run(
        [sys.executable, "scripts/batch_beside_chat.py", *SMALL, "--port", str(free_port())],
        cwd=ROOT,
        env=os.environ | {"PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert set(result) == {"requests", "clients", "alone", "beside_batch", "p50_ratio", "p99_ratio", "batch"}
    assert result["batch"]["status"] == "completed" and result["batch"]["completed"] == 12
    lines = done.stderr.strip().splitlines()
    assert "HTTP Request" not in done.stderr
    assert any("chat alone: p50" in line for line in lines) and "batch completed" in lines[-1]
    assert len(lines) <= 10, lines
