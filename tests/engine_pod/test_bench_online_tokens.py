"""An online run counts the tokens a client gets: on a block-diffusion grid a request's last block can
reach past its ``max_tokens``, and what lies past it is not an answer's (nor its throughput's)."""

from __future__ import annotations

import json

from engine_pod.cli.main import main

REQUESTS, MAX_TOKENS = 4, 32


def test_an_online_run_counts_no_token_past_a_requests_max_tokens(tmp_path):
    out = tmp_path / "bench.json"
    argv = [
        "bench", "--model", "random:llada2-tiny", "--threads", "1", "--no-isolate", "--policy", "blockserve",
        "--workload", f"synthetic:n={REQUESTS},prompt=9-23,gen={MAX_TOKENS}-{MAX_TOKENS},seed=0",
        "--arrival-rate", "1000", "--ignore-eos", "--json", str(out),
    ]  # fmt: skip
    assert main(argv) == 0
    (run,) = json.loads(out.read_text())["runs"]["blockserve"].values()
    # prompts off the grid of 32: each request's blocks hold up to 64 - 9 new tokens, its answer 32
    assert run["generated_tokens"] == REQUESTS * MAX_TOKENS
