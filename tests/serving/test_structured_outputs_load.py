"""The 200-request structured-outputs run through ``dllm serve`` with the official client, on random weights
of every family (scripts/structured_outputs_run.py; its figures: docs/benchmarks.md): no finished answer
that does not validate, no cut answer shorter than ``max_tokens``, no stream that does not reassemble to
its whole answer, and most answers finish. CI's smaller version: tests/serving/test_structured_outputs.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine_pod.bench.census_grid import MODELS

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "structured_outputs_run.py"


@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS)
def test_two_hundred_requests_over_every_schema_are_valid_by_construction(model):
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--model", model, "--requests", "200"],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (report,) = json.loads(run.stdout)
    assert report["requests"] == 200 and report["schemas"] >= 20 and not report["faults"]
    assert report["finished_share"] >= 0.6, report["kinds"]
