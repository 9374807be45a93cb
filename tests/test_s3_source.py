"""The s3:// model cache against a real S3-compatible server (moto's, ``python -m moto.server``): a
snapshot is used only once complete, the store is asked again and a changed prefix fetched again, and
without the store the newest complete snapshot serves."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dllm_contracts.model_source import builtin_model_dir, default_served_name
from dllm_contracts.model_store_config import ModelStoreSettings
from dllm_contracts.model_uri import names_download
from dllm_contracts.s3_source import MARKER, S3SourceError, fetch
from tests.s3_server import S3Server

URI = "s3://models/tiny"
PATTERNS = ["*.json", "*.safetensors"]


@pytest.fixture
def store(tmp_path, monkeypatch):
    server = S3Server(tmp_path / "moto.log")
    server.upload(builtin_model_dir("tiny-llada"), "models", "tiny")
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    yield server
    server.stop()


def _settings(tmp_path, store) -> ModelStoreSettings:
    return ModelStoreSettings(tmp_path / "cache", store.url)


def test_a_fetched_snapshot_holds_the_prefixs_files_and_is_used_again(store, tmp_path):
    settings = _settings(tmp_path, store)
    snapshot = fetch(URI, PATTERNS, settings)
    shipped = builtin_model_dir("tiny-llada")
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (snapshot / name).read_bytes() == (shipped / name).read_bytes()
    assert not (snapshot / "chat_template.jinja").exists()  # only what the patterns take
    (snapshot / "config.json").touch()
    before = (snapshot / "config.json").stat().st_mtime_ns
    assert fetch(URI, PATTERNS, settings) == snapshot
    assert (snapshot / "config.json").stat().st_mtime_ns == before  # not downloaded again


def test_a_snapshot_without_its_marker_is_never_used(store, tmp_path):
    settings = _settings(tmp_path, store)
    snapshot = fetch(URI, PATTERNS, settings)
    (snapshot / MARKER).unlink()  # as a download cut short would leave it
    (snapshot / "model.safetensors").write_bytes(b"half")
    store.stop()
    with pytest.raises(S3SourceError, match="cannot reach the store"):
        fetch(URI, PATTERNS, settings)


def test_a_half_download_is_fetched_again_whole(store, tmp_path):
    settings = _settings(tmp_path, store)
    snapshot = fetch(URI, PATTERNS, settings)
    (snapshot / MARKER).unlink()
    (snapshot / "model.safetensors").write_bytes(b"half")
    assert fetch(URI, PATTERNS, settings) == snapshot
    shipped = builtin_model_dir("tiny-llada") / "model.safetensors"
    assert (snapshot / "model.safetensors").read_bytes() == shipped.read_bytes()
    assert (snapshot / MARKER).is_file()


def test_a_changed_prefix_is_a_new_snapshot_and_without_the_store_the_newest_serves(store, tmp_path):
    settings = _settings(tmp_path, store)
    first = fetch(URI, PATTERNS, settings)
    store.client().put_object(Bucket="models", Key="tiny/generation_config.json", Body=b'{"eos": 1}')
    second = fetch(URI, PATTERNS, settings)
    assert second != first and (second / "generation_config.json").read_bytes() == b'{"eos": 1}'
    store.stop()
    assert fetch(URI, PATTERNS, settings) == second


def test_the_endpoint_comes_from_dllms_setting_then_the_aws_variables():
    env = {"AWS_ENDPOINT_URL": "http://a:1", "AWS_ENDPOINT_URL_S3": "http://s3:2", "XDG_CACHE_HOME": "/c"}
    assert ModelStoreSettings.from_env(env).s3_endpoint_url == "http://s3:2"
    assert ModelStoreSettings.from_env(env | {"DLLM_S3_ENDPOINT_URL": "https://d:3"}).s3_endpoint_url == (
        "https://d:3"
    )
    assert str(ModelStoreSettings.from_env(env).cache_dir) == "/c/dllm/models"
    with pytest.raises(ValueError, match="must be an http:// or https:// URL"):
        ModelStoreSettings.from_env({"DLLM_S3_ENDPOINT_URL": "minio:9000"})


def test_two_fetches_at_once_download_the_checkpoint_once(store, tmp_path):
    """As two pods on one node (or sharing the cache volume) starting together: one downloads, the other
    waits for it and uses its snapshot."""
    env = os.environ | store.env() | {"DLLM_MODEL_CACHE": str(tmp_path / "cache")}
    argv = [sys.executable, "-m", "dllm_contracts.fetch_model", URI]
    fetches = [subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for process in fetches:
        assert process.wait(timeout=120) == 0, process.stderr.read()
    downloads = store.log_path.read_text().count("GET /models/tiny/model.safetensors")
    assert downloads == 1
    [snapshot] = (tmp_path / "cache" / "s3").glob(f"*/*/{MARKER}")
    assert not list(snapshot.parent.parent.glob(".partial-*"))


def test_fetch_model_fails_in_one_line_at_its_deadline(store, tmp_path):
    store.process.send_signal(signal.SIGSTOP)  # a store that accepts and never answers
    try:
        env = os.environ | store.env() | {"DLLM_MODEL_CACHE": str(tmp_path / "cache")}
        argv = [sys.executable, "-m", "dllm_contracts.fetch_model", URI, "--deadline", "2"]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    finally:
        store.process.send_signal(signal.SIGCONT)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "fetch_model: error: not fetched within the deadline of 2 s"
    )


def test_the_gateways_tokenizer_fetch_takes_only_the_tokenizer_from_the_store(store, tmp_path):
    env = os.environ | store.env() | {"DLLM_MODEL_CACHE": str(tmp_path / "cache")}
    argv = [sys.executable, "-m", "gateway.fetch_tokenizer", URI, str(tmp_path / "tok")]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "tok" / "tokenizer.json").is_file()
    assert "GET /models/tiny/model.safetensors" not in store.log_path.read_text()  # no weights fetched


@pytest.mark.parametrize(
    ("spec", "downloads", "served"),
    [
        ("s3://models/llada/tiny-llada/", True, "tiny-llada"),
        ("GSAI-ML/LLaDA-8B-Instruct@0123abc", True, "LLaDA-8B-Instruct"),
        ("builtin:tiny-llada", False, "snapshot"),
        ("/models/llada", False, "snapshot"),
        ("file:///models/llada", False, "snapshot"),
        ("random:llada-tiny", False, "snapshot"),
    ],
)
def test_what_a_source_names_decides_the_fetch_and_the_served_name(spec, downloads, served):
    assert names_download(spec) is downloads
    assert default_served_name(spec, Path("/cache/snapshot")) == served
