"""The plain dataclass a scheduler hands the runner for one block cycle (no torch)."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine_pod.scheduler.cycle_row import CycleRow


@dataclass
class SchedulerOutput:
    request_ids: list[str]  # the request behind each row, in row order
    rows: list[CycleRow]  # what each row materialises in this block cycle
    gather_rows: bool  # rows whose block is complete leave the forwards (BlockServe) or stay (static)
    box_width: int  # widest row, block included: a dense batch is len(rows) x box_width
    admitted: list[str] = field(default_factory=list)  # requests that joined at this block boundary
    preempted: list[str] = field(default_factory=list)  # requests sent back to the queue at it
    # requests whose rows left the batch since the last cycle (finished, cancelled, preempted): a runner
    # that keeps per-request state across cycles frees theirs
    released: list[str] = field(default_factory=list)
    packed: bool = False  # run packed (rows concatenated, no padding) rather than as a dense box
    row_total: int = 0  # the rows' widths summed, blocks included: what a packed batch holds
    # dLLM-Serve's phase multiplexing (kinds/bidirectional/phase_plan.py): the most positions one step refreshes
    # (None: every row refreshes at its block's first forward, all at once) and each row's refresh interval
    refresh_quota: int | None = None
    refresh_interval: int = 0
    # dLLM-Serve's step-level batching: the cycle may end at a step after which some row's block is complete
    # while others go on; those carry their blocks into the next cycle, which new rows may join
    step_level: bool = False

    @classmethod
    def of_rows(cls, rows: list[CycleRow], gather_rows: bool = True, packed: bool = False) -> SchedulerOutput:
        """A cycle over ``rows`` outside any scheduler (a profile's shape, a warm-up): each row's owner, or
        its place, names it."""
        ids = [row.owner or f"row-{i}" for i, row in enumerate(rows)]
        return cls(ids, list(rows), gather_rows, box_width=0, packed=packed)

    @property
    def cost(self) -> int:
        """Cost(A): the tokens the batch materialises (packed: every row's width; dense: the box)."""
        if self.packed:
            return self.row_total
        return len(self.rows) * self.box_width

    @property
    def is_empty(self) -> bool:
        return not self.rows
