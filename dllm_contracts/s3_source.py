"""Checkpoints in an S3-compatible store (``s3://BUCKET/PREFIX``), fetched once into a local cache.

Each prefix has a directory in the cache (``cache_dir/s3/<bucket>--<prefix>-<hash of endpoint and URI>``)
holding one snapshot per listing: a snapshot is named by a digest of its objects' names, sizes and ETags,
so a prefix whose files change is fetched again and an unchanged one never is. A snapshot is downloaded
into a temporary directory and renamed into place once every file is there with its listed size, with a
marker naming what it holds: a half-finished download is never used, and two processes (or two pods on a
shared volume) fetching at once both end with the same complete snapshot. When the store cannot be asked
(no network, no credentials, the bucket gone) the newest complete snapshot is used, with a warning.
Torch-free: the gateway's init container fetches the tokenizer through it."""

from __future__ import annotations

import fcntl
import fnmatch
import hashlib
import json
import logging
import os
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path

from dllm_contracts.model_errors import ModelLoadError
from dllm_contracts.model_store_config import ModelStoreSettings

logger = logging.getLogger(__name__)

MARKER = ".dllm-snapshot.json"  # written last, before the rename: a snapshot with it is complete


class S3SourceError(ModelLoadError):
    """An ``s3://`` model that cannot be fetched; the message says why in one line."""


@dataclass(frozen=True)
class S3Object:
    name: str  # its path under the prefix
    key: str
    size: int
    etag: str


@dataclass(frozen=True)
class S3Location:
    bucket: str
    prefix: str  # no slash at either end; "" for the whole bucket

    @classmethod
    def parse(cls, uri: str) -> S3Location:
        bucket, _, prefix = uri.removeprefix("s3://").partition("/")
        if not uri.startswith("s3://") or not bucket:
            raise S3SourceError(f"{uri!r} is not an s3://BUCKET/PREFIX URI")
        return cls(bucket, prefix.strip("/"))

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}".rstrip("/")


def fetch(uri: str, patterns: list[str], settings: ModelStoreSettings | None = None) -> Path:
    """A complete local copy of the files under ``uri`` that match ``patterns`` (fnmatch on their path
    under the prefix): the cached snapshot when the store still lists the same files, else downloaded."""
    settings = settings or ModelStoreSettings.from_env()
    location = S3Location.parse(uri)
    home = settings.cache_dir / "s3" / _home_name(location, settings.s3_endpoint_url)
    try:
        client = _client(settings)
        objects = _listing(client, location, patterns)
    except S3SourceError as exc:
        cached = _newest_snapshot(home)
        if cached is None:
            raise
        logger.warning("%s; using the copy fetched before, %s", exc, cached)
        return cached
    snapshot = home / _digest(objects)
    if (snapshot / MARKER).is_file():
        return snapshot
    return _download(client, location, objects, snapshot)


def _home_name(location: S3Location, endpoint: str | None) -> str:
    readable = f"{location.bucket}--{location.prefix.replace('/', '--')}"[:80]
    digest = hashlib.sha256(f"{endpoint or 'aws'}|{location.uri}".encode()).hexdigest()[:10]
    return f"{readable}-{digest}"


def _digest(objects: list[S3Object]) -> str:
    listed = sorted((o.name, o.size, o.etag) for o in objects)
    return hashlib.sha256(json.dumps(listed).encode()).hexdigest()[:16]


def _newest_snapshot(home: Path) -> Path | None:
    markers = sorted(home.glob(f"*/{MARKER}"), key=lambda p: p.stat().st_mtime) if home.is_dir() else []
    return markers[-1].parent if markers else None


def _client(settings: ModelStoreSettings):
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise S3SourceError("s3:// models need boto3: pip install 'dllm-serve[serve]'") from None
    options = {"addressing_style": "path"} if settings.s3_endpoint_url else {}
    config = Config(
        retries={"max_attempts": 3, "mode": "standard"}, connect_timeout=10, read_timeout=60, s3=options
    )
    return boto3.session.Session().client("s3", endpoint_url=settings.s3_endpoint_url, config=config)


def _listing(client, location: S3Location, patterns: list[str]) -> list[S3Object]:
    prefix = f"{location.prefix}/" if location.prefix else ""
    objects = []
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=location.bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                name = item["Key"][len(prefix) :]
                if name and not name.endswith("/") and any(fnmatch.fnmatch(name, p) for p in patterns):
                    objects.append(S3Object(name, item["Key"], item["Size"], item.get("ETag", "").strip('"')))
    except Exception as exc:  # noqa: BLE001 (botocore's errors: each kind becomes one line below)
        raise S3SourceError(f"cannot list {location.uri}/: {_reason(exc, location)}") from None
    if not objects:
        raise S3SourceError(f"no checkpoint files under {location.uri}/ (looked for {', '.join(patterns)})")
    return objects


def _reason(exc: Exception, location: S3Location) -> str:
    code = getattr(exc, "response", {}).get("Error", {}).get("Code", "")
    if code == "NoSuchBucket":
        return f"the bucket {location.bucket!r} does not exist"
    if code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403"):
        return f"access denied ({code}): check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
    name = type(exc).__name__
    if name in ("NoCredentialsError", "PartialCredentialsError"):
        return "no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or an AWS profile)"
    if name in ("EndpointConnectionError", "ConnectTimeoutError", "ConnectionClosedError"):
        return f"cannot reach the store ({str(exc).splitlines()[0].split('?')[0]})"
    return str(exc).splitlines()[0] if str(exc) else name


def _download(client, location: S3Location, objects: list[S3Object], snapshot: Path) -> Path:
    """Download under a lock on the snapshot, so that processes on one machine (or sharing a volume whose
    file system honours locks) fetch it once: those that waited find it complete."""
    snapshot.parent.mkdir(parents=True, exist_ok=True)
    with open(snapshot.with_name(f".lock-{snapshot.name}"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (snapshot / MARKER).is_file():
            return snapshot
        host = socket.gethostname()
        for stale in snapshot.parent.glob(f".partial-{snapshot.name}-{host}-*"):  # a fetch killed here
            shutil.rmtree(stale, ignore_errors=True)
        shutil.rmtree(snapshot, ignore_errors=True)  # a snapshot without its marker is not one
        partial = snapshot.with_name(f".partial-{snapshot.name}-{host}-{os.getpid()}")
        try:
            _download_into(client, location, objects, partial)
            return _publish(partial, snapshot)
        finally:
            shutil.rmtree(partial, ignore_errors=True)


def _download_into(client, location: S3Location, objects: list[S3Object], partial: Path) -> None:
    total = sum(o.size for o in objects)
    logger.info("fetching %s/ (%d files, %.1f MiB)", location.uri, len(objects), total / 2**20)
    try:
        for item in objects:
            target = partial / item.name
            target.parent.mkdir(parents=True, exist_ok=True)
            client.download_file(location.bucket, item.key, str(target))
            if target.stat().st_size != item.size:
                raise S3SourceError(f"{location.uri}/{item.name} changed while it was fetched; fetch again")
    except S3SourceError:
        raise
    except Exception as exc:  # noqa: BLE001 (a failed transfer or a full disk: one line, no traceback)
        raise S3SourceError(f"cannot fetch {location.uri}/: {_reason(exc, location)}") from None
    marker = {"uri": location.uri, "files": [[o.name, o.size, o.etag] for o in objects]}
    (partial / MARKER).write_text(json.dumps(marker, indent=1))


def _publish(partial: Path, snapshot: Path) -> Path:
    """Rename the finished download into place; another process that finished first wins, equally."""
    try:
        partial.rename(snapshot)
    except OSError:
        if not (snapshot / MARKER).is_file():
            raise
    return snapshot
