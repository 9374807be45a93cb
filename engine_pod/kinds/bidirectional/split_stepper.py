"""The phase stepper with long rows' refreshes split across cycles (split_refresh.py computes the pieces,
scheduler/split_refresh.py decides them): a cycle's piece rows compute their next piece and decode nothing,
beside the rows that decode; a row whose pieces are all in is carried into the next cycle, whose first
forward reuses the cache they wrote."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from engine_pod.kinds.bidirectional.phase_stepper import PhaseStepper
from engine_pod.kinds.bidirectional.split_refresh import RefreshPieces, is_piece
from engine_pod.kinds.bidirectional.stepper import _BidirectionalCycle
from engine_pod.runner.contract import CycleOutput, CycleStats
from engine_pod.scheduler.output import SchedulerOutput


@dataclass
class _Pieces:
    """A cycle's rows that computed a piece of their refresh and decode nothing: where they were among the
    scheduler's rows; ``output``: the cycle's, where no other row steps."""

    rows: list[int]
    total: int
    output: CycleOutput | None = None


class SplitRefreshStepper(PhaseStepper):
    """The bidirectional kind's stepper: dLLM-Serve's phases, and long rows' refreshes in pieces."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.pieces = RefreshPieces(self)  # long rows' refreshes split across cycles

    @property
    def refresh_layers(self) -> int:
        """Layers a row's refresh may be split over across cycles: the model's, where refreshes can be
        staggered over a dense dual cache in the pool and a block's first token is read at its own position
        (LLaDA; Dream reads it at the position before the block, which only its refresh computes); 0: every
        refresh is computed whole."""
        splits = self.heads is None and self.cache_pool is not None and self.staggers_refreshes
        splits = splits and not self.quirks.logit_shift
        return self.loaded.config.num_layers if splits else 0

    def forget(self) -> None:
        super().forget()
        self.pieces.forget()

    def begin(self, cycle: SchedulerOutput) -> _BidirectionalCycle | _Pieces:
        """The cycle laid out; its piece rows' pieces computed, the others' cycle begun (a row whose pieces
        are in carried into it)."""
        for owner in cycle.released:
            self.pieces.drop(owner)
        pieces = _Pieces([r for r, row in enumerate(cycle.rows) if is_piece(row)], len(cycle.rows))
        stats = CycleStats()
        if len(pieces.rows) == pieces.total:  # nothing decodes: the pieces are the cycle
            for row in cycle.rows:
                self.pieces.compute(row, stats)
            L = self.decoding.block_length
            blocks = [[self.mask_id] * L for _ in cycle.rows]
            pieces.output = CycleOutput(blocks, [0] * pieces.total, stats, carried=[True] * pieces.total)
            return pieces
        if pieces.rows:
            kept = [r for r in range(pieces.total) if r not in set(pieces.rows)]
            rows, ids = [cycle.rows[r] for r in kept], [cycle.request_ids[r] for r in kept]
            decoding = replace(cycle, rows=rows, request_ids=ids)
        else:
            decoding = cycle
        runs = self._adopt_refreshes(decoding)
        state = super().begin(decoding)
        for run in runs:
            run.release()  # the carry copied its entries into the cycle's run
        began = time.perf_counter()
        for r in pieces.rows:
            self.pieces.compute(cycle.rows[r], state.output.stats)
        if pieces.rows:  # the decoding rows waited for the pieces
            state.output.stats.chunk_wait_s += time.perf_counter() - began
        state.pieces = pieces if pieces.rows else None
        return state

    def _adopt_refreshes(self, cycle: SchedulerOutput) -> list:
        """Rows whose refresh pieces are all in, carried into the cycle (a row carried out of the last one
        goes on as it was); the runs their entries are in."""
        runs = []
        for owner, row in zip(cycle.request_ids, cycle.rows):
            done, pieces = row.refresh_split
            if pieces and done == pieces and owner not in self.carry.rows:
                carried, run = self.pieces.carried(owner)
                self.carry.adopt(owner, carried, run.pool)
                runs.append(run)
        return runs

    def most_steps(self, state: _BidirectionalCycle | _Pieces) -> int:
        return 0 if isinstance(state, _Pieces) else super().most_steps(state)

    def going_on(self, state: _BidirectionalCycle | _Pieces, step: int) -> bool:
        """A cycle of pieces only takes no step; any other, as the phase stepper's."""
        return False if isinstance(state, _Pieces) else super().going_on(state, step)

    def finish(self, state: _BidirectionalCycle | _Pieces) -> CycleOutput:
        """The phase stepper's output, with each piece row's block going on (``carried``)."""
        if isinstance(state, _Pieces):
            return state.output
        output = super().finish(state)
        return output if state.pieces is None else _with_pieces(output, state.pieces, self.mask_id)

    def end(self, state: _BidirectionalCycle | _Pieces) -> None:
        if not isinstance(state, _Pieces):
            super().end(state)


def _with_pieces(output: CycleOutput, pieces: _Pieces, mask_id: int) -> CycleOutput:
    """``output`` (of the rows that decoded) over all the scheduler's rows: each piece row's block masked
    and going on (``carried``), its steps 0."""
    L = len(output.blocks[0])
    at = {r: i for i, r in enumerate(r for r in range(pieces.total) if r not in set(pieces.rows))}

    def spread(values: list, filler) -> list:
        return [values[at[r]] if r in at else filler() for r in range(pieces.total)]

    carried = output.carried or [False] * len(output.blocks)
    output.blocks = spread(output.blocks, lambda: [mask_id] * L)
    output.steps = spread(output.steps, lambda: 0)
    output.carried = [r not in at or carried[at[r]] for r in range(pieces.total)]
    if output.margins is not None:
        output.margins = spread(output.margins, lambda: [float("inf")] * L)
    if output.logprobs is not None:
        output.logprobs = spread(output.logprobs, lambda: None)
    return output
