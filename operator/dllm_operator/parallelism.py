"""spec.parallelism: how many ranks one engine group has and over how many nodes (pods) they spread.

The one home of its defaults and rules (the CRD repeats them: a schema cannot import them). A group of
``tensor`` ranks runs ``tensor / nodes`` ranks in each of its ``nodes`` pods; resources.gpus stays GPUs per
rank (0 or 1), so a GPU pod requests ``tensor / nodes`` GPUs. One node: the engine Deployment, each pod a
whole group. Several: a LeaderWorkerSet, each group ``nodes`` pods (node 0 leads, the others follow)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SHM_PER_RANK_GI = 1  # the memory-backed /dev/shm of a pod running more than one rank: 1 GiB per rank on it
GROUP_PORT = 29500  # where node 0 of a multi-node group gathers the others (torch.distributed's usual port)
MAX_TENSOR, MAX_NODES = 64, 16  # the CRD's bounds


@dataclass(frozen=True)
class Parallelism:
    tensor: int = 1  # ranks of one engine group (the engine's --tensor-parallel)
    nodes: int = 1  # pods of one group, each on its own node

    @property
    def ranks_per_pod(self) -> int:
        return self.tensor // self.nodes

    @property
    def multi_node(self) -> bool:
        return self.nodes > 1

    def pod_gpus(self, gpus_per_rank: int) -> int:
        """The GPUs one pod requests."""
        return gpus_per_rank * self.ranks_per_pod

    def shm_size(self) -> str | None:
        """The /dev/shm a pod's ranks share for their collectives; None with a single rank (none needed)."""
        return f"{SHM_PER_RANK_GI * self.ranks_per_pod}Gi" if self.tensor > 1 else None

    def problems(self) -> list[str]:
        """What the CRD's rules reject, said again (the operator does not trust that admission ran them)."""
        problems = []
        if not 1 <= self.tensor <= MAX_TENSOR:
            problems.append(f"parallelism.tensor must be between 1 and {MAX_TENSOR}, got {self.tensor}")
        if not 1 <= self.nodes <= MAX_NODES:
            problems.append(f"parallelism.nodes must be between 1 and {MAX_NODES}, got {self.nodes}")
        elif self.tensor % self.nodes:
            problems.append(
                f"parallelism.tensor must be a multiple of parallelism.nodes (each node runs tensor / nodes "
                f"ranks): {self.tensor} and {self.nodes}"
            )
        return problems


def parse_parallelism(value: dict[str, Any] | None) -> Parallelism:
    value = value or {}
    return Parallelism(
        tensor=int(value.get("tensor", Parallelism.tensor)), nodes=int(value.get("nodes", Parallelism.nodes))
    )
