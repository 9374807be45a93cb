"""``dllm serve --policy dllm-serve`` on the product path: concurrent chat requests through the official
client are answered as each is alone (and, behind -m slow, as BlockServe answers them), while the worker's
/metrics show every step's refreshes held to the quota the flags set and blocks carried from one cycle to the
next (step-level batching)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from engine_pod.serve.redis_server import free_port
from tests.serving.conftest import SERVED
from tests.serving.serve_process import chat_batch_file, openai_client, running
from tests.serving_utils import wait_for

PROMPTS = [f"count to {n} and then say the alphabet backwards, slowly {'.' * n}" for n in range(8, 40, 4)]
BUDGET, QUOTA = 1024, 0.1  # 102 positions a step: far fewer than a batch of these rows refreshes at once


def _answers(server, prompts: list[str] = PROMPTS) -> dict[str, str]:
    client = openai_client(server)

    def ask(prompt: str) -> str:
        reply = client.chat.completions.create(
            model=SERVED, messages=[{"role": "user", "content": prompt}], max_tokens=32, temperature=0
        )
        return reply.choices[0].message.content

    with ThreadPoolExecutor(len(prompts)) as pool:
        return dict(zip(prompts, pool.map(ask, prompts)))


def _metric(text: str, name: str) -> float:
    (value,) = [float(line.split()[-1]) for line in text.splitlines() if line.split(" ")[0] == name]
    return value


def _check_quota(port: int) -> str:
    """The worker's metrics, where every step's refreshes kept to the quota and blocks were carried."""
    metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    quota = int(QUOTA * BUDGET)
    assert _metric(metrics, "dllm_refresh_quota_positions") == quota
    assert 0 < _metric(metrics, "dllm_peak_refresh_positions") <= quota
    assert _metric(metrics, "dllm_refresh_positions_total") > quota  # spread over several steps
    assert 0 < _metric(metrics, "dllm_refresh_share") <= 1
    assert _metric(metrics, "dllm_carried_rows_total") > 0  # cycles ended at a step, blocks carried on
    assert _metric(metrics, "dllm_kv_dense_bytes_total") > 0  # the refreshes counted their caches' bytes
    return metrics


FLAGS = ["--token-budget", str(BUDGET), "--policy", "dllm-serve", "--refresh-quota", str(QUOTA)]


def test_dllm_serve_holds_refreshes_to_its_quota_and_answers_a_batch_as_each_alone(tmp_path):
    port = free_port()
    with running(
        tmp_path, *FLAGS, "--batch-refresh-quota", str(QUOTA), "--metrics-port", str(port)
    ) as server:
        batched = _answers(server)
        alone = _answers(server, PROMPTS[:1])
        metrics = _check_quota(port)
    assert alone[PROMPTS[0]] == batched[PROMPTS[0]]
    assert _metric(metrics, "dllm_kv_kept_share") == 1  # a dense cache keeps every byte


def test_dllm_serve_runs_the_sparse_cache_and_shows_the_share_it_keeps(tmp_path):
    """With dLLM-Serve's published selection (its scoring, pooling and delay, one set for every head)."""
    port = free_port()
    sparse = ["--sparse-cache", "uniform", "--retention", "0.3", "--sparse-scoring", "mean-query-logit"]
    sparse += ["--sparse-pool-kernel", "3", "--selection-delay", "1", "--sparse-selection", "shared"]
    flags = [*FLAGS, "--batch-refresh-quota", str(QUOTA), *sparse, "--metrics-port", str(port)]
    with running(tmp_path, *flags) as server:
        batched = _answers(server)
        alone = _answers(server, PROMPTS[:1])
        metrics = _check_quota(port)
    assert alone[PROMPTS[0]] == batched[PROMPTS[0]]
    assert 0 < _metric(metrics, "dllm_kv_kept_share") < 1


@pytest.mark.slow
def test_dllm_serve_answers_as_blockserve(tmp_path):
    for name in ("blockserve", "dllm-serve"):
        (tmp_path / name).mkdir()
    with running(tmp_path / "blockserve", "--token-budget", str(BUDGET)) as server:
        expected = _answers(server)
    port = free_port()
    with running(tmp_path / "dllm-serve", *FLAGS, "--metrics-port", str(port)) as server:
        assert _answers(server) == expected
        _check_quota(port)


def test_a_batch_quota_below_the_interactive_one_holds_for_every_row(tmp_path):
    """A batch line runs in cycles of batch lines only, under the batch quota: one that would refresh more
    positions than that quota at once is refused (its error line names the quota), never refreshed past it."""
    port, batch_quota = free_port(), 0.05  # 51 positions: less than the line's prompt and blocks
    flags = [*FLAGS[:-1], "0.4", "--batch-refresh-quota", str(batch_quota), "--metrics-port", str(port)]
    with running(tmp_path, *flags) as server:
        client = openai_client(server)
        source = client.files.create(file=("c.jsonl", chat_batch_file(1, max_tokens=64)), purpose="batch")
        batch = client.batches.create(
            input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        done = wait_for(
            lambda: (b := client.batches.retrieve(batch.id)).status == "completed" and b,
            what="the batch to end",
        )
        errors = client.files.content(done.error_file_id).text if done.error_file_id else ""
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    assert (done.request_counts.completed, done.request_counts.failed) == (0, 1), errors
    assert f"refresh quota {int(batch_quota * BUDGET)} of the token budget {BUDGET}" in errors
    assert _metric(metrics, "dllm_peak_refresh_positions") == 0  # nothing refreshed past it
