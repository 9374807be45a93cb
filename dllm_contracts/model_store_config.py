"""Where fetched checkpoints are cached and which S3-compatible store ``s3://`` models come from: the one
module that reads these settings from the environment."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

MODEL_CACHE_ENV = "DLLM_MODEL_CACHE"  # the cache directory; default $XDG_CACHE_HOME/dllm/models
S3_ENDPOINT_ENV = "DLLM_S3_ENDPOINT_URL"  # an S3-compatible store's URL (MinIO, Ceph, R2, ...)
# boto3's own names, read when DLLM_S3_ENDPOINT_URL is unset (the first that is set wins)
AWS_ENDPOINT_ENVS = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")


@dataclass(frozen=True)
class ModelStoreSettings:
    cache_dir: Path  # s3:// checkpoints land under cache_dir/s3
    s3_endpoint_url: str | None = None  # None: AWS S3 itself

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ModelStoreSettings:
        env = os.environ if environ is None else environ
        cache = env.get(MODEL_CACHE_ENV)
        if not cache:
            xdg = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
            cache = str(Path(xdg) / "dllm" / "models")
        names = (S3_ENDPOINT_ENV, *AWS_ENDPOINT_ENVS)
        endpoint = next((env[name] for name in names if env.get(name)), None)
        if endpoint and not endpoint.startswith(("http://", "https://")):
            raise ValueError(f"the S3 endpoint {endpoint!r} must be an http:// or https:// URL")
        return cls(Path(cache).expanduser(), endpoint)
