"""spec.parallelism: how many ranks one engine group has, how the model spreads over them, and over how
many nodes (pods) they spread.

The one home of its defaults and rules (the CRD repeats them: a schema cannot import them). A group has
``max(tensor, expert)`` ranks (the engine's ``--tensor-parallel`` and ``--expert-parallel``: expert sets
divide the tensor ranks where both are above 1) and runs ``ranks / nodes`` of them in each of its ``nodes``
pods; resources.gpus stays GPUs per rank (0 or 1), so a GPU pod requests ``ranks / nodes`` GPUs. One node:
the engine Deployment, each pod a whole group. Several: a LeaderWorkerSet, each group ``nodes`` pods (node
0 leads, the others follow)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SHM_PER_RANK_GI = 1  # the memory-backed /dev/shm of a pod running more than one rank: 1 GiB per rank on it
GROUP_PORT = 29500  # where node 0 of a multi-node group gathers the others (torch.distributed's usual port)
MAX_TENSOR, MAX_EXPERT, MAX_NODES = 64, 64, 16  # the CRD's bounds


@dataclass(frozen=True)
class Parallelism:
    tensor: int = 1  # ranks attention, dense layers and the vocabulary split over (--tensor-parallel)
    nodes: int = 1  # pods of one group, each on its own node
    expert: int = 1  # sets of ranks a mixture of experts' experts spread over (--expert-parallel)

    @property
    def ranks(self) -> int:
        """Ranks (processes, one GPU each on GPUs) of one engine group."""
        return max(self.tensor, self.expert)

    @property
    def ranks_per_pod(self) -> int:
        return self.ranks // self.nodes

    @property
    def multi_node(self) -> bool:
        return self.nodes > 1

    def pod_gpus(self, gpus_per_rank: int) -> int:
        """The GPUs one pod requests."""
        return gpus_per_rank * self.ranks_per_pod

    def shm_size(self) -> str | None:
        """The /dev/shm a pod's ranks share for their collectives; None with a single rank (none needed)."""
        return f"{SHM_PER_RANK_GI * self.ranks_per_pod}Gi" if self.ranks > 1 else None

    def engine_args(self) -> list[str]:
        """The engine's flags for the group (left out at 1: engine images that predate them run as before)."""
        tensor = ["--tensor-parallel", str(self.tensor)] if self.tensor > 1 else []
        return tensor + (["--expert-parallel", str(self.expert)] if self.expert > 1 else [])

    def problems(self) -> list[str]:
        """What the CRD's rules reject, said again (the operator does not trust that admission ran them)."""
        problems = []
        if not 1 <= self.tensor <= MAX_TENSOR:
            problems.append(f"parallelism.tensor must be between 1 and {MAX_TENSOR}, got {self.tensor}")
        if not 1 <= self.expert <= MAX_EXPERT:
            problems.append(f"parallelism.expert must be between 1 and {MAX_EXPERT}, got {self.expert}")
        elif self.tensor > 1 and self.tensor % self.expert:
            problems.append(
                f"parallelism.expert must divide parallelism.tensor (each set of experts is split over tensor "
                f"/ expert ranks), or parallelism.tensor be 1: {self.expert} and {self.tensor}"
            )
        if not 1 <= self.nodes <= MAX_NODES:
            problems.append(f"parallelism.nodes must be between 1 and {MAX_NODES}, got {self.nodes}")
        elif self.ranks % self.nodes:
            problems.append(
                f"parallelism.tensor must be a multiple of parallelism.nodes (each node runs tensor / nodes "
                f"ranks; with expert parallelism alone, expert / nodes): {self.ranks} and {self.nodes}"
            )
        return problems


def parse_parallelism(value: dict[str, Any] | None) -> Parallelism:
    value = value or {}
    return Parallelism(
        tensor=int(value.get("tensor", Parallelism.tensor)),
        nodes=int(value.get("nodes", Parallelism.nodes)),
        expert=int(value.get("expert", Parallelism.expert)),
    )
