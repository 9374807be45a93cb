"""The bidirectional stepper with dLLM-Serve's phase multiplexing (phase_plan.py decides the phases).

A cycle whose scheduler sets a refresh quota or a refresh interval runs each row on its own schedule: the
cycle's dual cache is laid out for every row at its start (packing.py's layout, one copy), and at
each step the rows due for a refresh within the quota compute every position they attend, rewriting their
places of the cache, while the others reuse theirs and compute their block only. Both kinds share the
step's one forward (their queries packed together, each row reading its run of the cache after its new
keys are written), so the step makes one attention call per layer and one read, as a plain cycle does;
the step's plan is made on the device and comes to the host with that read, so no step copies anything
to the device. A row due beyond the quota waits the step out. A cycle without either setting is the plain
dual cycle (stepper.py).

A cycle that asks for step-level batching ends at the first step after which a row's block is complete
while others go on; those carry their blocks and caches into the next cycle (phase_carry.py).

Each row's forwards are those it takes alone, in the same order: its tokens are the same whatever the
quota and whatever rows share its steps. The policy's decision must not depend on the step's number
(threshold decoding); seeded draws use each row's own forward count.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from dllm_contracts.run_rules import stagger_problem_for
from engine_pod.decoding.denoise_step import Candidates
from engine_pod.kinds.bidirectional import grammar as hooks
from engine_pod.kinds.bidirectional.cycle_box import CycleBox
from engine_pod.kinds.bidirectional.packing import packed_layout, window_inputs
from engine_pod.kinds.bidirectional.phase_carry import RESUME_COLUMNS, RowCarry
from engine_pod.kinds.bidirectional.phase_plan import PhasePlan, plan_phases
from engine_pod.kinds.bidirectional.phase_sparse import KeptRows, count_refresh_bytes, phase_heads
from engine_pod.kinds.bidirectional.step_rows import StepRows
from engine_pod.kinds.bidirectional.stepper import BidirectionalStepper, _BidirectionalCycle
from engine_pod.runner.contract import CycleOutput
from engine_pod.scheduler.output import SchedulerOutput


class PhaseScheduleError(ValueError):
    """A cycle asks for phase multiplexing where this engine cannot stagger refreshes."""


@dataclass(frozen=True)
class _PhaseLayout:
    """One step's stepping rows: which refresh and which take their block's first forward (on the device,
    and on the host), and the positions each computes."""

    refreshing: torch.Tensor
    first: torch.Tensor
    first_on_host: list[bool]
    lengths: list[int]
    lengths_on_device: torch.Tensor


@dataclass
class _Phases:
    """Each row's refresh schedule: its widths, forwards and waits, and the next step's plan."""

    quota: int | None
    interval: int
    widths: list[int]  # positions a refresh of the row computes
    widths_on_device: torch.Tensor
    forwards: list[int]  # the row's forwards in its block so far (the device's are steps_taken)
    waited: torch.Tensor  # [R] steps each row has waited for its refresh
    owners: list[str]  # the request behind each row
    step_level: bool  # the cycle ends once a row's block is complete while others go on (they carry)
    plan: PhasePlan | None = None  # the next step's, on the device
    refresh: tuple[int, ...] = ()  # the same on the host: the rows that refresh,
    stepping: tuple[int, ...] = ()  # and every row that steps, in row order
    carry_out: bool = False  # the cycle ended with rows going on
    ready: torch.Tensor | None = None  # [R] rows whose block's refresh is in the cache (split_refresh.py)


class PhaseStepper(BidirectionalStepper):
    """The dual-cache stepper, staggering its rows' refreshes where the cycle asks."""

    extra_columns = RESUME_COLUMNS  # each row's resume columns (phase_carry.py)

    @property
    def staggers_refreshes(self) -> bool:
        """Whether it can: the dual cache, and a policy that does not count steps (run_rules.py's rule)."""
        return stagger_problem_for(self.loaded.family, self.decoding) is None

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.carry = RowCarry()  # rows carried out of the last cycle (step-level batching)
        self.kept = KeptRows()  # head-sparse: each request's kept entries (phase_sparse.py)

    def forget(self) -> None:
        super().forget()
        self.carry.forget()
        self.kept.forget()

    @staticmethod
    def _phased(cycle: SchedulerOutput) -> bool:
        """Whether rows run on schedules of their own: a quota, an interval, or a refresh made in pieces."""
        split = any(row.refresh_split[1] for row in cycle.rows)
        return cycle.refresh_quota is not None or cycle.refresh_interval != 0 or split

    def _box(self, cycle: SchedulerOutput, **resume) -> CycleBox:
        """The cycle's box, resumed rows' blocks and counters in its copy."""
        if not self.carry or not self._phased(cycle):
            self.carry.forget()
            return super()._box(cycle)
        blocks, columns = self.carry.columns(list(cycle.request_ids))
        return super()._box(cycle, blocks=blocks, extra=columns)

    def begin(self, cycle: SchedulerOutput) -> _BidirectionalCycle:
        state = super().begin(cycle)
        if not self._phased(cycle):
            return state
        if state.grammar is not None and self.carry:  # a resumed row's grammar: past its block's commits
            blocks = hooks.resumed_blocks(
                self.carry.rows, cycle.request_ids, state.box.block_length, self.mask_id
            )
            state.grammar = self.grammars.rows(cycle.rows, blocks, state.box.tokens.device)
        self._check_stagger(cycle)
        rows, owners = len(cycle.rows), list(cycle.request_ids)
        layout = packed_layout(state.box, None, list(range(rows)))
        layout.keep_in(state.cache)
        widths = list(state.box.host.key_lengths)
        waited = torch.zeros_like(state.steps_taken)
        forwards = [0] * rows
        ready = None
        if state.box.extra is not None:  # rows carried out of the last cycle: counters, cache
            extra = state.box.extra
            ready = extra[:, 0].bool() & (extra[:, 2] > 0) & (extra[:, 3] == 0)  # refreshed in pieces
            waited = self.carry.resume(state, owners, forwards)
        quota, interval = cycle.refresh_quota, cycle.refresh_interval
        state.phases = _Phases(
            quota, interval, widths, layout.row_len, forwards, waited, owners, cycle.step_level, ready=ready
        )
        return state

    def _check_stagger(self, cycle: SchedulerOutput) -> None:
        problem = stagger_problem_for(self.loaded.family, self.decoding)
        if problem is not None:
            raise PhaseScheduleError(problem)
        if not cycle.packed:
            raise PhaseScheduleError("staggered refreshes need the packed layout")
        if cycle.refresh_quota is not None and cycle.refresh_quota < 1:
            raise PhaseScheduleError(f"a refresh quota must be positive, got {cycle.refresh_quota}")

    def most_steps(self, state: _BidirectionalCycle) -> int:
        rows = 1 if state.phases is None else len(state.phases.widths)
        return super().most_steps(state) * rows  # each step moves at least one row on

    @torch.no_grad()
    def going_on(self, state: _BidirectionalCycle, step: int) -> bool:
        """The rows' completion, then the next step's plan, made on the device and read with the rows'
        state in the step's one read."""
        phases = state.phases
        if phases is None:
            return super().going_on(state, step)
        box = state.box
        if step:
            complete = (box.block_tokens() != self.mask_id).all(1)
            capped = complete if self.step_cap is None else complete | (state.steps_taken >= self.step_cap)
            state.done = state.done | capped
        live, counts = ~state.done, (state.steps_taken, phases.waited, phases.widths_on_device)
        plan = plan_phases(live, *counts, phases.interval, phases.quota, self.selection_delay, phases.ready)
        masked = box.block_tokens() == self.mask_id
        stack = torch.stack(
            [state.done.long(), masked.sum(1), masked[:, 0].long(), plan.refresh.long(), plan.reuse.long()]
        )
        state.host, (refresh, reuse) = hooks.read_state(stack, state.grammar)
        phases.plan = plan
        phases.refresh = tuple(r for r, flag in enumerate(refresh) if flag)
        phases.stepping = tuple(r for r, (a, b) in enumerate(zip(refresh, reuse)) if a or b)
        going = not all(state.host.done)
        if going and phases.step_level and any(state.host.done):
            phases.carry_out = True  # a block is complete: the cycle ends, the others carry theirs on
            return False
        return going

    def finish(self, state: _BidirectionalCycle) -> CycleOutput:
        """The committed blocks; where the cycle ended with rows going on, theirs as far as committed (not
        committed: ``carried``), their counters read with them and their cache kept (``self.carry``)."""
        phases = state.phases
        if phases is None or not phases.carry_out:
            self.kept.forget()
            return super().finish(state)
        if state.grammar is not None:  # the host's last commits and the rows they complete, on the device
            hooks.send_grammar(state, [], [])
        output = self.carry.end_at_step(state, phases.forwards, phases.owners, phases.waited)
        if state.grammar is not None:
            hooks.host_blocks(state.grammar, output, self.mask_id)
            self.carry.patch_blocks(phases.owners, output.blocks)
        self.kept.keep_only(set(self.carry.rows))  # head-sparse: the carried rows' kept entries go on
        return output

    @torch.no_grad()
    def step(self, state: _BidirectionalCycle, step: int) -> None:
        phases = state.phases
        if phases is None:
            super().step(state, step)
            return
        plan = phases.plan
        stepping = plan.refresh | plan.reuse
        phases.waited = torch.where(plan.waiting, phases.waited + 1, torch.where(stepping, 0, phases.waited))
        inputs = hooks.before_phase_step(state, self.quirks.commits_block_start_on_refresh)
        rows, layout = self._phase_rows(state, stepping)
        self._phase_step(state, rows, layout, inputs)
        for row in rows.members:
            phases.forwards[row] += 1
        state.steps_taken[rows.index] += 1

    def _phase_rows(
        self, state: _BidirectionalCycle, stepping: torch.Tensor
    ) -> tuple[StepRows, _PhaseLayout]:
        """The stepping rows (in row order), which of them refresh, which take their block's first forward
        and how many positions each computes, on the host and on the device (found there: no copy)."""
        phases, box, host = state.phases, state.box, state.host
        members, refresh = list(phases.stepping), set(phases.refresh)
        lengths = [phases.widths[r] if r in refresh else box.block_length for r in members]
        first = [phases.forwards[r] == 0 for r in members]
        index = torch.argsort((~stepping).to(torch.int8), stable=True)[: len(members)]
        refreshing = phases.plan.refresh[index]
        on_device = torch.where(refreshing, phases.widths_on_device[index], box.block_length)
        block = box.block_tokens(index)
        rows = StepRows(
            index,
            len(members) == len(host.done),
            block,
            block == self.mask_id,
            members,
            [host.masked[r] for r in members],
            [host.first_masked[r] for r in members],
        )
        return rows, _PhaseLayout(refreshing, state.steps_taken[index] == 0, first, lengths, on_device)

    def _phase_step(self, state: _BidirectionalCycle, rows: StepRows, layout: _PhaseLayout, inputs=None):
        box = state.box
        mask, counts = rows.candidates, rows.counts
        if self.quirks.commits_block_start_on_refresh and any(layout.first_on_host):
            # the block's first forward commits only its start: the threshold policy always commits a row's
            # best candidate, here its only one, as the plain cycle's forced commit does
            later = torch.arange(mask.shape[1], device=mask.device) >= 1
            mask = mask & ~(layout.first[:, None] & later[None, :])
            counts = [int(m) if f else c for f, m, c in zip(layout.first_on_host, rows.first_masked, counts)]
        candidates = Candidates.of(mask, rows.index, sum(counts))
        logits = self._mixed_forward(state, rows, layout, candidates, counts, mask.sum(1))
        positions = box.position_ids.gather(1, box.block_slots)[candidates.owner, candidates.k]
        own_step = state.steps_taken[candidates.owner]  # each row's forwards so far: its draws' step
        context = self._context(box, 0, rows, state.masks_at_start)
        grammar = hooks.step_of(inputs)
        step = (positions, own_step, box.sampling, context, state.recorder, grammar)
        commit = self.denoise(logits, candidates, rows.block, *step)
        box.write_block(rows.index, commit.blocks)
        hooks.keep_report(state, grammar, commit)
        state.output.stats.forwards += 1

    def _mixed_forward(self, state, rows: StepRows, layout: _PhaseLayout, candidates, counts, on_device):
        """One forward of the stepping rows: a refreshing row's every attended position, a reusing row's
        block, each row over its run of the cache."""
        box, cache, stats = state.box, state.cache, state.output.stats
        L, width = box.block_length, box.width
        block_slots = box.block_slots[rows.index]
        pick_r, pick_k = candidates.r, candidates.k
        refresh = set(state.phases.refresh)
        if refresh:
            every_column = torch.arange(width, device=block_slots.device).expand(len(rows.members), width)
            refreshing = layout.refreshing
            slots = torch.where(
                refreshing[:, None], every_column, F.pad(block_slots, (0, width - L), value=width)
            )
            column = torch.where(refreshing[pick_r], block_slots[pick_r, pick_k], pick_k)
        else:
            slots, column = block_slots, pick_k
        source = (column - self.quirks.logit_shift).clamp(min=0)
        inputs = window_inputs(
            box,
            cache,
            rows.index,
            slots,
            pick_r,
            source,
            rows.members,
            counts,
            on_device,
            layout.lengths,
            layout.lengths_on_device,
        )
        stats.computed_positions += inputs.computed
        refreshed = sum(state.phases.widths[r] for r in refresh)
        stats.add_refresh(refreshed)
        host = box.host
        stats.useful_positions += sum(
            (host.context_lengths[r] if r in refresh else L) for r in rows.members if host.active[r]
        )
        if self.heads is not None:
            inputs.batch.heads = phase_heads(self, state, rows.members, layout.lengths, counts)
        logits = self.model.forward_batch(inputs.batch, (pick_r, inputs.select))
        count_refresh_bytes(stats, inputs.batch.heads, refreshed, self.position_bytes)
        return logits
