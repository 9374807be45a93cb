"""What benchmarks pass around: the model to load, prepared requests, and what a policy's run produced
(shared by the engine-alone runner and the serving-path runner, so neither imports the other)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

from engine_pod.engine import CycleRecord
from engine_pod.loading.loader import LoadedModel, load_metadata


@dataclass(frozen=True)
class ModelSpec:
    model: str
    device: str
    dtype: str
    family: str | None = None  # the family the checkpoint must be (None: any; another is refused)
    tensor_parallel: int = 1  # ranks the model is split across (this process and spawned ones)
    expert_parallel: int = 1  # sets of ranks a mixture of experts' experts are spread over

    @contextlib.contextmanager
    def loaded(self, seed: int = 0) -> Iterator[LoadedModel]:
        """The model (this process's rank of it), for as long as the context lasts."""
        import torch

        from engine_pod.cpu_load import pin_threads
        from engine_pod.group_processes import ModelArgs, tensor_parallel_group
        from engine_pod.parallel.place import GroupPlace

        place = GroupPlace(self.tensor_parallel, expert=self.expert_parallel)
        threads = max(1, torch.get_num_threads() // place.size)
        if place.size > 1:
            pin_threads(threads)
        args = ModelArgs(self.model, self.device, self.dtype, seed, self.family, threads)
        with tensor_parallel_group(place, args) as loaded:
            yield loaded

    def metadata(self) -> tuple:
        """The config and tokenizer, no weights read."""
        return load_metadata(self.model, self.family)


@dataclass
class PreparedRequest:
    request_id: str
    prompt_ids: list[int]  # a follow-up's: its new message alone (the history goes before it when sent)
    max_tokens: int
    follows: str | None = None  # a chat's next turn: sent when this request is answered, behind its history
    history_tokens: int = 0  # at most this many tokens of history go before a follow-up's prompt

    @property
    def longest_prompt(self) -> int:
        return self.history_tokens + len(self.prompt_ids)


@dataclass
class RequestOutcome:
    generated: list[int]
    finish_reason: str
    latency_s: float  # from the start of the run (every request arrives at t=0 offline)
    margins: list[float] = field(default_factory=list)


@dataclass
class PolicyRun:
    policy: str
    wall_s: float
    peak_memory_bytes: int
    outcomes: dict[str, RequestOutcome]
    cycles: list[CycleRecord]
    cores: dict[str, list[int]] | None = None  # pinned runs: the cores each part ran on, as observed
    # the engine's process CPU time (engine alone): on a host whose cores other work shares, throughput per
    # CPU second compares runs that wall time cannot
    cpu_s: float | None = None
    # a group's (rank 0's) collectives over the run, by kind, and the bytes it put into them (engine alone)
    collectives: dict[str, int] | None = None
    collective_bytes: dict[str, int] | None = None
