"""A real S3-compatible server for tests: moto's server (``python -m moto.server``) as a subprocess on a
free port of 127.0.0.1, with a client and the environment a process needs to reach it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import boto3
import httpx

from engine_pod.serve.redis_server import free_port
from tests.serving_utils import wait_for

KEY_ID, SECRET = "test-key-id", "test-secret"  # moto accepts any credentials


class S3Server:
    def __init__(self, log: Path) -> None:
        self.port = free_port()
        self.log_path = log  # one line per request (werkzeug's access log)
        self.log = open(log, "w")  # noqa: SIM115 (closed in stop)
        argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]
        self.process = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT)
        wait_for(self._answers, 60, 0.1, what="moto's S3 server")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """What a process needs to use this store (the standard AWS variables)."""
        return {
            "AWS_ENDPOINT_URL": self.url,
            "AWS_ACCESS_KEY_ID": KEY_ID,
            "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def client(self):
        return boto3.client(
            "s3",
            endpoint_url=self.url,
            aws_access_key_id=KEY_ID,
            aws_secret_access_key=SECRET,
            region_name="us-east-1",
        )

    def upload(self, directory: Path, bucket: str, prefix: str) -> None:
        """Every file under ``directory`` to ``s3://bucket/prefix/`` (the bucket made if needed)."""
        client = self.client()
        if bucket not in {b["Name"] for b in client.list_buckets()["Buckets"]}:
            client.create_bucket(Bucket=bucket)
        for path in sorted(p for p in directory.rglob("*") if p.is_file()):
            client.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(directory)}")

    def _answers(self) -> bool:
        assert self.process.poll() is None, "moto's server exited; see its log"
        try:
            return httpx.get(self.url, timeout=1).status_code < 500
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()
