"""Running totals of a batch under construction: what admission checks against, kept incrementally so
that trying n candidates costs O(n), not O(n^2) (no torch)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class BatchBox:
    packed: bool = False  # a packed batch costs the sum of its widths, a dense one |A| x the widest
    rows: int = 0
    widest_admission: int = 0  # widest admission width (the budget's measure of a row)
    admission_total: int = 0  # sum of admission widths
    widest_row: int = 0  # widest row width: the dense box the next cycle materialises
    row_total: int = 0  # sum of row widths: the positions that are not padding
    held_blocks: set[int] = field(default_factory=set)  # keys of the whole blocks its rows share

    @property
    def cost(self) -> int:
        return self.admission_total if self.packed else self.rows * self.widest_admission

    def cost_with(self, admission_width: int) -> int:
        """Cost(A) with one more row of ``admission_width``."""
        if self.packed:
            return self.admission_total + admission_width
        return (self.rows + 1) * max(self.widest_admission, admission_width)

    def widest_addition(self, budget: int) -> int:
        """The widest row that one more admission may have within ``budget`` (0: none fits)."""
        if self.packed:
            return max(budget - self.admission_total, 0)
        widest = budget // (self.rows + 1)
        return widest if widest >= self.widest_admission else 0

    def efficiency_with(self, row_width: int) -> float:
        """The share of useful positions with one more row of ``row_width``."""
        if self.packed:
            return 1.0
        widest = max(self.widest_row, row_width)
        return (self.row_total + row_width) / ((self.rows + 1) * widest)

    def add(self, admission_width: int, row_width: int) -> None:
        self.rows += 1
        self.widest_admission = max(self.widest_admission, admission_width)
        self.admission_total += admission_width
        self.widest_row = max(self.widest_row, row_width)
        self.row_total += row_width
