"""Every rank holds only its share from the first byte: the peak resident memory of each rank process while
it loads (a checkpoint's slices read from the file, a random preset's tiles drawn) is at most 1.2x the
bytes of its share. Real processes of a real gloo group; the peak is the kernel's (VmHWM, reset just
before the load)."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest
import torch

from engine_pod.loading.loader import load_model
from engine_pod.loading.sharded import load_shard
from engine_pod.loading.weights import save_checkpoint
from engine_pod.parallel.group import free_address, join_group, leave_group

MODEL = "random:llada-tiny-8b-vocab"  # 33M parameters, most in its 126,464-row vocabulary: 266 MB in float64
BOUND = 1.2  # a rank's peak over its share
WAIT_S = 300  # a bound on every wait for the ranks, however slow the machine


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/self/status")


def _rank(rank: int, size: int, address: str, spec: str, results) -> None:
    """Join, then load this rank's shard: report its share and what loading added to its peak."""
    torch.set_num_threads(1)
    parallel = join_group(rank, size, address, torch.device("cpu"))
    try:
        load_shard("random:llada-tiny", parallel, dtype="float64")  # every import a load makes, made
        Path("/proc/self/clear_refs").write_text("5")  # the peak resident set starts again from here
        before = _status_kib("VmRSS") * 1024
        loaded = load_shard(spec, parallel, dtype="float64")
        peak = _status_kib("VmHWM") * 1024
        results.put((rank, loaded.weights_bytes, peak - before))
    finally:
        leave_group()


def _loading_peaks(spec: str, size: int) -> dict[int, tuple[int, int]]:
    spawn = multiprocessing.get_context("spawn")
    results, address = spawn.Queue(), free_address()
    ranks = [spawn.Process(target=_rank, args=(r, size, address, spec, results)) for r in range(size)]
    for process in ranks:
        process.start()
    try:
        seen = [results.get(timeout=WAIT_S) for _ in ranks]
    finally:
        for process in ranks:
            process.join(timeout=WAIT_S)
            if process.is_alive():
                process.kill()
    return {rank: (share, grown) for rank, share, grown in seen}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    """The preset as a checkpoint on disk (float64, as loaded)."""
    loaded = load_model(MODEL, dtype="float64")
    directory = tmp_path_factory.mktemp("checkpoint")
    (directory / "config.json").write_text(_config_json())
    save_checkpoint(loaded.config, loaded.model.state_dict(), directory)
    return str(directory)


def _config_json() -> str:
    import json

    from dllm_contracts.model_presets import preset

    return json.dumps(preset(MODEL.split(":", 1)[1]))


@pytest.mark.parametrize("source", ["random", "checkpoint"])
def test_each_rank_peaks_at_most_its_share_while_it_loads(source, checkpoint):
    spec = MODEL if source == "random" else checkpoint
    peaks = _loading_peaks(spec, 2)
    assert sorted(peaks) == [0, 1]
    for rank, (share, grown) in peaks.items():
        assert share > 100 << 20, share  # a share large enough to measure against a process's noise
        assert grown <= BOUND * share, (rank, grown / share)
