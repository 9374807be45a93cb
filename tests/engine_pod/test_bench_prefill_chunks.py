"""``dllm bench --prefill-chunk off,N`` runs every policy with each chunk size in one call, and reports
each run side by side: the short requests' and the long ones' latency and first block, the throughput, the
chunks and the seconds decoding rows waited on them."""

from __future__ import annotations

import json

import pytest

from engine_pod.cli.main import main

BLOCK, CHUNK, LONG = 32, 256, 1200


def _trace(path) -> str:
    lines = [{"id": f"s{i}", "prompt_tokens": 40 + i, "max_tokens": BLOCK, "task": "short"} for i in range(4)]
    lines.insert(1, {"id": "l0", "prompt_tokens": LONG, "max_tokens": BLOCK, "task": "long"})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


def test_one_bench_call_runs_each_policy_with_each_chunk_size(tmp_path, capsys):
    out = tmp_path / "chunks.json"
    argv = [
        "bench", "--model", "random:sdar-tiny", "--threads", "1", "--workload", _trace(tmp_path / "t.jsonl"),
        "--arrival-rate", "400", "--policy", "blockserve", "--prefill-chunk", f"off,{CHUNK}",
        "--token-budget", "4096", "--json", str(out),
    ]  # fmt: skip
    assert main(argv) == 0
    report = json.loads(out.read_text())
    whole, chunked = "blockserve chunk off", f"blockserve chunk {CHUNK}"
    assert list(report["runs"]) == [whole, chunked]
    assert report["prefill_chunk_by_run"] == {whole: 0, chunked: CHUNK}
    (off,) = report["runs"][whole].values()
    (on,) = report["runs"][chunked].values()
    assert "prefill_chunks" not in off
    # the long prompt up to its first block, less the last chunk (computed with the block), a chunk a cycle
    assert on["prefill_chunks"] == (LONG // BLOCK * BLOCK - 1) // CHUNK
    assert on["prefill_chunk_tokens"] == on["prefill_chunks"] * CHUNK
    assert off["generated_tokens"] == on["generated_tokens"]
    for metrics in (off, on):
        assert set(metrics["latency_by_family_s"]) == {"short", "long"}
        # the engine's work: CPU seconds within its cycles' wall seconds (one torch thread)
        assert metrics["engine_cpu_s"] > 0
        assert 0 < metrics["engine_busy_s"] <= metrics["wall_s"]
    printed = capsys.readouterr().out
    family_rows = [line for line in printed.splitlines() if line.startswith("blockserve chunk")]
    assert len([row for row in family_rows if " short " in row]) == 2
    assert len([row for row in family_rows if " long " in row]) == 2


BENCH = ["bench", "--model", "random:sdar-tiny", "--policy", "blockserve", "--json", "/dev/null"]


@pytest.mark.parametrize(
    ("chunks", "message"),
    [("512,512", "named twice"), ("-1", "at least 0"), ("big", "expected tokens, off or auto")],
)
def test_bad_chunk_sizes_are_refused_in_one_line(chunks, message, capsys):
    with pytest.raises(SystemExit) as exited:
        main([*BENCH, "--prefill-chunk", chunks])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_several_chunk_sizes_need_an_online_load(capsys):
    assert main([*BENCH, "--prefill-chunk", "off,512"]) == 2
    assert "several sizes compare online loads" in capsys.readouterr().err


def test_llada_bench_splits_a_long_rows_refresh_and_its_first_block_is_its_committed_one(tmp_path):
    """LLaDA: a 600-token prompt's refresh in 3 pieces (632 positions over chunks of 256; 4 layers), one a
    cycle, then its one block: its first block is the cycle that committed it (its latency), not a piece's."""
    out = tmp_path / "llada.json"
    trace = tmp_path / "t.jsonl"
    lines = [{"id": f"s{i}", "prompt_tokens": 40 + i, "max_tokens": BLOCK, "task": "short"} for i in range(3)]
    lines.insert(1, {"id": "l0", "prompt_tokens": 600, "max_tokens": BLOCK, "task": "long"})
    trace.write_text("".join(json.dumps(line) + "\n" for line in lines))
    argv = [
        "bench", "--model", "random:llada-tiny", "--threads", "1", "--workload", str(trace),
        "--arrival-rate", "400", "--policy", "blockserve", "--prefill-chunk", "off,256",
        "--token-budget", "4096", "--json", str(out),
    ]  # fmt: skip
    assert main(argv) == 0
    report = json.loads(out.read_text())
    (off,) = report["runs"]["blockserve chunk off"].values()
    (on,) = report["runs"]["blockserve chunk 256"].values()
    assert "prefill_chunks" not in off and on["prefill_chunks"] == 3
    assert off["generated_tokens"] == on["generated_tokens"]
    long_first, long_latency = on["first_block_by_family_s"]["long"], on["latency_by_family_s"]["long"]
    assert long_first["max"] == pytest.approx(long_latency["max"], abs=1e-3)
