"""spec.decoding's engine options beyond the block: the head-sparse cache (sparse_cache.py), the logit
budget, warm prefixes and batch invariance, as `dllm worker` flags.

Defaults and ranges are the engine's contracts' (dllm_contracts/head_sparse_config.py, logit_settings.py);
the CRD repeats them and a test holds the two equal. A field the spec leaves out passes no flag: the
worker's own default.
"""

from __future__ import annotations

from typing import Any

from dllm_contracts.head_sparse_config import memory_settings
from dllm_contracts.head_sparse_config import problems_of as sparse_problems_of
from dllm_contracts.logit_settings import logit_problems
from dllm_operator.family_rules import family_problems
from dllm_operator.service_spec import ServiceSpec
from dllm_operator.sparse_cache import IMPORTANCE_KEY, SPARSE_FIELDS, sparse_cache_of, sparse_flags

LOGIT_FIELDS = {
    "max_materialized_logits": "maxMaterializedLogits",
    "logit_candidates": "logitCandidates",
}  # DecodingConfig's field -> its name under spec.decoding


def decoding_option_fields(decoding: dict[str, Any]) -> dict[str, Any]:
    """ServiceSpec's fields for these options from spec.decoding (absent: None, nothing passed)."""
    return {
        "sparse_cache": sparse_cache_of(decoding.get("sparseCache") or {}),
        **{name: _int_or_none(decoding.get(crd)) for name, crd in LOGIT_FIELDS.items()},
        "warm_prefixes": tuple(str(text) for text in decoding.get("warmPrefixes") or ()),
        "batch_invariant": bool(decoding.get("batchInvariant", False)),
    }


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def decoding_option_problems(spec: ServiceSpec) -> list[str]:
    """What is out of range or cannot run together, each naming its field under spec.decoding: the
    engine's own checks (HeadSparseConfig's, DecodingConfig's logit ranges), then what the worker would
    refuse at its start."""
    sparse = spec.sparse_cache
    problems = [
        f"decoding.sparseCache.{SPARSE_FIELDS[name]} {text}"
        for name, text in sparse_problems_of(sparse.settings()).items()
        if name in SPARSE_FIELDS
    ]
    if sparse.mode == "head-centric" and not sparse.importance_configmap:
        problems.append(
            "decoding.sparseCache.headImportanceConfigMap is required by mode head-centric: a ConfigMap "
            f"whose {IMPORTANCE_KEY} is the file `dllm heads` wrote"
        )
    if sparse.on and spec.cache != "dual":
        problems.append(f"decoding.sparseCache needs decoding.cache dual, not {spec.cache!r}")
    if sparse.on and spec.parallelism.tensor > 1:
        problems.append("decoding.sparseCache runs in one process: it needs parallelism.tensor 1")
    problems += family_problems(spec)  # what the engines refuse for the model's family
    logits = {name: getattr(spec, name) for name in LOGIT_FIELDS}
    logits["logit_candidates"] = logits["logit_candidates"] or 0
    problems += [f"decoding.{LOGIT_FIELDS[name]} {text}" for name, text in logit_problems(**logits).items()]
    if spec.warm_prefixes and spec.policy != "blockserve":
        problems.append(
            f"decoding.warmPrefixes need scheduling.policy blockserve (a token budget), not {spec.policy}"
        )
    if spec.warm_prefixes and spec.cache == "none":
        problems.append("decoding.warmPrefixes need a KV cache: decoding.cache prefix or dual, not none")
    return problems


def profiled_options(spec: ServiceSpec) -> dict[str, Any]:
    """These options' part of the profile's hash: what the profile measures of them (the logit budget bounds
    the logits' memory, the sparse cache is what the cache holds, batch invariance how every batch is laid
    out); unset or off: nothing (the hashes of before)."""
    fields = {name: getattr(spec, name) for name in LOGIT_FIELDS if getattr(spec, name) is not None}
    sparse = memory_settings(spec.sparse_cache.settings())
    invariant = {"batch_invariant": True} if spec.batch_invariant else {}
    return fields | ({"sparse_cache": sparse} if sparse else {}) | invariant


def profiling_flags(spec: ServiceSpec) -> list[str]:
    """`dllm profile`'s flags for these options: the logits' and the sparse cache's memory the engines will
    hold (the importance from the same ConfigMap, mounted by importance_volume), in the batches' layout."""
    return [*logit_flags(spec), *sparse_flags(spec.sparse_cache), *batch_invariant_flags(spec)]


def batch_invariant_flags(spec: ServiceSpec) -> list[str]:
    """`--batch-invariant` where the spec turns it on (`dllm worker` and `dllm profile`)."""
    return ["--batch-invariant", "on"] if spec.batch_invariant else []


def logit_flags(spec: ServiceSpec) -> list[str]:
    """The logit budget's flags, each only where the spec sets it (`dllm worker` and `dllm profile`)."""
    flags = []
    if spec.max_materialized_logits is not None:
        flags += ["--max-materialized-logits", str(spec.max_materialized_logits)]
    if spec.logit_candidates is not None:
        flags += ["--logit-candidates", str(spec.logit_candidates)]
    return flags


def decoding_option_flags(spec: ServiceSpec) -> list[str]:
    """`dllm worker`'s flags for these options."""
    warm = [flag for text in spec.warm_prefixes for flag in ("--warm-prefix", text)]
    return [*sparse_flags(spec.sparse_cache), *logit_flags(spec), *batch_invariant_flags(spec), *warm]
