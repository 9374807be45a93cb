"""Models from an S3-compatible store and from a volume path, served by ``dllm serve`` and answering the
official client. The store is moto's S3 server (``python -m moto.server``), a real HTTP server process on
127.0.0.1; the shipped tiny model is uploaded to it. A second start with the store stopped serves from
the model cache alone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dllm_contracts.model_source import builtin_model_dir, default_served_name, is_remote, resolve_model_dir
from tests.s3_server import S3Server
from tests.serving.serve_process import openai_client, running

PROMPT = "letters from t to z ."  # the shipped model answers "t u v w x y z"
ANSWER = "t u v w x y z"


def _store(log: Path) -> S3Server:
    server = S3Server(log)
    server.upload(builtin_model_dir("tiny-llada"), "models", "llada/tiny-llada")
    return server


@pytest.fixture
def store(tmp_path):
    """A store of this test's own: for the test that stops it."""
    server = _store(tmp_path / "moto.log")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def shared_store(tmp_path_factory):
    """One store for the tests that only read it (each test's model cache is its own): a moto server's
    start costs seconds of CPU."""
    server = _store(tmp_path_factory.mktemp("s3") / "moto.log")
    yield server
    server.stop()


def _chat(server) -> str:
    client = openai_client(server)
    assert [m.id for m in client.models.list().data] == ["tiny-llada"]
    reply = client.chat.completions.create(
        model="tiny-llada", messages=[{"role": "user", "content": PROMPT}], max_tokens=32, temperature=0
    )
    return reply.choices[0].message.content.strip()


def _snapshots(cache: Path) -> list[Path]:
    return sorted(p.parent for p in cache.glob("s3/*/*/.dllm-snapshot.json"))


def test_serve_fetches_an_s3_model_once_and_starts_again_from_the_cache_without_the_store(store, tmp_path):
    env = store.env() | {"DLLM_MODEL_CACHE": str(tmp_path / "cache")}
    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()
    with running(tmp_path / "first", "--model", "s3://models/llada/tiny-llada", env=env) as server:
        assert _chat(server) == ANSWER
    [snapshot] = _snapshots(tmp_path / "cache")
    assert not list(snapshot.parent.glob(".partial-*"))  # nothing half-fetched left behind
    store.stop()  # the cache must suffice now
    with running(tmp_path / "second", "--model", "s3://models/llada/tiny-llada", env=env) as server:
        assert _chat(server) == ANSWER
    assert _snapshots(tmp_path / "cache") == [snapshot]


def _volume(tmp_path: Path) -> Path:
    """The shipped model behind a link, as a mounted volume shows a checkpoint."""
    volume = tmp_path / "volume" / "tiny-llada"
    volume.parent.mkdir()
    volume.symlink_to(builtin_model_dir("tiny-llada"), target_is_directory=True)
    return volume


# a file:// URI differs from the path only where its spec is read (model_source.py, the CI test below);
# through dllm serve it is the path's case again: slow
@pytest.mark.parametrize("form", ["path", pytest.param("file-uri", marks=pytest.mark.slow)])
def test_serve_loads_a_model_from_a_volume_path(tmp_path, form):
    volume = _volume(tmp_path)
    model = str(volume) if form == "path" else f"file://{volume}"
    with running(tmp_path, "--model", model) as server:
        assert _chat(server) == ANSWER


def test_a_file_uri_is_read_as_the_volume_path_it_names(tmp_path):
    """What dllm serve's worker and gateway make of ``--model file:///...``: the directory, and its name as
    the served model's."""
    volume = _volume(tmp_path)
    uri = f"file://{volume}"
    assert resolve_model_dir(uri) == resolve_model_dir(str(volume)) == volume
    assert default_served_name(uri) == default_served_name(uri, resolve_model_dir(uri)) == "tiny-llada"
    assert not is_remote(uri)


def _dllm(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "engine_pod.cli.main", *argv]
    return subprocess.run(command, capture_output=True, text=True, env=os.environ | env, timeout=300)


def test_generate_takes_an_s3_model(shared_store, tmp_path):
    env = shared_store.env() | {"DLLM_MODEL_CACHE": str(tmp_path / "cache")}
    argv = ["generate", "--model", "s3://models/llada/tiny-llada", "--chat", "--canvas", "block"]
    done = _dllm(env, *argv, "--prompt", PROMPT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == ANSWER


NO_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "",
    "AWS_SECRET_ACCESS_KEY": "",
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
    "AWS_CONFIG_FILE": "/nonexistent",
    "AWS_EC2_METADATA_DISABLED": "true",
}


@pytest.mark.parametrize(
    ("model", "overrides", "message"),
    [
        ("s3://no-such-bucket/tiny", {}, "the bucket 'no-such-bucket' does not exist"),
        ("s3://models/llada/absent", {}, "no checkpoint files under s3://models/llada/absent/"),
        ("s3://models/llada/tiny-llada", NO_CREDENTIALS, "no credentials: set AWS_ACCESS_KEY_ID"),
    ],
)
def test_an_s3_model_that_cannot_be_fetched_ends_serve_in_one_line(
    shared_store, tmp_path, model, overrides, message
):
    env = shared_store.env() | {"DLLM_MODEL_CACHE": str(tmp_path / "cache")} | overrides
    done = _dllm(env, "serve", "--port", "0", "--data-dir", str(tmp_path / "data"), "--model", model)
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()[-1:]
    assert line.startswith("dllm serve: error: ") and message in line, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
