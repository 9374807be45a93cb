"""What a model source names, read as text only (no file system, no network): the schemes and the shape
of a Hugging Face repo id. The operator decides from it whether a pod must fetch its model."""

from __future__ import annotations

S3_SCHEME = "s3://"
FILE_SCHEME = "file://"


def split_revision(spec: str) -> tuple[str, str | None]:
    """``REPO@REVISION`` -> (REPO, REVISION); anything else -> (spec, None)."""
    repo, at, revision = spec.partition("@")
    return (repo, revision) if at and looks_like_repo_id(repo) and revision else (spec, None)


def looks_like_repo_id(spec: str) -> bool:
    parts = spec.split("/")
    return len(parts) == 2 and all(parts) and not spec.startswith((".", "~"))


def names_download(spec: str) -> bool:
    """Whether ``spec``, read as text only, is an s3:// URI or a Hub repo id (``REPO[@REVISION]``)."""
    if spec.startswith(S3_SCHEME):
        return True
    if spec.startswith(("builtin:", "random:", FILE_SCHEME, "/")):
        return False
    return looks_like_repo_id(split_revision(spec)[0])
