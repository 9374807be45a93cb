"""spec.decoding.sparseCache: the head-sparse cache's settings, the `dllm worker` flags they become and the
volume of their importance file.

Defaults and ranges are the engine's contract's (dllm_contracts/head_sparse_config.py); the CRD repeats
them and a test holds the two equal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dllm_contracts.head_sparse_config import HeadSparseConfig

IMPORTANCE_MOUNT = "/etc/dllm/head-importance"
IMPORTANCE_KEY = "heads.json"  # the key of the ConfigMap that holds what `dllm heads` wrote
_SPARSE_DEFAULTS = HeadSparseConfig()
SPARSE_FIELDS = {
    "mode": "mode",
    "retention": "retention",
    "core_share": "coreShare",
    "minor_share": "minorShare",
    "minor_retention": "minorRetention",
    "consistency": "consistency",
    "scoring": "scoring",
    "pool_kernel": "poolKernel",
    "selection": "selection",
    "selection_delay": "selectionDelay",
}  # HeadSparseConfig's field -> its name under spec.decoding.sparseCache


@dataclass(frozen=True)
class SparseCache:
    """spec.decoding.sparseCache: HeadSparseConfig's settings, the importance file as a ConfigMap's name."""

    mode: str = _SPARSE_DEFAULTS.mode
    retention: float = _SPARSE_DEFAULTS.retention
    core_share: float = _SPARSE_DEFAULTS.core_share
    minor_share: float = _SPARSE_DEFAULTS.minor_share
    minor_retention: float = _SPARSE_DEFAULTS.minor_retention
    consistency: float = _SPARSE_DEFAULTS.consistency
    scoring: str = _SPARSE_DEFAULTS.scoring
    pool_kernel: int = _SPARSE_DEFAULTS.pool_kernel
    selection: str = _SPARSE_DEFAULTS.selection
    selection_delay: int = _SPARSE_DEFAULTS.selection_delay
    importance_configmap: str | None = None  # its IMPORTANCE_KEY is mounted into the engine pods

    @property
    def on(self) -> bool:
        return self.mode != "off"

    @property
    def importance_path(self) -> str | None:
        return f"{IMPORTANCE_MOUNT}/{IMPORTANCE_KEY}" if self.importance_configmap else None

    def settings(self) -> dict[str, Any]:
        """HeadSparseConfig's fields as the spec sets them."""
        return {name: getattr(self, name) for name in SPARSE_FIELDS} | {"importance": self.importance_path}


def sparse_cache_of(sparse: dict[str, Any]) -> SparseCache:
    """spec.decoding.sparseCache as typed settings (an absent field: HeadSparseConfig's default)."""
    settings = {
        name: type(getattr(_SPARSE_DEFAULTS, name))(sparse[crd])
        for name, crd in SPARSE_FIELDS.items()
        if crd in sparse
    }
    return SparseCache(**settings, importance_configmap=sparse.get("headImportanceConfigMap"))


def sparse_flags(sparse: SparseCache) -> list[str]:
    """`dllm worker`'s head-sparse flags: nothing while the cache is off (the spec sets no mode)."""
    if not sparse.on:
        return []
    flags = ["--sparse-cache", sparse.mode, "--retention", str(sparse.retention)]
    flags += ["--minor-retention", str(sparse.minor_retention), "--core-share", str(sparse.core_share)]
    flags += ["--minor-share", str(sparse.minor_share), "--sparse-consistency", str(sparse.consistency)]
    flags += ["--sparse-scoring", sparse.scoring, "--sparse-pool-kernel", str(sparse.pool_kernel)]
    flags += ["--sparse-selection", sparse.selection, "--selection-delay", str(sparse.selection_delay)]
    path = sparse.importance_path
    return flags + (["--head-importance", path] if path else [])


def importance_volume(sparse: SparseCache) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The engine pod's (volumes, mounts) for the importance ConfigMap (none without one)."""
    if not sparse.importance_configmap:
        return [], []
    items = [{"key": IMPORTANCE_KEY, "path": IMPORTANCE_KEY}]
    volume = {"name": "head-importance", "configMap": {"name": sparse.importance_configmap, "items": items}}
    return [volume], [{"name": "head-importance", "mountPath": IMPORTANCE_MOUNT, "readOnly": True}]
