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
# CI's run in each regime: the float32 row-invariance core (every linear's tiles, the LM head's chunks, an
# expert's tokens), DiffusionGemma's logits and its prompts shorter than a kernel's rows (where a padded
# construction once rounded otherwise on Intel kernels), and one family's request alone and in batches
# under --batch-invariant; the whole list above is behind the slow marker
INVARIANCE_CORE = (
    "tests/engine_pod/test_row_invariant.py",
    "tests/engine_pod/test_diffusion_gemma_random.py::test_a_rows_logits_are_bit_equal_alone_and_in_a_batch_in_float32",
    "tests/engine_pod/test_diffusion_gemma_random.py::test_a_prompt_of_fewer_tokens_than_a_matrix_kernels_rows_encodes_alike_alone_and_batched",
    "tests/engine_pod/test_batch_invariant.py::test_a_requests_float32_outputs_are_the_same_bits_alone_and_in_any_batch[llada]",
)
# their tests that do not multiply a batch's rows (command-line refusals, seeded draws, dtype casts, the
# preset's sampler settings and adaptive stops): the default regime's run covers them
NOT_ABOUT_ROUNDING = (
    "not refuse and not deterministic and not every_dtype and not preset and not canvases_stop"
)
PLAIN_MATMUL = """
import json, sys, torch, torch.nn.functional as F
torch.set_num_threads(1)
generator = torch.Generator().manual_seed(0)
weight, x = torch.randn(64, 128, generator=generator), torch.randn(64, 128, generator=generator)
among_many = F.linear(x, weight)
rows = [n for n in range(1, 33) if not torch.equal(F.linear(x[:n], weight), among_many[:n])]
"""
PLAIN_MATMUL_ROWS = PLAIN_MATMUL + "print(json.dumps(rows))\n"
# a regime's one process (one torch import): the plain matmul's row counts into a file, then the tests
PLAIN_MATMUL_THEN_PYTEST = (
    PLAIN_MATMUL
    + """
open(sys.argv[1], "w").write(json.dumps(rows))
import pytest
sys.exit(pytest.main(sys.argv[2:]))
"""
)


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory) -> Path:
    require_mkl_on_x86()
    return tmp_path_factory.mktemp("kernel-regimes")


def test_a_plain_matmul_rounds_some_row_count_otherwise_in_the_default_regime(build_dir):
    """What the construction must survive is there: without it, rows would round by the batch's size (the
    other regimes: checked in their own runs below)."""
    run = subprocess.run(
        [sys.executable, "-c", PLAIN_MATMUL_ROWS],
        env=regime_env("default", build_dir),
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(run.stdout), "default: every row count rounds alike for a plain matmul"


NON_DEFAULT = [regime for regime in REGIMES if regime != "default"]


def _invariance_tests_in(regime: str, build_dir: Path, tests: tuple[str, ...]) -> None:
    """In one process of ``regime``: a plain matmul rounds some row count otherwise (what the construction
    must survive is there), and the invariance ``tests`` pass."""
    rows = build_dir / f"{regime}-plain-matmul.json"
    rows.unlink(missing_ok=True)
    run = subprocess.run(
        [sys.executable, "-c", PLAIN_MATMUL_THEN_PYTEST, str(rows)]
        + ["-q", "-n", "0", "-p", "no:cacheprovider", "-m", "not slow", "-k", NOT_ABOUT_ROUNDING, *tests],
        cwd=ROOT,
        env=regime_env(regime, build_dir),
        capture_output=True,
        text=True,
    )
    assert rows.exists(), f"{regime}: the plain matmul did not run:\n{run.stderr[-2000:]}"
    assert json.loads(rows.read_text()), f"{regime}: every row count rounds alike for a plain matmul"
    assert run.returncode == 0, f"{regime}:\n{run.stdout[-4000:]}\n{run.stderr[-2000:]}"


@pytest.mark.parametrize("regime", NON_DEFAULT)
def test_a_plain_matmul_rounds_otherwise_and_the_core_invariance_tests_pass_in_every_regime(
    regime, build_dir
):
    """(The default regime's run is the suite's own.)"""
    _invariance_tests_in(regime, build_dir, INVARIANCE_CORE)


@pytest.mark.slow  # CI runs the core above in each regime: this is every invariance test in each
@pytest.mark.parametrize("regime", NON_DEFAULT)
def test_the_invariance_tests_pass_in_every_regime(regime, build_dir):
    """(The default regime's run is the suite's own.)"""
    _invariance_tests_in(regime, build_dir, INVARIANCE_TESTS)
