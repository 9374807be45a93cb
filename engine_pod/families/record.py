"""What the engine knows of a model family: one ``ModelFamily`` record, built in the family's own module
and listed once in ``registry.py``. Nothing outside a family's module and the registry asks for a family
by name: the engine reads these fields instead."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dllm_contracts.families import FamilyDecoding
from dllm_contracts.request_params import FamilyParams
from engine_pod.runner.kind import CacheKind


@dataclass(frozen=True)
class DualCacheQuirks:
    """How a bidirectional family's reference decodes, kept out of the generic denoising loop."""

    logit_shift: int = 0  # logits for position p come from hidden state p - shift (Dream: 1)
    commits_block_start_on_refresh: bool = (
        False  # with a cache, the block's first token comes from the refresh
    )
    caps_dual_cache_steps: bool = False  # with the dual cache, a block gets at most steps_per_block forwards

    def step_cap(self, cache: str, steps_per_block: int, quota_schedule: bool) -> int | None:
        """Most forwards one block may take, or None when only the block's completion ends it."""
        if quota_schedule or (cache == "dual" and self.caps_dual_cache_steps):
            return steps_per_block
        return None


@dataclass(frozen=True)
class ModelFamily:
    """One model family: how its checkpoints are read, built, loaded and decoded."""

    name: str  # what a DLLMService's spec.model.family and ``--family`` say
    display_name: str  # how users know it (help texts, README)
    summary: str  # a few words for the CRD's description of spec.model.family
    model_types: tuple[str, ...]  # config.json's model_type values it reads, lower case
    read_config: Callable[[dict[str, Any]], Any]  # config.json's fields -> its config
    architecture: Callable[[Any], Any]  # its config -> the model's modules (an nn.Module class)
    kind: CacheKind  # how its cycles keep keys and values: its stepper (engine_pod/kinds/)
    decoding: FamilyDecoding  # what a service decodes with when it does not say
    checkpoints: str  # the published checkpoints it reads, as README's Models table names them
    tiny_preset: str  # its CPU-sized random preset (dllm_contracts/model_presets.py): the op census runs it
    # checkpoint parameter name -> the model's; None where ``read_sources`` reads its own layout
    name_map: Callable[[Any], dict[str, str]] | None = None
    read_directory: Callable[[Path], Any] | None = None  # the config from more than config.json
    # (config, model_dir) -> its own layout: our tensor name -> a source each process reads its part of
    read_sources: Callable[[Any, Path], dict[str, Any]] | None = None
    # (name, whole shape) -> the distribution a random preset draws the parameter from (models/random_weights)
    random_law: Callable[[str, tuple[int, ...]], Any] | None = None
    # (model, config, random) after its weights are in (random: a random preset's, not a checkpoint's)
    finish: Callable[[Any, Any, bool], None] | None = None
    count_parameters: Callable[[Any], int] | None = None  # (config) -> parameters, without weights
    eos_from_directory: bool = True  # EOS ids also from generation_config.json and the tokenizer
    quirks: DualCacheQuirks = DualCacheQuirks()
    steps_capped_by_length: bool = False  # a row's steps per block capped by its generation budget
    # the per-request settings the family adds (a frozen dataclass of ``setting`` fields whose instance
    # holds a service's values; the gateway learns them from the family table); None: none
    request_params: type[FamilyParams] | None = None
    # (config, TensorParallel) -> its rank's shards (build(), cut(name, shape), finish); None: one process only
    tensor_parallel: Callable[[Any, Any], Any] | None = None
    expert_parallel: bool = False  # a mixture of experts whose experts --expert-parallel spreads over ranks

    def __post_init__(self) -> None:
        if not isinstance(self.kind, CacheKind):
            raise ValueError(
                f"family {self.name}: kind {self.kind!r} is not a cache kind (engine_pod/kinds/)"
            )
        if self.name_map is None and self.read_sources is None:
            raise ValueError(f"family {self.name}: a name_map or its own read_sources is needed")
        if not self.model_types or any(t != t.lower() for t in self.model_types):
            raise ValueError(f"family {self.name}: model_types must be given in lower case")

    def read(self, raw: dict[str, Any], model_dir: Path | None = None) -> Any:
        """A checkpoint's config as this family's: its reader's (``read_directory``'s where it reads more than
        config.json and the directory is given), named for this family, so that a variant whose record
        reuses another family's reader is served as itself."""
        if self.read_directory is not None and model_dir is not None:
            config = self.read_directory(model_dir)
        else:
            config = self.read_config(raw)
        return config if config.family == self.name else replace(config, family=self.name)

    def service_settings(self, config: Any, steps_per_block: int) -> FamilyParams | None:
        """The service's values of the per-request settings this family adds (None: it adds none), from
        its config's generation config (generation_config.json as read, where the config keeps one) and
        the engine's steps per block: what a request that sets none of them runs with."""
        if self.request_params is None:
            return None
        return self.request_params.for_service(getattr(config, "generation", None) or {}, steps_per_block)

    @property
    def records_margins(self) -> bool:
        """Whether its runner can record each commit's top-two margin and row 0's trace."""
        return self.kind.records_margins
