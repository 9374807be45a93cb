"""The profile result's one schema: what `dllm profile` says about a device, as every process reads it.

A summary travels: the profiling Job writes it as its termination message, the operator stores it in the
service's status and its profile ConfigMap (adding the GPU product of the node it was measured on), and
`dllm worker --profile` reads its token budget back from that ConfigMap. `dllm profile --json` writes the
full result (every grid point and check), from which the same summary is derived. A budget set in the
spec travels the same way with ``source: "spec"`` and no measurement.

Torch-free: the operator imports it."""

from __future__ import annotations

import json
import typing
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

TERMINATION_LIMIT = 4096  # bytes Kubernetes keeps of a termination message
SOURCES = ("measured", "spec")


class ProfileFormatError(ValueError):
    """Text that is not a profile result (not JSON, a field missing or of the wrong type)."""


class ProfileFailed(ValueError):
    """The profiler ran and reported why it produced no budget."""


@dataclass(frozen=True)
class ProfileSummary:
    token_budget: int
    source: str = "measured"
    device: str | None = None  # "cuda:0", "cpu"
    # the device as the machine names it: a GPU's name ("NVIDIA H100 80GB HBM3"), a CPU's model ("AMD EPYC")
    device_name: str | None = None
    gpu_product: str | None = None  # the measured node's nvidia.com/gpu.product label (operator)
    dtype: str | None = None
    # the allocator it was measured under (the C library's malloc as dllm tunes it, or CUDA's caching
    # allocator and its setting): the same model peaks otherwise under another
    allocator: str | None = None
    layout: str | None = None  # the batch layout the budget was measured in (packed or dense)
    # the tensor-parallel size it was measured at (ranks of one engine group; the budget is per rank and
    # holds at that size only); a summary without it was measured at 1
    tensor_parallel: int = 1
    expert_parallel: int = 1  # the expert-parallel size it was measured at (a summary without it: 1)
    # the share of a token's peak (bytes_per_token) that its dual cache holds for the row's whole life (the
    # rest is the refresh forward's): what dLLM-Serve's admission counts (scheduler/dllm_serve.py)
    cache_share: float | None = None
    # the head-sparse cache's settings it was measured with (dllm_contracts/head_sparse_config.py's
    # memory_settings: its mode and the shares and retentions that decide what it holds); None: the dense cache
    sparse_cache: dict[str, Any] | None = None
    total_memory_bytes: int | None = None
    memory_limit_bytes: int | None = None  # the limit it was measured against (usable: its planned share)
    usable_memory_bytes: int | None = None
    weights_bytes: int | None = None
    bytes_per_token: float | None = None
    intercept_bytes: int | None = None
    r_squared: float | None = None
    held_out_max_error: float | None = None

    @classmethod
    def from_spec(
        cls, token_budget: int, tensor_parallel: int = 1, expert_parallel: int = 1
    ) -> ProfileSummary:
        sizes = {"tensor_parallel": tensor_parallel, "expert_parallel": expert_parallel}
        return cls.parse({"token_budget": token_budget, "source": "spec", **sizes})

    @classmethod
    def from_result(cls, result: dict[str, Any]) -> ProfileSummary:
        """The summary of a full `dllm profile --json` result."""
        fit = result.get("fit") or {}
        return cls.parse(
            {key: result.get(key) for key in (*_MEASURED_KEYS, *_OPTIONAL_KEYS) if key in result}
            | {
                "token_budget": result.get("token_budget"),
                "bytes_per_token": _rounded(fit.get("bytes_per_token"), 1),
                "intercept_bytes": int(fit["intercept_bytes"]) if "intercept_bytes" in fit else None,
                "r_squared": _rounded(fit.get("r_squared"), 5),
                "held_out_max_error": max(
                    (h["relative_error"] for h in result.get("held_out") or []), default=None
                ),
            }
        )

    @classmethod
    def parse(cls, data: Any) -> ProfileSummary:
        """A summary from decoded JSON (a summary, or a full result), or ProfileFormatError saying why."""
        if not isinstance(data, dict):
            raise ProfileFormatError("a profile result is a JSON object")
        if "fit" in data:  # a full result
            return cls.from_result(data)
        unknown = sorted(set(data) - _FIELD_TYPES.keys())
        if unknown:
            raise ProfileFormatError(f"unknown profile field(s): {', '.join(unknown)}")
        for key, value in data.items():
            _check_type(key, value)
        summary = cls(**data) if "token_budget" in data else None
        if summary is None or summary.token_budget < 1:
            raise ProfileFormatError("a profile result has a positive integer token_budget")
        for key in ("tensor_parallel", "expert_parallel"):
            if not isinstance(getattr(summary, key), int) or getattr(summary, key) < 1:
                raise ProfileFormatError(f"profile field {key} must be at least 1")
        if summary.source not in SOURCES:
            raise ProfileFormatError(f"profile source must be one of {', '.join(SOURCES)}")
        missing = [key for key in _MEASURED_KEYS if summary.source == "measured" and data.get(key) is None]
        if missing:
            raise ProfileFormatError(f"a measured profile needs {', '.join(missing)}")
        return summary

    @classmethod
    def from_json(cls, text: str) -> ProfileSummary:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ProfileFormatError(f"not JSON: {text[:200]}") from exc
        return cls.parse(data)

    def with_gpu_product(self, product: str | None) -> ProfileSummary:
        return self if not product else ProfileSummary(**(asdict(self) | {"gpu_product": product}))

    def as_dict(self) -> dict[str, Any]:
        """The fields that hold a value (what status, the ConfigMap and the termination message carry);
        tensor_parallel and expert_parallel only above 1 (what a reader that predates them also accepts)."""
        held = {key: value for key, value in asdict(self).items() if value is not None}
        ones = (("tensor_parallel", 1), ("expert_parallel", 1))
        return {key: value for key, value in held.items() if (key, value) not in ones}

    def sizes(self) -> str:
        """The group size it was measured at, as the flags say it."""
        words = f"--tensor-parallel {self.tensor_parallel}"
        return words + (f" --expert-parallel {self.expert_parallel}" if self.expert_parallel > 1 else "")

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), separators=(",", ":"))

    def termination_message(self) -> str:
        message = self.to_json()
        if len(message.encode()) >= TERMINATION_LIMIT:
            raise ProfileFormatError(
                f"profile summary is {len(message)} bytes, over the {TERMINATION_LIMIT}-byte limit"
            )
        return message


# fields a measured profile must carry (the rest may be absent)
_OPTIONAL_KEYS = (
    "allocator",
    "layout",
    "tensor_parallel",
    "expert_parallel",
    "cache_share",
    "sparse_cache",
    "memory_limit_bytes",
)  # carried from a full result when it has them
_MEASURED_KEYS = (
    "device",
    "device_name",
    "dtype",
    "total_memory_bytes",
    "usable_memory_bytes",
    "weights_bytes",
)


def _accepted(hint: Any) -> tuple[type, ...]:
    """The JSON types a field accepts: its annotation without None (a float may be written as 1)."""
    types = tuple(
        typing.get_origin(t) or t for t in (typing.get_args(hint) or (hint,)) if t is not type(None)
    )
    return (*types, int) if float in types else types


_FIELD_TYPES = {name: _accepted(hint) for name, hint in typing.get_type_hints(ProfileSummary).items()}


def _check_type(key: str, value: Any) -> None:
    if value is None and key != "token_budget":
        return
    if isinstance(value, bool) or not isinstance(value, _FIELD_TYPES[key]):
        expected = " or ".join(t.__name__ for t in _FIELD_TYPES[key])
        raise ProfileFormatError(f"profile field {key} must be {expected}, got {value!r}")


def _rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def failure_message(error: str) -> str:
    """A failed profile as termination-message JSON, within the limit however long the error is."""
    message = json.dumps({"error": error}, separators=(",", ":"))
    while len(message.encode()) >= TERMINATION_LIMIT:
        error = error[: len(error) // 2]
        message = json.dumps({"error": error}, separators=(",", ":"))
    return message


def read_termination_message(message: str | None) -> ProfileSummary:
    """What a profiling pod reported: its summary, or ProfileFailed / ProfileFormatError saying why not."""
    if not message:
        raise ProfileFormatError("the profiling pod left no termination message")
    try:
        data = json.loads(message)
    except json.JSONDecodeError as exc:
        raise ProfileFormatError(
            f"the profiling pod's termination message is not JSON: {message[:200]}"
        ) from exc
    if isinstance(data, dict) and "error" in data:
        raise ProfileFailed(f"profiling failed: {data['error']}")
    return ProfileSummary.parse(data)


def read_profile_file(path: str | Path) -> ProfileSummary:
    """A profile file (`dllm profile --json`, or a summary such as the operator's ConfigMap)."""
    file = Path(path)
    if not file.is_file():
        raise ProfileFormatError(f"profile file {path} does not exist")
    try:
        return ProfileSummary.from_json(file.read_text())
    except ProfileFormatError as exc:
        raise ProfileFormatError(f"{path} is not a `dllm profile` result: {exc}") from exc
