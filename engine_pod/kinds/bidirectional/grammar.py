"""The dual-cache steppers' part of structured outputs (kinds/bidirectional/stepper.py, kinds/bidirectional/phase_stepper.py): the
step's grammar copy applied to the box, the host's knowledge of its constrained rows counted into the
step's read, the step's report kept for the next read (decoding/grammar/ holds the rule itself). Each
hook does nothing for a cycle without constrained rows."""

from __future__ import annotations

import torch

from engine_pod.decoding.grammar.rows import ConstrainedRows, GrammarInputs, read_with
from engine_pod.kinds.bidirectional.step_rows import HostState
from engine_pod.runner.contract import CycleOutput


def read_state(stack: torch.Tensor, grammar: ConstrainedRows | None) -> tuple[HostState, list]:
    """The step's one read of ``stack`` (done flags, masked counts, first-masked flags, then any rows the
    caller adds, returned as read; the constrained rows' report with it), then the host's commits of the
    constrained rows counted in: the host knows their blocks better than the device, which has not been
    sent them yet."""
    (done, masked, first, *more), report = read_with(stack, grammar)
    done, first = [bool(d) for d in done], [bool(f) for f in first]
    if grammar is not None:
        grammar.after_read(report)
        for row in grammar.rows:
            block = grammar.block(row)
            done[row] = done[row] or grammar.is_complete(row)
            masked[row], first[row] = block.count(None), block[0] is None
    return HostState(done, masked, first), more


def before_step(state, unfinished: bool, forced_start: bool) -> GrammarInputs | None:
    """The step's grammar copy for a dual cycle's ``state`` (its rows: every one, or the ``unfinished``;
    ``forced_start``: each commits its block's start alone)."""
    if state.grammar is None:
        return None
    host, rows = state.host, range(len(state.host.done))
    members = [r for r in rows if not host.done[r]] if unfinished else list(rows)
    if forced_start:
        counts = [int(not host.done[r] and host.first_masked[r]) for r in members]
    else:
        counts = [0 if host.done[r] else host.masked[r] for r in members]
    return send_grammar(state, members, counts)


def before_phase_step(state, forced_start: bool) -> GrammarInputs | None:
    """The step's grammar copy for a staggered cycle's stepping rows (``forced_start``: a row's first
    forward in its block commits its block's start alone)."""
    if state.grammar is None:
        return None
    phases, host = state.phases, state.host
    counts = [
        int(host.first_masked[r]) if forced_start and phases.forwards[r] == 0 else host.masked[r]
        for r in phases.stepping
    ]
    return send_grammar(state, list(phases.stepping), counts)


def send_grammar(state, members: list[int], counts: list[int]) -> GrammarInputs:
    """The copy for the step's ``members`` (with their candidates' ``counts``): the host's commits written
    into the box, the rows they complete done, before the step's rows are found on the device."""
    grammar, box = state.grammar, state.box
    offsets = [sum(counts[:i]) for i in range(len(members))]
    first = {r: offsets[i] for i, r in enumerate(members) if r in grammar.rows and counts[i]}
    inputs = grammar.send(members, first, box.thresholds)
    if inputs.commits:
        slots = box.block_slots[inputs.commit_rows, inputs.commit_positions]
        box.tokens[inputs.commit_rows, slots] = inputs.commit_tokens
    state.done[inputs.completed] = True
    if state.constrained is None:
        state.constrained = torch.zeros_like(state.done)
        state.constrained[inputs.constrained] = True
    return inputs


def finished(
    complete: torch.Tensor, at_cap: bool, exact: bool, constrained: torch.Tensor | None
) -> torch.Tensor:
    """Rows whose block is complete or whose steps are done (``exact``: a quota schedule's, which ends a
    block at its cap alone); a constrained row's only when complete."""
    capped = torch.full_like(complete, at_cap) if exact else complete | at_cap
    return capped if constrained is None else torch.where(constrained, complete, capped)


def resumed_blocks(carried: dict, owners: list[str], length: int, mask_id: int) -> list[list[int | None]]:
    """Each row's block when a cycle starts (None where not committed): a carried row's as far as it was
    committed (``carried``: kinds/bidirectional/phase_carry.py's rows by request), else a fresh one."""
    return [
        [None if t == mask_id else t for t in carried[owner].block] if owner in carried else [None] * length
        for owner in owners
    ]


def step_of(inputs: GrammarInputs | None):
    return None if inputs is None else inputs.step


def keep_report(state, step, commit) -> None:
    """The step's proposals and confidences, read with the next step's read."""
    if step is not None:
        state.grammar.keep_report(step, commit.proposals, commit.confidence)


def host_blocks(grammar: ConstrainedRows | None, output: CycleOutput, mask_id: int | None = None) -> None:
    """The constrained rows' blocks as the host has them in ``output`` (its last commits were never
    sent; ``mask_id`` where a carried block is not committed yet), and the grammar's cost in its stats."""
    if grammar is None:
        return
    for row in grammar.rows:
        block = grammar.block(row)
        output.blocks[row] = block if mask_id is None else [mask_id if t is None else t for t in block]
    output.stats.add_grammar(grammar.cost)
