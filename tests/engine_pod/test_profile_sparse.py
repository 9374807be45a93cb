"""`dllm profile --sparse-cache` measures the grid with the head-sparse cache on and records its settings;
`dllm serve`/`dllm worker --profile` with other head-sparse settings than a profile measured with one are
refused in one line, before any model is loaded (a profile of the dense cache is warned about)."""

from __future__ import annotations

import json

import pytest

from dllm_contracts.head_sparse_config import HeadSparseConfig
from dllm_contracts.profile_summary import ProfileSummary, read_termination_message
from engine_pod.cli.main import build_parser, main
from engine_pod.cli.scheduling import scheduler_config
from engine_pod.loading.loader import load_model
from engine_pod.profiling import points as profiler_points
from engine_pod.profiling.grid import Point
from tests.serving.serve_process import openai_client, running

SPARSE = ("--sparse-cache", "head-centric", "--retention", "0.3", "--minor-retention", "0.1")
RECORDED = {
    "mode": "head-centric",
    "retention": 0.3,
    "minor_retention": 0.1,
    "core_share": 0.2,
    "minor_share": 0.2,
}


@pytest.fixture(scope="module")
def sparse_profile(tmp_path_factory):
    """A small head-centric profile of the shipped model, its importance scored on the way (no file)."""
    out = tmp_path_factory.mktemp("sparse")
    # the smallest grid (four shapes): what is tested here is what the profile records, not its fit
    argv = ["profile", "--memory-limit", "600M", "--max-tokens", "384", "--threads", "1", *SPARSE]
    argv += ["--heads-examples", "8", "--json", str(out / "p.json"), "--termination-log", str(out / "term")]
    assert main(argv) == 0
    return out / "p.json", (out / "term").read_text()


def test_the_profile_records_the_sparse_settings_it_measured_with(sparse_profile):
    path, termination = sparse_profile
    result = json.loads(path.read_text())
    assert result["sparse_cache"] == RECORDED
    assert len(result["head_importance"]["importance"]) == 4  # scored for the measure, and kept
    # what dLLM-Serve's admission counts a row's context at: of 6 heads, 1 core whole, 4 at 0.3, 1 at 0.1
    assert result["context_kept_share"] == round((1 + 4 * 0.3 + 0.1) / 6, 4)
    assert read_termination_message(termination).sparse_cache == RECORDED  # what the operator stores


def test_every_grid_point_runs_the_sparse_cache(monkeypatch):
    """A point's block cycle keeps the head-sparse stores, in fewer pages of the KV pool than a dense run."""
    made = []

    def spy(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    real = profiler_points.make_runner
    monkeypatch.setattr(profiler_points, "make_runner", spy)
    sparse = HeadSparseConfig(mode="uniform", retention=0.3)
    cfg = profiler_points.ProfileConfig(model="builtin:tiny-llada", block_length=32, sparse=sparse)
    point = profiler_points.measure_point(load_model("builtin:tiny-llada"), Point(2, 128), cfg)
    stepper = made[0].stepper
    assert point.peak_bytes > 0 and stepper.heads is not None
    assert stepper.cache_pool.pool.capacity < 2 * 128  # a dense run: the point's 2 rows of 128 positions


def test_dllm_serve_runs_on_the_sparse_profile_alone(sparse_profile, tmp_path):
    path, _ = sparse_profile
    with running(tmp_path, "--profile", str(path), *SPARSE) as server:
        reply = openai_client(server).completions.create(
            model="tiny-llada", prompt="count to 5 .", max_tokens=8
        )
    assert reply.usage.completion_tokens > 0


def _worker(tmp_path, profile: str, *sparse: str) -> list[str]:
    argv = ["worker", "--model", str(tmp_path / "none"), "--redis", "redis://127.0.0.1:1/0", "--service", "s"]
    return [*argv, "--port", "0", "--threads", "1", "--profile", profile, *sparse]


@pytest.mark.parametrize(
    "asked, words",
    [
        ((), "profile again with --sparse-cache off"),
        ((*SPARSE[:3], "0.5"), "profile again with --sparse-cache head-centric --retention 0.5 "),
        (("--sparse-cache", "uniform", "--retention", "0.3"), "--sparse-cache uniform --retention 0.3"),
    ],
)
def test_other_sparse_settings_than_the_profiles_are_refused_in_one_line(
    sparse_profile, tmp_path, capsys, asked, words
):
    path, _ = sparse_profile
    assert main(_worker(tmp_path, str(path), *asked)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "was measured with --sparse-cache head-centric --retention 0.3" in err[0], err
    assert words in err[0]


def test_a_dense_profile_is_warned_about_under_a_sparse_cache(tmp_path, caplog):
    """A budget measured with the dense cache still runs a sparse one (what profiles measured before
    recorded), said in one warning that names the flags to profile with."""
    dense = tmp_path / "dense.json"
    dense.write_text(ProfileSummary.parse(_measured_summary()).to_json())
    argv = ["worker", "--redis", "redis://x", "--service", "s", "--profile", str(dense)]
    args = build_parser().parse_args([*argv, "--sparse-cache", "uniform", "--retention", "0.3"])
    with caplog.at_level("WARNING"):
        assert scheduler_config(args).token_budget == 4096
        assert scheduler_config(args).token_budget == 4096  # read again (serve does): warned once
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "measured with the dense cache" in warnings[0], warnings
    assert "--sparse-cache uniform --retention 0.3" in warnings[0]


def test_a_budget_set_by_hand_holds_for_any_sparse_cache(tmp_path):
    given = tmp_path / "spec.json"
    given.write_text(ProfileSummary.from_spec(4096).to_json())
    argv = [
        "worker",
        "--redis",
        "redis://x",
        "--service",
        "s",
        "--profile",
        str(given),
        "--sparse-cache",
        "uniform",
    ]
    assert scheduler_config(build_parser().parse_args(argv)).token_budget == 4096


@pytest.mark.parametrize(
    "extra, message",
    [
        (("--layout", "dense", "--sparse-cache", "uniform"), "--sparse-cache runs packed rows only"),
        (("--model", "random:llada2-tiny", "--sparse-cache", "uniform"), "supports LLaDA and Dream"),
        (("--sparse-cache", "uniform", "--retention", "2"), "retention must be in (0, 1]"),
    ],
)
def test_dllm_profile_refuses_a_sparse_cache_that_cannot_run_in_one_line(tmp_path, capsys, extra, message):
    assert main(["profile", "--threads", "1", "--json", str(tmp_path / "p.json"), *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def _measured_summary() -> dict:
    return {
        "token_budget": 4096,
        "device": "cpu",
        "device_name": "cpu",
        "dtype": "float32",
        "total_memory_bytes": 2**33,
        "usable_memory_bytes": 2**30,
        "weights_bytes": 2**24,
    }
