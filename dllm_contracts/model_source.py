"""Where a model's files are: a local directory, a model shipped in the package, or a Hugging Face repo
(downloaded once into the hub's cache). Torch-free: ``dllm serve`` finds the tokenizer without loading
torch."""

from __future__ import annotations

from pathlib import Path


class ModelLoadError(ValueError):
    """The model could not be found or loaded; the message says why in one line."""


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


def split_revision(spec: str) -> tuple[str, str | None]:
    """``REPO@REVISION`` -> (REPO, REVISION); anything else -> (spec, None)."""
    repo, at, revision = spec.partition("@")
    return (repo, revision) if at and _looks_like_repo_id(repo) and revision else (spec, None)


def _looks_like_repo_id(spec: str) -> bool:
    parts = spec.split("/")
    return len(parts) == 2 and all(parts) and not spec.startswith((".", "~"))


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


def resolve_model_dir(spec: str) -> Path:
    """A local checkpoint directory for ``spec``: a path, ``builtin:NAME``, or a Hugging Face repo id
    (``REPO@REVISION`` pins a revision)."""
    if spec.startswith("builtin:"):
        spec = str(builtin_model_dir(spec.split(":", 1)[1]))
    path = Path(spec).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelLoadError(f"model path {spec!r} is not a directory")
        return path
    repo, revision = split_revision(spec)
    if _looks_like_repo_id(repo):
        return download(repo, revision)
    raise ModelLoadError(f"model path {spec!r} does not exist")
