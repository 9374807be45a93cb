"""Where this machine's ranks sit in a tensor- or expert-parallel group: the sizes the flags give, checked
in one line before any rank starts (imports no torch: ``dllm serve`` checks a group without loading it)."""

from __future__ import annotations

from dataclasses import dataclass

from engine_pod.parallel.layout import GroupLayout, layout_problem


@dataclass(frozen=True)
class GroupPlace:
    """A group of ``tensor`` x ``expert`` layout (``parallel/layout.py``: ``size`` ranks) over ``nodes``
    machines, this one ``node`` (its ranks ``first`` to ``first + per_node - 1``), meeting at ``address``
    (node 0's HOST:PORT; None on one machine). Sizes that make no group are refused here, in one line,
    before any rank starts."""

    tensor: int = 1
    nodes: int = 1
    node: int = 0
    address: str | None = None
    expert: int = 1

    def __post_init__(self) -> None:
        problem = layout_problem(self.tensor, self.expert)
        if problem:
            raise ValueError(problem)
        if self.nodes < 1:
            raise ValueError(f"--nodes must be at least 1, got {self.nodes}")
        if self.size % self.nodes:
            raise ValueError(
                f"the group's {self.size} ranks ({self.layout.describe()}) do not split evenly over "
                f"--nodes {self.nodes}"
            )
        if not 0 <= self.node < self.nodes:
            raise ValueError(f"--node-rank {self.node} must be below --nodes {self.nodes}")
        if self.nodes > 1 and not self.address:
            raise ValueError("a group over several nodes needs --group-address (node 0's HOST:PORT)")

    @property
    def layout(self) -> GroupLayout:
        return GroupLayout(self.tensor, self.expert)

    @property
    def size(self) -> int:
        return self.layout.ranks

    @property
    def per_node(self) -> int:
        return self.size // self.nodes

    @property
    def first(self) -> int:
        return self.node * self.per_node
