"""How a group's ranks share a model: ``--tensor-parallel T`` and ``--expert-parallel E``, checked in one line.

The group has ``max(T, E)`` ranks. Tensor parallelism (T above 1) splits attention heads, dense MLP units and
the vocabulary over all of them; with T 1 those parts are repeated on every rank. Expert parallelism (E
above 1) spreads a mixture of experts' routed experts over E sets of ranks, each set holding
``experts / E`` whole experts; where T is above E, each set's experts are split by width over its
``T / E`` ranks (with E 1: every expert over every rank, tensor parallelism inside the experts). So E must
divide T when both are above 1.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GroupLayout:
    tensor: int = 1  # --tensor-parallel: ranks the dense parts are split over (1: repeated on each)
    expert: int = 1  # --expert-parallel: sets of ranks the routed experts are spread over

    def __post_init__(self) -> None:
        problem = layout_problem(self.tensor, self.expert)
        if problem:
            raise ValueError(problem)

    @property
    def ranks(self) -> int:
        return max(self.tensor, self.expert)

    @property
    def dense_split(self) -> bool:
        """Whether attention, dense MLPs and the vocabulary are split over the ranks (else repeated)."""
        return self.tensor > 1

    def describe(self) -> str:
        """The flags, as a user would give them."""
        parts = [f"--tensor-parallel {self.tensor}"] if self.tensor > 1 or self.expert == 1 else []
        return " ".join(parts + ([f"--expert-parallel {self.expert}"] if self.expert > 1 else []))


def layout_problem(tensor: int, expert: int) -> str | None:
    """Why these sizes make no group, in one line (None: they do)."""
    if tensor < 1:
        return f"--tensor-parallel must be at least 1, got {tensor}"
    if expert < 1:
        return f"--expert-parallel must be at least 1, got {expert}"
    if tensor > 1 and tensor % expert:
        return (
            f"--expert-parallel {expert} must divide --tensor-parallel {tensor} (each set of experts is "
            "split over tensor / expert of the group's ranks), or run --expert-parallel alone (attention "
            "and dense layers repeated on each rank)"
        )
    return None
