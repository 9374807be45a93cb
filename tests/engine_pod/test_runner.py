"""The block-cycle runner: per-row thresholds, the cycle box, padding accounting; the runner contract."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
import torch

from dllm_contracts.request_params import RequestParams
from engine_pod.decoding.config import DecodingConfig
from engine_pod.kinds.bidirectional.cycle_box import build_box
from engine_pod.loading.loader import load_model
from engine_pod.runner.factory import make_runner
from engine_pod.scheduler.cycle_row import CycleRow
from engine_pod.scheduler.output import SchedulerOutput
from tests.factories import REFERENCE_DIR

PROMPTS = [(5, 6, 7, 8), (11, 12), (40, 41, 42, 43, 44, 45, 46)]


@pytest.fixture(scope="module")
def loaded():
    return load_model(str(REFERENCE_DIR / "llada"), dtype="float64")


def test_rows_with_their_own_thresholds_decode_as_they_would_alone(loaded):
    decoding = DecodingConfig(block_length=16, steps_per_block=16, threshold=0.9, cache="dual")
    thresholds = [0.99, 0.3, None]
    mixed = make_runner(loaded, decoding).run(
        SchedulerOutput.of_rows(
            [CycleRow(p, params=RequestParams(threshold=t)) for p, t in zip(PROMPTS, thresholds)]
        )
    )
    for index, (prompt, threshold) in enumerate(zip(PROMPTS, thresholds)):
        alone_config = dataclasses.replace(decoding, threshold=threshold if threshold is not None else 0.9)
        alone = make_runner(loaded, alone_config).run(SchedulerOutput.of_rows([CycleRow(prompt)]))
        assert mixed.blocks[index] == alone.blocks[0]
        assert mixed.steps[index] == alone.steps[0]
    assert mixed.steps[0] > mixed.steps[1]  # a stricter threshold needs more steps


def test_the_cycle_box_left_pads_and_positions_start_at_zero():
    rows = [CycleRow((1, 2, 3, 4, 5)), CycleRow((4,), suffix_blocks=1, suffix_visible=False)]
    box = build_box(rows, 2, mask_id=9, pad_id=0, device=torch.device("cpu"))
    assert box.tokens.tolist() == [[1, 2, 3, 4, 5, 9, 9], [0, 0, 4, 9, 9, 9, 9]]
    assert box.position_ids.tolist() == [[0, 1, 2, 3, 4, 5, 6], [0, 0, 0, 1, 2, 3, 4]]
    assert box.block_slots.tolist() == [[5, 6], [3, 4]]
    assert box.key_mask.tolist()[1] == [False, False, True, True, True, False, False]  # hidden suffix
    slots, valid = box.prefix_window()
    assert slots.tolist() == [[5, 6, 7, 7], [3, 4, 5, 6]]  # column 7 is the scratch slot
    assert valid.tolist() == [[True, True, False, False], [True, True, True, True]]


def test_padding_efficiency_counts_only_live_prompt_and_block_positions(loaded):
    decoding = DecodingConfig(block_length=8, steps_per_block=8, remasking="low_confidence", cache="dual")
    rows = [CycleRow(tuple(range(1, 21))), CycleRow((5,))]
    out = make_runner(loaded, decoding).run(SchedulerOutput.of_rows(rows))
    refresh_computed = 2 * 28
    window_computed = (out.stats.forwards - 1) * 2 * 8
    assert out.stats.computed_positions == refresh_computed + window_computed
    assert out.stats.useful_positions == (28 + 9) + window_computed


def test_the_runner_contract_does_not_import_torch():
    code = (
        "import sys; import engine_pod.runner.contract; assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
