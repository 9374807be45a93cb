"""Where a model's files are: a local directory (a path or ``file:///path``), a model shipped in the package,
a prefix in an S3-compatible store (``s3://BUCKET/PREFIX``, fetched once into the model cache: see
``s3_source``) or a Hugging Face repo (downloaded once into the hub's cache). Torch-free: ``dllm serve``
and the gateway's init container find the tokenizer without loading torch."""

from __future__ import annotations

import os
from pathlib import Path

from dllm_contracts.model_errors import ModelLoadError
from dllm_contracts.model_uri import (
    FILE_SCHEME,
    S3_SCHEME,
    looks_like_repo_id,
    names_download,
    split_revision,
)


def builtin_model_dir(name: str) -> Path:
    """A model shipped inside the package (same name in every image, whatever its site-packages path)."""
    from dllm_contracts.defaults import ASSETS_DIR

    path = ASSETS_DIR / name
    if not (path / "config.json").is_file():
        shipped = sorted(p.name for p in ASSETS_DIR.iterdir() if (p / "config.json").is_file())
        raise ModelLoadError(f"no built-in model {name!r}; shipped: {shipped}")
    return path


def portable_name(spec: str) -> str:
    """``spec`` as it names the same model from anywhere: ``builtin:NAME`` for a model shipped in the
    package (whatever its site-packages path), an absolute path for a local directory, else as given."""
    from dllm_contracts.defaults import ASSETS_DIR

    path = Path(spec).expanduser()
    if spec.startswith(("builtin:", "random:")) or not path.is_dir():
        return spec
    path = path.resolve()
    return f"builtin:{path.name}" if path.parent == ASSETS_DIR.resolve() else str(path)


def default_served_name(spec: str, model_dir: Path | None = None) -> str:
    """The model id clients pass when none is chosen (and the model label of its metrics): the last part of
    an s3:// URI or a repo id (not the cache's snapshot directory it was fetched into), else the checkpoint
    directory's name: ``model_dir``'s, or without it the one ``spec`` names (``builtin:NAME`` and
    ``random:NAME``: NAME)."""
    if is_remote(spec):
        return split_revision(spec)[0].rstrip("/").rsplit("/", 1)[-1]
    if model_dir is not None:
        return model_dir.name
    if spec.startswith(("builtin:", "random:")):
        return spec.split(":", 1)[1]
    return Path(os.path.abspath(Path(spec.removeprefix(FILE_SCHEME)).expanduser())).name


CHECKPOINT_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"]


def download(repo_id: str, revision: str | None = None, patterns: list[str] | None = None) -> Path:
    """The snapshot of ``repo_id`` at ``revision`` in the Hugging Face cache ($HF_HOME): taken from the
    cache without asking the Hub when it is there (a pod starting on a warm cache downloads nothing),
    downloaded once otherwise."""
    from huggingface_hub import snapshot_download

    patterns = patterns or CHECKPOINT_FILES
    try:
        return Path(
            snapshot_download(repo_id, revision=revision, allow_patterns=patterns, local_files_only=True)
        )
    except Exception:  # noqa: BLE001 (not cached, or cached only in part: download)
        pass
    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=patterns))
    except Exception as exc:  # the hub raises many kinds of errors; all mean "not available here"
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        at = f" at revision {revision!r}" if revision else ""
        raise ModelLoadError(
            f"cannot fetch {repo_id!r}{at} from the Hugging Face Hub ({reason}); "
            "pass a local checkpoint directory instead"
        ) from exc


def is_remote(spec: str) -> bool:
    """Whether ``spec`` names a checkpoint that is downloaded (an s3:// URI or a Hub repo id), not one
    already on a local or mounted disk."""
    return spec.startswith(S3_SCHEME) or (names_download(spec) and not Path(spec).expanduser().exists())


def resolve_model_dir(spec: str, patterns: list[str] | None = None) -> Path:
    """A local checkpoint directory for ``spec``: a path or ``file:///path``, ``builtin:NAME``, an
    ``s3://BUCKET/PREFIX`` URI or a Hugging Face repo id (``REPO@REVISION`` pins a revision).
    ``patterns``: the files a download takes (default: the checkpoint's)."""
    if spec.startswith(S3_SCHEME):
        from dllm_contracts import s3_source

        return s3_source.fetch(spec, patterns or CHECKPOINT_FILES)
    if spec.startswith("builtin:"):
        spec = str(builtin_model_dir(spec.split(":", 1)[1]))
    spec = spec.removeprefix(FILE_SCHEME)
    path = Path(spec).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelLoadError(f"model path {spec!r} is not a directory")
        return path
    repo, revision = split_revision(spec)
    if looks_like_repo_id(repo):
        return download(repo, revision, patterns)
    raise ModelLoadError(f"model path {spec!r} does not exist")
