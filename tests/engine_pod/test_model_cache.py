"""A checkpoint in the Hugging Face cache (the volume engine pods and the profiling Job share) is used
without asking the Hub: a pod that starts on a warm cache downloads nothing. ``REPO@REVISION`` pins a
revision. The Hub here is an address where nothing listens: any download attempt would fail."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dllm_contracts.model_source import builtin_model_dir

REVISION = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def warm_cache(tmp_path) -> Path:
    """An HF_HOME holding acme/tiny (the shipped model) at REVISION, as a download leaves it."""
    home = tmp_path / "hf"
    repo = home / "hub" / "models--acme--tiny"
    shutil.copytree(builtin_model_dir("tiny-llada"), repo / "snapshots" / REVISION)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    return home


def _run(home: Path, *argv: str) -> subprocess.CompletedProcess:
    env = os.environ | {"HF_HOME": str(home), "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_ETAG_TIMEOUT": "2"}
    env.pop("HF_HUB_OFFLINE", None)
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.parametrize("model", [f"acme/tiny@{REVISION}", "acme/tiny"])
def test_a_warm_cache_serves_the_checkpoint_without_the_hub(warm_cache, model):
    argv = ["-m", "engine_pod.cli.main", "generate", "--model", model, "--chat", "--canvas", "block"]
    done = _run(warm_cache, *argv, "--prompt", "letters from t to z .")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "t u v w x y z"


def test_the_gateways_tokenizer_comes_from_the_warm_cache_too(warm_cache, tmp_path):
    done = _run(warm_cache, "-m", "gateway.fetch_tokenizer", f"acme/tiny@{REVISION}", str(tmp_path / "tok"))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "tok" / "tokenizer.json").is_file()


def test_a_checkpoint_not_in_the_cache_is_fetched_and_a_failure_is_one_line(warm_cache):
    done = _run(
        warm_cache, "-m", "engine_pod.cli.main", "generate", "--model", "acme/other@v2", "--prompt", "x"
    )
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "dllm generate: error: cannot fetch 'acme/other' at revision 'v2' from the Hugging Face Hub"
    )
