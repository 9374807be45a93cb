"""Head groups, kept counts and selection of the head-sparse cache; its settings; ``dllm heads``."""

from __future__ import annotations

import json

import pytest
import torch

from dllm_contracts.head_sparse_config import HeadSparseConfig, HeadSparseConfigError
from engine_pod.cli.main import main
from engine_pod.kinds.bidirectional.head_sparse.groups import kept_context, layer_groups
from engine_pod.kinds.bidirectional.head_sparse.scores import kept_positions


def test_uniform_is_one_group_of_every_head_at_r():
    groups = layer_groups(HeadSparseConfig(mode="uniform", retention=0.3), None, 6)
    assert [(g.name, g.retention, g.heads) for g in groups] == [("all", 0.3, (0, 1, 2, 3, 4, 5))]


@pytest.mark.parametrize("heads, sizes", [(6, (1, 4, 1)), (32, (6, 20, 6)), (28, (6, 16, 6)), (4, (1, 2, 1))])
def test_head_centric_groups_are_core_regular_minor_by_importance(heads, sizes):
    config = HeadSparseConfig(mode="head-centric", retention=0.4, minor_retention=0.1, importance="x")
    importance = [float((7 * h) % heads) for h in range(heads)]
    groups = layer_groups(config, importance, heads)
    assert tuple(len(g.heads) for g in groups) == sizes
    assert [g.retention for g in groups] == [1.0, 0.4, 0.1]
    ranked = sorted(range(heads), key=lambda h: -importance[h])
    assert set(groups[0].heads) == set(ranked[: sizes[0]])
    assert set(groups[2].heads) == set(ranked[heads - sizes[2] :])


def test_minor_heads_never_keep_more_than_regular_ones():
    config = HeadSparseConfig(mode="head-centric", retention=0.1, minor_retention=0.2, importance="x")
    assert [g.retention for g in layer_groups(config, [1.0, 2.0, 3.0, 4.0, 5.0], 5)] == [1.0, 0.1, 0.1]


@pytest.mark.parametrize("retention, context, kept", [(0.3, 10, 3), (0.1, 41, 5), (1.0, 7, 7), (0.5, 0, 0)])
def test_kept_context_is_ceil_r_times_context(retention, context, kept):
    assert kept_context(retention, context) == kept


def test_a_head_keeps_its_top_scored_positions_and_the_block_in_position_order():
    ranking = torch.tensor([[[0.1, 0.5, 0.05, 0.3, 0.0, 0.0, 0.0]]])  # one row, one head, 7 keys
    block = torch.tensor([[False, False, False, False, True, True, False]])
    valid = torch.tensor([[True] * 6 + [False]])  # the row has 6 keys
    kept = kept_positions(ranking, block, valid, torch.tensor([4]), 4)
    assert kept.tolist() == [[[1, 3, 4, 5]]]


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"mode": "sparse"}, "sparse cache mode must be one of off, head-centric, uniform"),
        ({"retention": 0.0}, "retention must be in (0, 1]"),
        ({"retention": 1.5}, "retention must be in (0, 1]"),
        ({"minor_retention": 0.3}, "minor retention must be in (0, 0.2]"),
        ({"core_share": 0.7, "minor_share": 0.4}, "at most 1"),
        ({"consistency": 2.0}, "consistency threshold"),
        ({"scoring": "attention"}, "sparse scoring must be one of probability, mean-query-logit"),
        ({"pool_kernel": 2}, "pool kernel must be an odd whole number from 1 to 15, got 2"),
        ({"pool_kernel": 17}, "pool kernel must be an odd whole number"),
        ({"pool_kernel": 3.0}, "pool kernel must be an odd whole number"),
        ({"selection": "all"}, "sparse selection must be one of per-head, shared"),
        ({"selection_delay": -1}, "selection delay must be a whole number from 0 to 32, got -1"),
        ({"selection_delay": 33}, "selection delay must be a whole number from 0 to 32"),
        ({"mode": "head-centric"}, "needs head importance"),
    ],
)
def test_settings_out_of_range_are_refused(settings, message):
    with pytest.raises(HeadSparseConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        HeadSparseConfig(**settings)


def test_sparse_cache_is_off_by_default():
    assert not HeadSparseConfig().on


def _one_line_error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_cli_refuses_head_centric_without_importance_in_one_line(capsys):
    line = _one_line_error(capsys, ["eval", "--n", "1", "--sparse-cache", "head-centric"])
    assert "needs head importance" in line


def test_cli_refuses_an_importance_file_of_another_model(capsys, tmp_path):
    path = tmp_path / "heads.json"
    path.write_text(json.dumps({"importance": [[1.0, 2.0]]}))
    argv = ["eval", "--n", "1", "--sparse-cache", "head-centric", "--head-importance", str(path)]
    assert "not for this model" in _one_line_error(capsys, argv)


def test_dllm_heads_writes_layer_normalised_scores_deterministically(tmp_path, capsys):
    runs = []
    for name in ("a.json", "b.json"):
        out = tmp_path / name
        assert main(["heads", "--examples", "8", "--threads", "1", "--out", str(out)]) == 0
        runs.append(json.loads(out.read_text()))
    assert runs[0] == runs[1]
    scores = runs[0]["importance"]
    assert len(scores) == 4 and all(len(layer) == 6 for layer in scores)
    assert all(abs(sum(layer) - 1) < 1e-4 and min(layer) > 0 for layer in scores)


def test_dllm_eval_reports_what_the_sparse_cache_kept(capsys):
    argv = ["eval", "--n", "8", "--threads", "1", "--json", "--sparse-cache", "uniform", "--retention", "0.3"]
    assert main(argv) == 0
    generation = json.loads(capsys.readouterr().out)["policies"]["blockserve"]["generation"]
    assert 0 < generation["kv_kept_bytes"] < generation["kv_dense_bytes"]


def test_serve_hands_its_sparse_cache_settings_to_the_worker(tmp_path):
    from engine_pod.cli.main import build_parser
    from engine_pod.cli.serve import _worker_args
    from tests.engine_pod.test_cli_threads import IDENTITY

    heads = tmp_path / "heads.json"
    argv = ["serve", "--token-budget", "4096", "--sparse-cache", "head-centric", "--retention", "0.3"]
    argv += ["--sparse-scoring", "mean-query-logit", "--sparse-pool-kernel", "3"]
    argv += ["--sparse-selection", "shared"]
    given = build_parser().parse_args([*argv, "--selection-delay", "2", "--head-importance", str(heads)])
    given.service = "default"
    worker_argv = _worker_args(given, "redis://127.0.0.1:1/0", IDENTITY)
    parsed = build_parser().parse_args(["worker", *worker_argv])
    assert (parsed.sparse_cache, parsed.retention, parsed.head_importance) == (
        "head-centric",
        0.3,
        str(heads),
    )
    assert (parsed.sparse_scoring, parsed.sparse_pool_kernel) == ("mean-query-logit", 3)
    assert (parsed.sparse_selection, parsed.selection_delay) == ("shared", 2)
    plain = build_parser().parse_args(["serve", "--token-budget", "4096"])
    plain.service = "default"
    assert "--sparse-cache" not in _worker_args(plain, "redis://127.0.0.1:1/0", IDENTITY)


@pytest.mark.parametrize("command", ["bench", "serve", "eval", "generate"])
@pytest.mark.parametrize(
    "flags, words",
    [
        (("--sparse-pool-kernel", "4"), "pool kernel must be an odd whole number from 1 to 15, got 4"),
        (("--selection-delay", "40"), "selection delay must be a whole number from 0 to 32, got 40"),
    ],
)
def test_selection_settings_out_of_range_are_refused_in_one_line(command, flags, words, capsys):
    argv = [command, "--sparse-cache", "uniform", *flags, "--threads", "1"]
    argv += {"generate": ["--prompt", "x"], "eval": ["--n", "1"]}.get(command, [])
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err


def test_a_worker_refuses_selection_settings_out_of_range_in_one_line():
    import subprocess
    import sys

    argv = [sys.executable, "-m", "engine_pod.cli.main", "-q", "worker", "--redis", "redis://127.0.0.1:1/0"]
    argv += ["--service", "s", "--sparse-cache", "uniform", "--sparse-pool-kernel", "0"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, lines
    assert "pool kernel must be an odd whole number" in lines[0]
