"""An S3-compatible bucket as the file store (``file_store=s3://BUCKET/PREFIX``).

Credentials and region come from boto3's usual sources (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_DEFAULT_REGION``, a role); the endpoint from the ``s3_endpoint_url`` setting, else boto3's own
(``AWS_ENDPOINT_URL``, else AWS). An object is written in one PUT when it is small, else as a multipart
upload of ``PART``-byte parts, completed on commit: until then no reader sees it, and an upload left
unfinished by a killed gateway is aborted by the sweeper.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from typing import BinaryIO
from urllib.parse import urlparse

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

PART = 8 << 20  # bytes per part of a multipart upload (S3's minimum is 5 MiB): an upload's memory
_MISSING = ("404", "NoSuchKey", "NotFound")


class S3Store:
    def __init__(self, location: str, endpoint_url: str = "") -> None:
        parsed = urlparse(location)
        if not parsed.netloc:
            raise ValueError(f"file store {location!r} names no bucket (s3://BUCKET/PREFIX)")
        self.bucket, self.prefix = parsed.netloc, parsed.path.strip("/")
        config = Config(retries={"max_attempts": 5, "mode": "standard"})
        self.client = boto3.client("s3", endpoint_url=endpoint_url or None, config=config)

    def describe(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def writer(self, name: str) -> _S3Writer:
        return _S3Writer(self.client, self.bucket, self._key(name))

    def reader(self, name: str) -> BinaryIO:
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._key(name))["Body"]
        except ClientError as exc:
            if _missing(exc):
                raise FileNotFoundError(name) from None
            raise

    def delete(self, name: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._key(name))

    def size(self, name: str) -> int | None:
        try:
            return int(self.client.head_object(Bucket=self.bucket, Key=self._key(name))["ContentLength"])
        except ClientError as exc:
            if _missing(exc):
                return None
            raise

    def sweep_partial(self, older_than_s: float, writing: set[str]) -> int:
        cutoff = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=older_than_s)
        live = {self._key(name) for name in writing}
        listed = self.client.list_multipart_uploads(Bucket=self.bucket, Prefix=self.prefix)
        removed = 0
        for upload in listed.get("Uploads", []):
            if upload["Initiated"] < cutoff and upload["Key"] not in live:
                with contextlib.suppress(ClientError):
                    self.client.abort_multipart_upload(
                        Bucket=self.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                    )
                    removed += 1
        return removed


def _missing(exc: ClientError) -> bool:
    return str(exc.response.get("Error", {}).get("Code")) in _MISSING


class _S3Writer:
    def __init__(self, client, bucket: str, key: str) -> None:
        self.client, self.bucket, self.key = client, bucket, key
        self.buffer = bytearray()
        self.upload_id: str | None = None
        self.parts: list[dict] = []

    def write(self, data: bytes) -> None:
        self.buffer += data
        while len(self.buffer) >= PART:
            self._send_part(bytes(self.buffer[:PART]))
            del self.buffer[:PART]

    def _send_part(self, body: bytes) -> None:
        if self.upload_id is None:
            started = self.client.create_multipart_upload(Bucket=self.bucket, Key=self.key)
            self.upload_id = started["UploadId"]
        number = len(self.parts) + 1
        sent = self.client.upload_part(
            Bucket=self.bucket, Key=self.key, UploadId=self.upload_id, PartNumber=number, Body=body
        )
        self.parts.append({"PartNumber": number, "ETag": sent["ETag"]})

    def commit(self) -> None:
        if self.upload_id is None:
            self.client.put_object(Bucket=self.bucket, Key=self.key, Body=bytes(self.buffer))
            return
        if self.buffer:
            self._send_part(bytes(self.buffer))
            self.buffer.clear()
        self.client.complete_multipart_upload(
            Bucket=self.bucket, Key=self.key, UploadId=self.upload_id, MultipartUpload={"Parts": self.parts}
        )

    def abort(self) -> None:
        self.buffer.clear()
        if self.upload_id is not None:
            with contextlib.suppress(ClientError):
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=self.key, UploadId=self.upload_id)
