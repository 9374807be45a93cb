"""`dllm profile`: real block cycles over a grid, a linear fit that predicts held-out shapes, a budget
that keeps BlockServe under the memory limit, and clear failures."""

from __future__ import annotations

import json

import pytest
import torch

from dllm_contracts.defaults import DEFAULT_MODEL
from dllm_contracts.profile_summary import ProfileSummary, read_termination_message
from dllm_contracts.scheduler_config import SchedulerConfig
from engine_pod.bench.benchmark import BenchConfig, run_benchmark
from engine_pod.bench.results import ModelSpec
from engine_pod.cli.main import main
from engine_pod.decoding.config import DecodingConfig
from engine_pod.device_memory import cpu_model
from engine_pod.profiling.fit import MemoryFit
from engine_pod.profiling.profiler import CORRECTION_MARGIN, _corrected_budget
from tests.engine_pod.shared_profiles import SMALL_MAX_TOKENS, scored_small_profile

MAX_TOKENS = 4096  # with a 1 GiB limit: a grid wide enough for a fit that predicts held-out shapes


def _profile(out, max_tokens: int, memory_limit: str) -> tuple[dict, str]:
    argv = ["profile", "--memory-limit", memory_limit, "--max-tokens", str(max_tokens)]  # the default model
    argv += ["--json", str(out / "p.json"), "--termination-log", str(out / "term")]
    assert main(argv) == 0
    return json.loads((out / "p.json").read_text()), (out / "term").read_text()


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    """The profile the fit is judged on (slow: about three minutes of CI's two cores)."""
    return _profile(tmp_path_factory.mktemp("profile"), MAX_TOKENS, "1G")


@pytest.fixture(scope="module")
def small_profile(tmp_path_factory):
    """A smaller limit too (600 MiB): the budget measured at its own size stays small. The run's one small
    profile, which scored the heads too (``test_profile_heads`` reads it)."""
    path, termination, logged = scored_small_profile(tmp_path_factory)
    return json.loads(path.read_text()), termination, logged


@pytest.mark.slow
def test_profile_measures_a_grid_and_fits_it(profile):
    result, _ = profile
    fitted = [p for p in result["points"] if not p["held_out"]]
    assert len(fitted) >= 5 and len({(p["rows"], p["width"]) for p in fitted}) == len(fitted)
    assert max(p["tokens"] for p in fitted) <= MAX_TOKENS
    assert result["fit"]["bytes_per_token"] > 0 and result["fit"]["r_squared"] > 0.9
    assert result["weights_bytes"] > 0 and result["token_budget"] > 0
    usable = result["usable_memory_bytes"]
    assert usable == int(2**30 * 0.9) and result["memory_limit_bytes"] == 2**30


@pytest.mark.slow
def test_fit_predicts_held_out_shapes_within_ten_percent(profile):
    result, _ = profile
    assert result["held_out"], "the profile must measure shapes it did not fit"
    for point in result["held_out"]:
        assert point["relative_error"] <= 0.10, point


def test_the_termination_message_is_the_summary_the_operator_reads(small_profile):
    result, message, _ = small_profile
    assert len(message) < 4096
    summary = read_termination_message(message)  # what the operator does with it
    assert summary == ProfileSummary.from_result(result)
    assert summary.source == "measured" and summary.token_budget == result["token_budget"]
    assert summary.device == "cpu" and summary.usable_memory_bytes == result["usable_memory_bytes"]
    assert result["tensor_parallel"] == summary.tensor_parallel == 1  # the size it was measured at
    # what the budget depends on beside the model: the CPU as the machine names it, and the allocator
    assert summary.device_name == cpu_model()
    assert summary.allocator == result["allocator"] and "malloc, mmap from 1 MiB" in summary.allocator


@pytest.mark.slow
def test_blockserve_at_the_profiled_budget_stays_under_the_limit(profile):
    result, _ = profile
    fit = result["fit"]
    model_fit = MemoryFit(result["weights_bytes"], fit["intercept_bytes"], fit["bytes_per_token"], 1.0, 0.0)
    limit = int(model_fit.predict(3000) / 0.9)  # a memory limit whose 90% holds about 3000 batch tokens
    budget = model_fit.budget(limit * 0.9)
    config = BenchConfig(
        model=ModelSpec(DEFAULT_MODEL, "cpu", "float32"),
        workload="heterogeneous",
        policies=("blockserve",),
        decoding=DecodingConfig(),
        scheduling=SchedulerConfig(token_budget=budget),
        limit=48,
        record_margins=False,
    )
    report = run_benchmark(config)
    blockserve = report["policies"]["blockserve"]
    assert blockserve["max_cost_tokens"] > budget // 2, "the workload should fill the budget"
    assert blockserve["max_cost_tokens"] <= budget
    assert blockserve["peak_memory_bytes"] < limit


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--memory-limit", "1M"], "not more than the model's weights"),
        (["--memory-limit", "250M", "--max-tokens", "384"], "cannot run one block"),
        (["--device", "cuda:3"], "CUDA is not available"),
        (["--max-tokens", "10"], "--max-tokens must be at least"),
        (["--utilization", "1.5"], "--utilization"),
        (["--tensor-parallel", "0"], "--tensor-parallel must be at least 1"),
    ],
)
def test_bad_input_fails_with_one_line(capsys, tmp_path, extra, message):
    argv = ["profile", "--model", DEFAULT_MODEL, "--json", str(tmp_path / "p.json"), *extra]
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    err = [line for line in lines if not line.startswith("profile:")]  # the progress bar may run first
    assert len(err) == 1 and message in err[0], lines


def test_every_profile_measures_its_budget_once_and_it_fits(small_profile):
    result, _, _ = small_profile
    check = result["budget_checks"][-1]
    assert check["budget"] == result["token_budget"] and check["under_limit"]
    assert 0.9 * result["token_budget"] <= check["tokens"] <= result["token_budget"]
    assert check["measured_bytes"] <= result["usable_memory_bytes"]
    assert result["model"] == "builtin:tiny-llada"  # as named, not where this installation keeps it
    assert result["extrapolation"]["factor"] == round(result["token_budget"] / SMALL_MAX_TOKENS, 2)


def test_a_budget_far_past_the_grid_is_warned_about_in_the_terminal_and_the_json(small_profile):
    """600 MiB over a grid of at most 512 tokens: the budget lies many times past the largest point."""
    result, _, logged = small_profile
    extrapolation = result["extrapolation"]
    assert extrapolation["largest_measured_tokens"] == SMALL_MAX_TOKENS
    assert extrapolation["factor"] > 2 and extrapolation["beyond_grid"]
    assert extrapolation["r_squared"] == round(result["fit"]["r_squared"], 4)
    # (a loaded machine's noisy peaks may add the poor-fit warning, which names --max-tokens too)
    (warning,) = [w for w in result["warnings"] if "extrapolated" in w]
    assert f"up to {SMALL_MAX_TOKENS} tokens" in warning and warning in logged


def test_a_correction_after_an_overshoot_aims_under_the_limit_not_at_it():
    """A peak barely over the limit must not give a budget whose prediction lands on the limit again
    (CPU peaks are noisy; three such checks in a row once failed a profile)."""
    fixed, usable, bytes_per_token = 300e6, 566e6, 10_000.0
    budget = int((usable - fixed) / bytes_per_token)  # the fit's budget: exactly at the limit
    overshoot = int(fixed + bytes_per_token * budget) + 600_000  # measured 0.6 MB over it
    corrected = _corrected_budget(budget, overshoot, fixed, usable)
    assert fixed + bytes_per_token * corrected <= usable - 0.01 * (usable - fixed)  # 2.7 MB, > the noise
    assert CORRECTION_MARGIN <= 0.05
    assert corrected > 0.95 * budget  # a margin, not a collapse


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none here)")
def test_cuda_profile_fits_reserved_memory_under_expandable_segments(tmp_path):
    argv = ["profile", "--model", "random:llada-tiny", "--device", "cuda", "--memory-limit", "4G"]
    assert main([*argv, "--max-tokens", "8192", "--json", str(tmp_path / "p.json")]) == 0
    result = json.loads((tmp_path / "p.json").read_text())
    assert result["peak_measure"] == "reserved" and "expandable_segments" in result["cuda_alloc_conf"]
    for point in result["points"]:
        assert 0 < point["allocated_bytes"] <= point["peak_bytes"]
    assert result["free_memory_bytes"] <= result["total_memory_bytes"]
    assert result["budget_checks"][-1]["under_limit"]


def test_any_failure_leaves_a_json_termination_message(tmp_path, monkeypatch, capsys):
    """Not only a bad limit (ValueError): CUDA running out of memory mid-profile is a RuntimeError."""
    from engine_pod.cli import profile as profile_cli

    def out_of_memory(*_args, **_kwargs):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB" + " (details)" * 2000)

    monkeypatch.setattr(profile_cli, "run_profile", out_of_memory)
    log = tmp_path / "termination-log"
    argv = [
        "profile",
        "--model",
        DEFAULT_MODEL,
        "--json",
        str(tmp_path / "p.json"),
        "--termination-log",
        str(log),
    ]
    with pytest.raises(RuntimeError):  # an unexpected failure still ends the process with its traceback
        main(argv)
    message = log.read_text()
    assert len(message) < 4096
    assert json.loads(message)["error"].startswith("RuntimeError: CUDA out of memory")
