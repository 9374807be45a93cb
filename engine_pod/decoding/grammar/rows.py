"""A cycle's constrained rows on the host, and what they exchange with the device each step.

Per step: the grammar's bitmask at every stepping constrained row's frontier is computed on the host,
all rows together (``GrammarCompiler.fill_masks``), and goes to the device in one copy with the commits
the host made after the last read (``send``); the step's report comes back with the stepper's one read
(``read_with``), and the host advances each row's grammar over it (``after_read``). A stepper applies the
commits and the rows they complete to its own blocks (``GrammarInputs``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from engine_pod.decoding.grammar.commit_rule import GrammarRow
from engine_pod.decoding.grammar.compiler import GrammarCompiler
from engine_pod.decoding.grammar.device import GrammarStep
from engine_pod.device_buffers import DeviceBuffers


@dataclass
class GrammarInputs:
    """One step's copy, on the device: the host's commits since the last read, the rows they complete,
    and the stepping constrained rows' masks (``step``)."""

    commit_rows: torch.Tensor  # [m] each commit's row in the cycle
    commit_positions: torch.Tensor  # [m] its position in the row's block
    commit_tokens: torch.Tensor  # [m]
    completed: torch.Tensor  # rows whose block the host's commits complete
    constrained: torch.Tensor  # every constrained row of the cycle (in its first step's copy; else empty)
    step: GrammarStep
    commits: int  # m, on the host


@dataclass
class GrammarCost:
    """What the grammar asked of the host in a cycle."""

    mask_seconds: float = 0.0
    advance_seconds: float = 0.0
    masks: int = 0  # bitmasks computed
    host_commits: int = 0  # tokens committed by the host's walk (beyond the frontiers)


@dataclass
class ConstrainedRows:
    """The cycle's constrained rows (by their row in the cycle) and their grammar's host state."""

    compiler: GrammarCompiler
    rows: dict[int, GrammarRow]
    device: torch.device
    buffers: DeviceBuffers | None = None
    reported: list[int] = field(default_factory=list)  # rows in the last step's report, in its order
    report: torch.Tensor | None = None  # [c, 2L] that report, read with the next read
    pending: list[tuple[int, int, int]] = field(default_factory=list)  # (row, position, token) not sent yet
    completed: list[int] = field(default_factory=list)  # rows completed by the host, not yet told
    cost: GrammarCost = field(default_factory=GrammarCost)
    told: bool = False  # the device was told which rows are constrained (with the first step's copy)

    def __post_init__(self) -> None:
        if self.buffers is None:
            self.buffers = DeviceBuffers(self.device)

    def is_complete(self, row: int) -> bool:
        return self.rows[row].complete

    def block(self, row: int) -> list[int | None]:
        return self.rows[row].block

    def after_read(self, values: list[int] | None) -> dict[int, int]:
        """Advance every reported row over its step (``values``: the report, flattened, as read); returns
        the tokens the host committed per row (its frontier included)."""
        added: dict[int, int] = {}
        if not self.reported:
            return added
        width = len(values) // len(self.reported)
        L = width // 2
        for place, row in enumerate(self.reported):
            part = values[place * width : (place + 1) * width]
            frontier = self.rows[row].frontier
            added[row] = self.advance(row, part[frontier], part[:L], [bool(c) for c in part[L:]])
        self.reported, self.report = [], None
        return added

    def advance(self, row: int, frontier_token: int, proposals: list[int], confident: list[bool]) -> int:
        """One row's step on the host (commit_rule.py): the tokens it committed, its frontier's included."""
        started = time.perf_counter()
        grammar_row = self.rows[row]
        commits = grammar_row.commit(frontier_token, proposals, confident)
        self.pending += [(row, k, token) for k, token in commits]
        self.cost.host_commits += len(commits)
        if grammar_row.complete:
            self.completed.append(row)
        self.cost.advance_seconds += time.perf_counter() - started
        return 1 + len(commits)

    def send(
        self, stepping: list[int], first_candidates: dict[int, int], thresholds: torch.Tensor
    ) -> GrammarInputs:
        """The step's one copy: pending commits, completed rows, and for each constrained row among
        ``stepping`` (the step's rows, in order) that has candidates, its mask at its frontier and its
        frontier's index among the step's candidates (``first_candidates``, by row); ``thresholds`` [R]:
        every row's, on the device."""
        places = [place for place, row in enumerate(stepping) if row in first_candidates]
        members = [stepping[place] for place in places]
        words = self.compiler.words
        masks = self._masks(members)
        pending, self.pending = self.pending, []
        completed, self.completed = self.completed, []
        sent = self.buffers.send(
            {
                "commit_rows": [row for row, _, _ in pending],
                "commit_positions": [k for _, k, _ in pending],
                "commit_tokens": [token for _, _, token in pending],
                "completed": completed,
                "constrained": [] if self.told else sorted(self.rows),
                "places": places,
                "cycle_rows": members,
                "frontier": [self.rows[row].frontier for row in members],
                "first_candidate": [first_candidates[row] for row in members],
                "masks": masks.view(np.int64).ravel(),
            }
        )
        if members:
            allowed = sent["masks"].view(torch.int32).view(len(members), -1)[:, :words]
        else:
            allowed = torch.zeros((0, words), dtype=torch.int32, device=self.device)
        step = GrammarStep(
            places=sent["places"],
            frontier=sent["frontier"],
            first_candidate=sent["first_candidate"],
            words=allowed,
            threshold=thresholds[sent["cycle_rows"]],
            vocab=self.compiler.vocab_size,
            count=len(members),
        )
        self.reported, self.told = members, True
        return GrammarInputs(
            sent["commit_rows"],
            sent["commit_positions"],
            sent["commit_tokens"],
            sent["completed"],
            sent["constrained"],
            step,
            len(pending),
        )

    def send_blocks(
        self, members: list[int], places: list[int]
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """A canvas step's one copy (kinds/canvas/grammar.py): for each of ``members`` (at ``places`` among
        the running rows) its block as the host knows it (-1: not committed), its frontier, whether it is
        complete, and its mask at its frontier."""
        open_rows = [row for row in members if not self.rows[row].complete]
        masks = self._masks(open_rows)
        if len(open_rows) < len(members):  # a complete row's mask: nothing (it stops at this step)
            full = np.zeros((len(members), masks.shape[1]), dtype=np.int32)
            full[[members.index(row) for row in open_rows]] = masks
            masks = full
        blocks = [(-1 if t is None else t) for row in members for t in self.rows[row].block]
        self.pending, self.completed = [], []  # a canvas row's blocks travel whole
        sent = self.buffers.send(
            {
                "places": places,
                "blocks": blocks,
                "frontier": [self.rows[row].frontier % len(self.rows[row].block) for row in members],
                "complete": [int(self.rows[row].complete) for row in members],
                "masks": masks.view(np.int64).ravel(),
            }
        )
        self.reported = [row for row in members if not self.rows[row].complete]
        words = self.compiler.words
        shaped = sent["masks"].view(torch.int32).view(len(members), -1)[:, :words] if members else None
        if shaped is None:
            shaped = torch.zeros((0, words), dtype=torch.int32, device=self.device)
        sent["blocks"] = sent["blocks"].view(len(members), -1) if members else sent["blocks"].view(0, 1)
        return sent, shaped

    def _masks(self, rows: list[int]) -> np.ndarray:
        """The rows' bitmasks at their frontiers [n, words rounded up to whole int64s]."""
        words = self.compiler.words
        started = time.perf_counter()
        masks = np.zeros((len(rows), words + words % 2), dtype=np.int32)
        self.compiler.fill_masks([self.rows[row].matcher for row in rows], masks)
        self.cost.mask_seconds += time.perf_counter() - started
        self.cost.masks += len(rows)
        return masks

    def keep_report(self, step: GrammarStep, proposals: torch.Tensor, confidence: torch.Tensor) -> None:
        """The step's report, read with the next read."""
        self.report = step.report(proposals, confidence) if step.count else None
        if not step.count:
            self.reported = []


def read_with(state: torch.Tensor, grammar: ConstrainedRows | None) -> tuple[list, list[int] | None]:
    """``state.tolist()`` and the constrained rows' report, in one read of the device."""
    report = None if grammar is None else grammar.report
    if report is None:
        return state.tolist(), None
    flat = torch.cat([state.reshape(-1).long(), report.reshape(-1)]).tolist()
    split = state.numel()
    return _unflatten(flat[:split], state.shape), flat[split:]


def _unflatten(values: list, shape: torch.Size) -> list:
    """``values`` in the nested lists of ``shape`` (as ``tolist`` gives them)."""
    if len(shape) <= 1:
        return values
    size = len(values) // shape[0]
    return [_unflatten(values[i * size : (i + 1) * size], shape[1:]) for i in range(shape[0])]
