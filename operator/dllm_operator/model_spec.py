"""Where ``spec.model`` takes the weights from: a path on a volume (``volumeClaim`` and a path in ``uri``,
or ``uri: pvc://CLAIM/PATH``), a prefix in an S3-compatible store (``uri: s3://BUCKET/PREFIX``, its
credentials from ``s3CredentialsSecretRef``, its endpoint ``s3EndpointUrl``), or a Hugging Face repo."""

from __future__ import annotations

from typing import Any

PVC_SCHEME, S3_SCHEME = "pvc://", "s3://"
DEFAULT_DOWNLOAD_TIMEOUT_S = 3600


def source_fields(model: dict[str, Any]) -> dict[str, Any]:
    """The ServiceSpec fields of ``spec.model``'s source; ``pvc://CLAIM/PATH`` becomes the claim and the
    path on it, as ``volumeClaim`` and ``uri`` would say it."""
    uri, claim = model["uri"], model.get("volumeClaim")
    if uri.startswith(PVC_SCHEME):
        claim, _, uri = uri.removeprefix(PVC_SCHEME).partition("/")
    return {
        "model_uri": uri,
        "volume_claim": claim,
        "s3_credentials": (model.get("s3CredentialsSecretRef") or {}).get("name"),
        "s3_endpoint_url": model.get("s3EndpointUrl"),
        "download_timeout_s": int(model.get("downloadTimeoutSeconds", DEFAULT_DOWNLOAD_TIMEOUT_S)),
    }


def source_problems(model: dict[str, Any]) -> list[tuple[bool, str]]:
    """The CRD's CEL rules on ``spec.model``'s source, for the operator to check again."""
    uri = model.get("uri", "")
    s3, pvc = uri.startswith(S3_SCHEME), uri.startswith(PVC_SCHEME)
    claim, _, path = uri.removeprefix(PVC_SCHEME).partition("/")
    return [
        (pvc and "volumeClaim" in model, "a pvc:// uri names its claim: leave model.volumeClaim unset"),
        (pvc and not (claim and path.strip("/")), "a pvc:// uri is pvc://CLAIM/PATH"),
        (s3 and not uri.removeprefix(S3_SCHEME).split("/")[0], "an s3:// uri is s3://BUCKET/PREFIX"),
        (
            s3 and ("volumeClaim" in model or "revision" in model),
            "an s3:// model is downloaded: model.volumeClaim and model.revision are not for it",
        ),
        (
            not s3 and ("s3CredentialsSecretRef" in model or "s3EndpointUrl" in model),
            "model.s3CredentialsSecretRef and model.s3EndpointUrl are for an s3:// uri",
        ),
    ]
