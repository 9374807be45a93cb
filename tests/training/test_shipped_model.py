"""The model shipped in the package: small, the default of every command, and it really answers.

A quick evaluation (CI runs this; the full one is `dllm eval --n 210`, reported in README.md).
"""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from pathlib import Path

from dllm_contracts.defaults import DEFAULT_MODEL
from engine_pod.cli.main import main
from engine_pod.synthetic.tasks import TASKS

# The goal is exact match 0.5 and length accuracy 0.95 (README.md has the full evaluation: 0.967 and
# 0.981 on 210 examples). This quick evaluation measured 0.944 and 0.972 on its 36 examples; the floors
# leave room for one or two near ties flipping on another CPU, so that a broken or worse model fails.
MIN_EXACT_MATCH = 0.85
MIN_LENGTH_ACCURACY = 0.9


def test_checkpoint_fits_in_the_repository():
    files = list(Path(DEFAULT_MODEL).iterdir())
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {f.name for f in files}
    assert sum(f.stat().st_size for f in files) < 20 * 2**20


def test_quick_evaluation_under_two_policies():
    buffer = io.StringIO()
    with redirect_stdout(buffer):
        assert main(["eval", "--n", "36", "--policy", "sequential,blockserve", "--json"]) == 0
    report = json.loads(buffer.getvalue())
    assert set(report["per_task"]) == set(TASKS)
    assert report["exact_match"] >= MIN_EXACT_MATCH, report["per_task"]
    assert report["length_accuracy"] >= MIN_LENGTH_ACCURACY, report["per_task"]
    assert max(task["exact_match"] for task in report["per_task"].values()) >= 0.9
    assert report["output_agreement"]["blockserve"] >= 0.97  # batching changes (almost) nothing
