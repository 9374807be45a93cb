"""dLLM-Serve's step-level batching: rows whose block is not complete when a cycle ends carry it into the
next cycle, which new requests (and rows starting their next block) join.

A cycle that allows it (``SchedulerOutput.step_level``) ends at the first step after which some row's block
is complete while others go on. Each row that goes on leaves with what its next forwards need, kept by the
stepper under the row's request:
- on the host, from the cycle's final read: its block as far as it was committed, its forwards in the block,
  the steps it waited for a refresh, the masks its block started with, the log probabilities recorded;
- in the pool, its dual-cache entries (every layer's keys and values) where the cycle's run has them: the
  pages that hold them stay held (one reference each) when the run is given back, the others are free.

The next cycle's rows are laid out as usual (its one copy carries each resumed row's block, counters and
the first slot of its entries), its run is reserved beside the held pages (the pool grows where it has no
room for both), and the carried entries are copied into the new run, then their pages let go: a resumed
row's reuse forwards read the keys and values they would have read had the cycle gone on, so its tokens
are those it gets alone. Nothing here copies anything to the device (the places are derived there), and
nothing is copied out of the pool.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine_pod.models.paged_kv import PagedKVPool

# per row in the box's copy: resumed, its entries' place, their count, forwards, waits, masks at start
RESUME_COLUMNS = 6


@dataclass
class CarriedRow:
    """What a row takes from one cycle to the next, on the host."""

    block: list[int]  # its active block as far as it was committed (mask id where not)
    forwards: int  # its forwards in the block so far
    waited: int  # steps it has waited for a refresh
    masks_at_start: int  # masked positions its block started with
    logprobs: list | None  # the log probabilities recorded in the block so far (where asked)
    kv_at: int  # its entries' first slot in the pool (their pages held by the carry)
    kv_len: int  # its entries (its dual cache's positions; 0: it has not refreshed in this block)


class RowCarry:
    """The rows carried out of the last cycle (by request), and the pool's pages their entries are in."""

    def __init__(self) -> None:
        self.rows: dict[str, CarriedRow] = {}
        self.pool: PagedKVPool | None = None
        self.pages: list[int] = []  # held: one reference each

    def __len__(self) -> int:
        return len(self.rows)

    def forget(self) -> None:
        """Let go of the rows and their pages."""
        for page in self.pages:
            self.pool.drop(page)
        self.rows, self.pool, self.pages = {}, None, []

    def keep(self, owners: list[str], rows: list[CarriedRow], pool: PagedKVPool | None) -> None:
        """``rows`` (of requests ``owners``) go on: the pages under their entries stay held (no pool: the
        head-sparse cache's stores hold their entries, phase_sparse.py)."""
        self.forget()
        pages = [] if pool is None else sorted({p for row in rows for p in _pages(row, pool.page_size)})
        for page in pages:
            pool.retain(page)
        self.rows, self.pool, self.pages = dict(zip(owners, rows)), pool, pages

    def adopt(self, owner: str, row: CarriedRow, pool: PagedKVPool) -> None:
        """Carry ``row`` (of request ``owner``) into the next cycle beside those carried already: its entries'
        pages held here too (a split refresh's run, split_refresh.py, which its owner gives back)."""
        if self.pool is not None and pool is not self.pool:
            raise RuntimeError("a row's entries are in another pool than the carried rows'; this is a bug")
        for page in _pages(row, pool.page_size):
            pool.retain(page)
            self.pages.append(page)
        self.rows[owner], self.pool = row, pool

    def columns(self, owners: list[str]) -> tuple[list[list[int] | None], list[list[int]]]:
        """For a cycle's rows (by request): each resumed row's block (None: a fresh block) and the
        ``RESUME_COLUMNS`` integers the box's copy sends for every row."""
        blocks, columns = [], []
        for owner in owners:
            row = self.rows.get(owner)
            if row is None:
                blocks.append(None)
                columns.append([0] * RESUME_COLUMNS)
            else:
                blocks.append(row.block)
                columns.append([1, row.kv_at, row.kv_len, row.forwards, row.waited, row.masks_at_start])
        return blocks, columns

    def resume(self, state, owners: list[str], forwards: list[int]) -> torch.Tensor:
        """Set the cycle's resumed rows (those carried out of the last one) where they were: their block's
        counters on the device (from the box's copy), ``forwards`` on the host, their log probabilities so
        far and their cache (scattered into the cycle's run, laid out); returns each row's waits for a
        refresh. Everything carried is let go of."""
        resume, cache = state.box.extra, state.cache
        resumed = resume[:, 0].bool()
        state.steps_taken = torch.where(resumed, resume[:, 3], state.steps_taken)
        state.masks_at_start = torch.where(resumed, resume[:, 5], state.masks_at_start)
        count = total = 0
        for r, owner in enumerate(owners):
            carried = self.rows.get(owner)
            if carried is None:
                continue
            if carried.kv_len not in (0, cache.row_len[r]):
                raise RuntimeError(
                    f"a carried row's cache has {carried.kv_len} entries, its new run {cache.row_len[r]}"
                )
            forwards[r] = carried.forwards
            if state.output.logprobs is not None and carried.logprobs is not None:
                state.output.logprobs[r] = carried.logprobs
            count, total = count + 1, total + carried.kv_len
        if total:
            self._scatter(resume, count, total, cache)
        self.forget()
        return torch.where(resumed, resume[:, 4], 0)

    def end_at_step(self, state, forwards: list[int], owners: list[str], waited: torch.Tensor):
        """The output of a cycle that ended with rows going on (``state.host.done`` False): every row's block
        as far as committed, those going on marked ``carried``; their counters come to the host with the
        blocks (the cycle's final read) and their cache entries are kept here."""
        box, output, cache, L = state.box, state.output, state.cache, state.box.block_length
        counters = torch.stack([state.steps_taken, waited, state.masks_at_start], 1)
        read = torch.cat([box.block_tokens(), counters], 1).tolist()  # the cycle's final read
        output.blocks, output.steps = [r[:L] for r in read], [r[L] for r in read]
        if state.recorder is not None:
            state.recorder.finish()
        output.carried = [not done for done in state.host.done]
        going = [r for r, carried in enumerate(output.carried) if carried]
        rows = []
        for r in going:
            kept = output.logprobs[r] if output.logprobs is not None else None
            # a row yet to refresh has no cache to keep; a head-sparse one keeps its own (no dense run)
            length = cache.row_len[r] if forwards[r] and cache.pool is not None else 0
            at = cache.base + cache.row_start[r]
            rows.append(
                CarriedRow(read[r][:L], forwards[r], read[r][L + 1], read[r][L + 2], kept, at, length)
            )
        self.keep([owners[r] for r in going], rows, cache.pool)
        return output

    def patch_blocks(self, owners: list[str], blocks: list[list[int]]) -> None:
        """The carried rows' blocks as ``blocks`` (by row) has them: a constrained row's host commits."""
        for owner, block in zip(owners, blocks):
            if owner in self.rows:
                self.rows[owner].block = list(block)

    def _scatter(self, extra: torch.Tensor, resumed: int, total: int, cache) -> None:
        """The carried entries (``total``) of the cycle's ``resumed`` rows copied from their held pages into
        its dual cache's run (the same pool), placed by ``extra`` (the box's resume columns
        [R, RESUME_COLUMNS] on the device)."""
        if cache.pool is not self.pool:
            raise RuntimeError(
                "a carried row's entries are in another pool than its next cycle's; this is a bug"
            )
        index = torch.nonzero_static(extra[:, 0], size=resumed)[:, 0]
        source = spans(extra[index, 1], extra[index, 2], total)
        target = spans(cache.row_start_on_device[index] + cache.base, extra[index, 2], total)
        for stored in (*cache.pool.keys, *cache.pool.values):
            stored.index_copy_(0, target, stored.index_select(0, source))


def _pages(row: CarriedRow, page_size: int) -> range:
    """The pool's pages under a carried row's entries."""
    if not row.kv_len:
        return range(0)
    return range(row.kv_at // page_size, -(-(row.kv_at + row.kv_len) // page_size))


def spans(starts: torch.Tensor, lengths: torch.Tensor, total: int) -> torch.Tensor:
    """The places ``starts[i] .. starts[i] + lengths[i]``, one run after another (``total`` in all, known to
    the host: no read)."""
    owner = torch.repeat_interleave(
        torch.arange(starts.shape[0], device=starts.device), lengths, output_size=total
    )
    before = lengths.cumsum(0) - lengths
    return starts[owner] + torch.arange(total, device=starts.device) - before[owner]
