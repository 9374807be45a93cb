"""What the LM head materialized, per block cycle: in `dllm bench` reports (positions x vocabulary, or x k
with candidates; the most at once bounded by --max-materialized-logits)."""

from __future__ import annotations

import json

import pytest

from engine_pod.cli.main import main
from tests.engine_pod.test_bench import heterogeneous_float64_bench
from tests.serving_utils import write_served_model

VOCAB = 320  # the served model's


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_served_model(tmp_path_factory.mktemp("logit-count-model"))


@pytest.mark.parametrize(  # the whole vocabulary behind -m slow: candidates count fewer columns
    ("flags", "columns"), [pytest.param([], VOCAB, marks=pytest.mark.slow), (["--logit-candidates", "5"], 5)]
)
def test_bench_reports_the_logits_materialized(model, tmp_path, flags, columns):
    out = tmp_path / "b.json"
    argv = heterogeneous_float64_bench(model, out, 4, "blockserve")
    assert main([*argv, "--max-materialized-logits", "7", *flags]) == 0
    metrics = json.loads(out.read_text())["policies"]["blockserve"]
    assert metrics["peak_logits_at_once"] == 7 * columns  # chunks of 7 positions
    assert metrics["logits_materialized"] > 0 and metrics["logits_materialized"] % columns == 0
