"""A long row's dual-cache refresh computed a few layers per cycle (scheduler/split_refresh.py decides).

A piece row (``CycleRow.refresh_split`` (done, pieces), done < pieces) is laid out alone, as a refresh of
that row would lay it out (packing.py: its attended positions in order), in a run of the runner's pool of
its own, held between cycles; each piece runs the model's next layers over every position, writing their
keys and values into that run, and keeps the states leaving the last of them for the next piece. The last
piece's last layer writes its keys and values only (its outputs would be the block's logits, which the
decoding cycle computes). The row then decodes its block in the next cycle as a row carried into it
(phase_carry.py) whose cache is in: its first forward reuses the cache (the block over the keys the pieces
computed, which is what a refresh computes for the block), every later one as it would have. Its tokens are
those it gets with its refresh computed whole.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine_pod.kinds.bidirectional.cycle_box import CycleBox, build_box
from engine_pod.kinds.bidirectional.cycle_cache import CycleCache
from engine_pod.kinds.bidirectional.packing import PackedInputs, refresh_inputs
from engine_pod.kinds.bidirectional.phase_carry import CarriedRow
from engine_pod.runner.contract import CycleStats
from engine_pod.scheduler.cycle_row import CycleRow

OWNER_PREFIX = "split-refresh:"  # its run's owner in the pool: this and the request


def is_piece(row: CycleRow) -> bool:
    """Whether the row computes a piece of its refresh this cycle (and decodes nothing)."""
    done, pieces = row.refresh_split
    return done < pieces


@dataclass
class _Refresh:
    """One row's refresh so far."""

    box: CycleBox
    cache: CycleCache
    inputs: PackedInputs
    pieces: int
    done: int = 0
    hidden: torch.Tensor | None = None  # the states leaving the layers computed so far


class RefreshPieces:
    """The split refreshes under way, by request; a stepper's (split_stepper.py)."""

    def __init__(self, stepper) -> None:
        self.stepper = stepper
        self.rows: dict[str, _Refresh] = {}

    def compute(self, row: CycleRow, stats: CycleStats) -> None:
        """The row's next piece: the layers it names of the model's, over every position of the row."""
        done, pieces = row.refresh_split
        refresh = self.rows.get(row.owner) if done else self._start(row, pieces)
        if refresh is None or refresh.done != done or refresh.pieces != pieces:
            raise RuntimeError(
                f"request {row.owner}'s refresh is not at piece {done} of {pieces}; this is a bug"
            )
        layers = self.stepper.loaded.config.num_layers
        start, end = done * layers // pieces, (done + 1) * layers // pieces
        with torch.no_grad():
            refresh.hidden = self.stepper.model.forward_layers(
                refresh.inputs.batch, refresh.hidden, start, end, refresh.inputs.select
            )
        refresh.done += 1
        # counted as a prefill chunk of the positions times its share of the layers (no forward of the
        # cycle's refreshes it: its positions are not in the cycle's refresh counts)
        share = refresh.cache.row_len[0] * (end - start) // layers
        stats.computed_positions += share
        stats.prefill_chunks += 1
        stats.prefill_chunk_tokens += share
        if refresh.done == pieces:
            refresh.hidden = None

    def _start(self, row: CycleRow, pieces: int) -> _Refresh:
        """The row laid out alone in a run of its own, its first piece to come."""
        self.drop(row.owner)
        stepper, L = self.stepper, self.stepper.decoding.block_length
        args = (stepper.mask_id, stepper.pad_id, stepper.loaded.device, stepper.decoding.threshold)
        box = build_box([row], L, *args, stepper.score_dtype)
        box.packed = True
        cache = CycleCache(stepper.cache_pool, owner=OWNER_PREFIX + row.owner)
        device = box.tokens.device
        first = torch.zeros(1, dtype=torch.long, device=device)
        one = torch.ones(1, dtype=torch.long, device=device)
        inputs = refresh_inputs(box, None, cache, first, box.block_slots[:, 0], [0], [1], one)
        refresh = self.rows[row.owner] = _Refresh(box, cache, inputs, pieces)
        return refresh

    def carried(self, owner: str) -> tuple[CarriedRow, CycleCache]:
        """The row of ``owner``, its refresh complete, as a row carried into its decoding cycle (a fresh
        block, no forward yet, its cache in), and the run its entries are in (given back once copied)."""
        refresh = self.rows.pop(owner, None)
        if refresh is None or refresh.done != refresh.pieces:
            raise RuntimeError(f"request {owner}'s refresh is not complete; this is a bug")
        cache, L = refresh.cache, self.stepper.decoding.block_length
        block = [self.stepper.mask_id] * L
        return CarriedRow(block, 0, 0, L, None, cache.base + cache.row_start[0], cache.row_len[0]), cache

    def drop(self, owner: str) -> None:
        """Let go of ``owner``'s refresh (its row left the batch, or starts again)."""
        refresh = self.rows.pop(owner, None)
        if refresh is not None:
            refresh.cache.release()

    def forget(self) -> None:
        for owner in list(self.rows):
            self.drop(owner)
