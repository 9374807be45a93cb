"""Batch invariance in float32 does not lean on the matrix library's kernels: the invariance tests pass
under every kernel regime this CPU can be made to run (MKL's code paths, and its Intel kernels forced on
any x86 CPU), and in each regime a plain matmul rounds some row count otherwise, so a construction that
relied on the kernels would fail here on an AMD machine as on an Intel one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.kernel_regimes import REGIMES, regime_env, require_mkl_on_x86

ROOT = Path(__file__).resolve().parents[2]
INVARIANCE_TESTS = (
    "tests/engine_pod/test_row_invariant.py",
    "tests/engine_pod/test_diffusion_gemma_random.py",
    "tests/engine_pod/test_logit_budget.py",
    # --batch-invariant: every family alone and in batches, and a batch that rounds otherwise without it
    "tests/engine_pod/test_batch_invariant.py::test_a_requests_float32_outputs_are_the_same_bits_alone_and_in_any_batch",
    "tests/engine_pod/test_batch_invariant.py::test_without_the_setting_a_batch_rounds_some_request_otherwise",
)
# their tests that do not multiply a batch's rows (command-line refusals, seeded draws, dtype casts, the
# preset's sampler settings and adaptive stops): the default regime's run covers them
NOT_ABOUT_ROUNDING = (
    "not refuse and not deterministic and not every_dtype and not preset and not canvases_stop"
)
PLAIN_MATMUL_ROWS = """
import json, torch, torch.nn.functional as F
torch.set_num_threads(1)
generator = torch.Generator().manual_seed(0)
weight, x = torch.randn(64, 128, generator=generator), torch.randn(64, 128, generator=generator)
among_many = F.linear(x, weight)
print(json.dumps([n for n in range(1, 33) if not torch.equal(F.linear(x[:n], weight), among_many[:n])]))
"""


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory) -> Path:
    require_mkl_on_x86()
    return tmp_path_factory.mktemp("kernel-regimes")


@pytest.mark.parametrize("regime", REGIMES)
def test_a_plain_matmul_rounds_some_row_count_otherwise_in_every_regime(regime, build_dir):
    """What the construction must survive is there: without it, rows would round by the batch's size."""
    run = subprocess.run(
        [sys.executable, "-c", PLAIN_MATMUL_ROWS],
        env=regime_env(regime, build_dir),
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(run.stdout), f"{regime}: every row count rounds alike for a plain matmul"


@pytest.mark.parametrize("regime", [regime for regime in REGIMES if regime != "default"])
def test_the_invariance_tests_pass_in_every_regime(regime, build_dir):
    """(The default regime's run is the suite's own.)"""
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-n",
            "0",
            "-p",
            "no:cacheprovider",
            "-m",
            "not slow",
            "-k",
            NOT_ABOUT_ROUNDING,
            *INVARIANCE_TESTS,
        ],
        cwd=ROOT,
        env=regime_env(regime, build_dir),
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, f"{regime}:\n{run.stdout[-4000:]}\n{run.stderr[-2000:]}"
