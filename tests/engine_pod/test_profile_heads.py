"""`dllm profile --score-heads` stores the heads' importance in the profile, and `--sparse-cache
head-centric` takes it from `--profile` when no `--head-importance` file is given (a file still wins)."""

from __future__ import annotations

import json

import pytest

from dllm_contracts.profile_summary import ProfileSummary, read_termination_message
from engine_pod.cli.common import decoding_config
from engine_pod.cli.main import build_parser, main
from tests.engine_pod.shared_profiles import HEADS_EXAMPLES, scored_small_profile
from tests.serving.serve_process import openai_client, running


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    """The run's small profile of the shipped model that scored its heads, and its termination message
    (``test_profile`` reads the same one)."""
    path, termination, _ = scored_small_profile(tmp_path_factory)
    return path, termination


def test_the_profile_stores_what_dllm_heads_scores(scored, tmp_path):
    path, termination = scored
    heads = tmp_path / "heads.json"
    assert main(["heads", "--examples", HEADS_EXAMPLES, "--threads", "1", "--out", str(heads)]) == 0
    assert json.loads(path.read_text())["head_importance"] == json.loads(heads.read_text())
    # the operator's summary stays the budget's alone
    assert "head_importance" not in termination
    assert read_termination_message(termination) == ProfileSummary.from_result(json.loads(path.read_text()))


def test_dllm_serve_runs_head_centric_on_the_profiles_importance(scored, tmp_path):
    path, _ = scored
    extra = ("--profile", str(path), "--sparse-cache", "head-centric", "--retention", "0.3")
    with running(tmp_path, *extra) as server:
        reply = openai_client(server).completions.create(
            model="tiny-llada", prompt="count to 5 .", max_tokens=8
        )
        worker = (tmp_path / "serve.log").read_text()
    assert reply.usage.completion_tokens > 0, worker[-2000:]


def _worker_args(*extra: str):
    return build_parser().parse_args(["worker", "--redis", "redis://x", "--service", "s", *extra])


def test_an_importance_file_wins_over_the_profiles(scored, tmp_path):
    path, _ = scored
    heads = tmp_path / "heads.json"
    centric = ("--sparse-cache", "head-centric", "--profile", str(path))
    assert decoding_config(_worker_args(*centric), 4).sparse.importance == str(path)
    given = _worker_args(*centric, "--head-importance", str(heads))
    assert decoding_config(given, 4).sparse.importance == str(heads)


def test_a_profile_without_importance_is_refused_in_one_line(tmp_path, capsys):
    plain = tmp_path / "plain.json"
    plain.write_text(ProfileSummary.from_spec(4096).to_json())
    argv = ["worker", "--redis", "redis://127.0.0.1:1/0", "--service", "s", "--port", "0", "--threads", "1"]
    assert main([*argv, "--profile", str(plain), "--sparse-cache", "head-centric"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs head importance" in err[0] and "--score-heads" in err[0], err
