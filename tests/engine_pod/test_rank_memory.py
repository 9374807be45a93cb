"""Every rank holds only its share from the first byte: the peak resident memory of each rank process while
it loads (a checkpoint's slices read from the file, a random preset's tiles drawn) is at most 1.2x the
bytes of its share, under tensor parallelism (LLaDA) and under expert parallelism (LLaDA2.0 with wide
experts: each rank its half of the experts whole, the rest repeated). Real processes of a real gloo group;
the peak is the kernel's (VmHWM, reset just before the load)."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest
import torch

from dllm_contracts.model_presets import PRESETS
from engine_pod.loading.loader import load_model
from engine_pod.loading.sharded import load_shard
from engine_pod.loading.weights import save_checkpoint
from engine_pod.parallel.group import free_address, join_group, leave_group
from engine_pod.parallel.layout import GroupLayout

MODEL = "random:llada-tiny-8b-vocab"  # 33M parameters, most in its 126,464-row vocabulary: 266 MB in float64
# LLaDA2.0-tiny with experts 16x wider: 42M parameters, 38M of them in the 48 routed experts (336 MB in
# float64); a test's own preset, registered in every process that loads it
EXPERTS_MODEL = "random:llada2-wide-experts"
EXPERTS_PRESET = PRESETS["llada2-tiny"] | {"hidden_size": 256, "head_dim": 64, "moe_intermediate_size": 1024}
LAYOUTS = {MODEL: GroupLayout(tensor=2), EXPERTS_MODEL: GroupLayout(expert=2)}
WARM = {MODEL: "random:llada-tiny", EXPERTS_MODEL: "random:llada2-tiny"}  # the same imports, a small load
BOUND = 1.2  # a rank's peak over its share
WAIT_S = 300  # a bound on every wait for the ranks, however slow the machine


def _register_presets() -> None:
    PRESETS.setdefault(EXPERTS_MODEL.split(":", 1)[1], EXPERTS_PRESET)


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/self/status")


def _rank(rank: int, size: int, address: str, model: str, spec: str, results) -> None:
    """Join, then load this rank's shard of ``spec`` (``model`` or its checkpoint): report its share and
    what loading added to its peak."""
    torch.set_num_threads(1)
    _register_presets()
    parallel = join_group(rank, size, address, torch.device("cpu"), layout=LAYOUTS[model])
    try:
        load_shard(WARM[model], parallel, dtype="float64")  # every import a load makes, made
        Path("/proc/self/clear_refs").write_text("5")  # the peak resident set starts again from here
        before = _status_kib("VmRSS") * 1024
        loaded = load_shard(spec, parallel, dtype="float64")
        peak = _status_kib("VmHWM") * 1024
        results.put((rank, loaded.weights_bytes, peak - before))
    finally:
        leave_group()


def _loading_peaks(model: str, spec: str, size: int) -> dict[int, tuple[int, int]]:
    spawn = multiprocessing.get_context("spawn")
    results, address = spawn.Queue(), free_address()
    ranks = [spawn.Process(target=_rank, args=(r, size, address, model, spec, results)) for r in range(size)]
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


def _checkpoint(model: str, directory: Path) -> str:
    """The preset as a checkpoint on disk (float64, as loaded)."""
    import json

    from dllm_contracts.model_presets import preset

    _register_presets()
    loaded = load_model(model, dtype="float64")
    (directory / "config.json").write_text(json.dumps(preset(model.split(":", 1)[1])))
    save_checkpoint(loaded.config, loaded.model.state_dict(), directory)
    return str(directory)


@pytest.mark.parametrize("model", [MODEL, EXPERTS_MODEL])
@pytest.mark.parametrize("source", ["random", "checkpoint"])
def test_each_rank_peaks_at_most_its_share_while_it_loads(source, model, tmp_path):
    spec = model if source == "random" else _checkpoint(model, tmp_path)
    peaks = _loading_peaks(model, spec, 2)
    assert sorted(peaks) == [0, 1]
    for rank, (share, grown) in peaks.items():
        assert share > 100 << 20, share  # a share large enough to measure against a process's noise
        assert grown <= BOUND * share, (rank, grown / share)
