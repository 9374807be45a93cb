"""The s3:// file store against a real S3-compatible server process (moto's, started on 127.0.0.1 here):
upload (multipart past one part), download and delete through ``python -m gateway``, the objects checked
in the bucket itself."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import httpx
import openai
import pytest

from engine_pod.serve.redis_server import free_port
from tests.serving.test_file_store import (
    _client,
    _download_sha,
    _kill,
    _post_part_of_an_upload,
    _settings,
    _start,
)
from tests.serving_utils import wait_for

boto3 = pytest.importorskip("boto3")
pytest.importorskip("moto.server", reason="moto[server] runs the S3-compatible server")
from gateway.s3_store import PART  # noqa: E402 (boto3 is there)

BUCKET = "dllm-files"
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "test",
    "AWS_SECRET_ACCESS_KEY": "test",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code < 500
    except httpx.HTTPError:
        return False


@pytest.fixture
def s3_server(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with (tmp_path / "moto.log").open("w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=log
        )
    try:
        wait_for(lambda: _answers(url), what="the S3 server to answer")
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_files_live_in_an_s3_bucket(served_model, redis_server, service, s3_server, tmp_path):
    bucket = boto3.client("s3", endpoint_url=s3_server, **_boto_credentials())
    bucket.create_bucket(Bucket=BUCKET)
    store = f"s3://{BUCKET}/dllm"
    settings = _settings(served_model, redis_server.url, service, store, s3_endpoint_url=s3_server)
    content = b'{"custom_id": "x", "pad": "' + os.urandom(6 * 1024 * 1024).hex().encode() + b'"}\n'
    assert len(content) > PART  # written as a multipart upload
    gateway = _start(settings, CREDENTIALS)
    try:
        client = _client(gateway)
        uploaded = client.files.create(file=("big.jsonl", content), purpose="batch")
        key = f"dllm/{service}/{uploaded.id}"
        assert bucket.head_object(Bucket=BUCKET, Key=key)["ContentLength"] == len(content)
        assert _download_sha(client, uploaded.id) == hashlib.sha256(content).hexdigest()
        client.files.delete(uploaded.id)
        assert bucket.list_objects_v2(Bucket=BUCKET, Prefix="dllm/").get("KeyCount", 0) == 0
        with pytest.raises(openai.NotFoundError):
            client.files.retrieve(uploaded.id)
    finally:
        gateway.stop()


def _boto_credentials() -> dict:
    return {
        "aws_access_key_id": CREDENTIALS["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        "region_name": CREDENTIALS["AWS_DEFAULT_REGION"],
    }


def test_an_s3_upload_killed_midway_is_aborted(served_model, redis_server, service, s3_server):
    bucket = boto3.client("s3", endpoint_url=s3_server, **_boto_credentials())
    bucket.create_bucket(Bucket=BUCKET)
    settings = _settings(
        served_model,
        redis_server.url,
        service,
        f"s3://{BUCKET}/dllm",
        s3_endpoint_url=s3_server,
        max_upload_s=2.0,
        file_sweep_s=0.2,
    )
    gateway = _start(settings, CREDENTIALS)
    sock = _post_part_of_an_upload(gateway, 2 * PART)  # a multipart upload under way: a part sent
    unfinished = lambda: bucket.list_multipart_uploads(Bucket=BUCKET).get("Uploads", [])  # noqa: E731
    wait_for(unfinished, what="a multipart upload under way")
    _kill(gateway)
    sock.close()
    gateway = _start(settings, CREDENTIALS)
    try:
        wait_for(lambda: not unfinished(), what="the unfinished multipart upload aborted")
        assert bucket.list_objects_v2(Bucket=BUCKET).get("KeyCount", 0) == 0
        assert _client(gateway).files.list().data == []
    finally:
        gateway.stop()
