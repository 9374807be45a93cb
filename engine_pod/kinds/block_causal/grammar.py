"""The paged (block-diffusion) stepper's part of structured outputs (kinds/block_causal/stepper.py): a cycle's
constrained rows, the host's commits counted into each step's read and sent with the next step, and the
blocks as the host has them at the cycle's end (decoding/grammar/ holds the rule itself). Each hook does
nothing for a cycle without constrained rows."""

from __future__ import annotations

from engine_pod.decoding.grammar.rows import GrammarInputs, read_with


def constrained_rows(stepper, rows, states, starts: list[int]):
    """The cycle's constrained rows (None: none), each block's fixed head (the prompt's tail) committed."""
    block_length = stepper.decoding.block_length
    heads = [len(state.tokens) % block_length for state in states]
    blocks = [
        state.tokens[start:] + [None] * (block_length - head)
        for state, start, head in zip(states, starts, heads)
    ]
    return stepper.grammars.rows(rows, blocks, stepper.pool.device, heads)


def most_steps(stepper, states, grammar) -> int:
    """A cycle's most steps: its rows' (the engine's where a row has none of its own); with constrained
    rows at least a block's length and one (a token a step at least, and the read of the last)."""
    steps = max(state.steps or stepper.decoding.steps_per_block for state in states)
    return steps if grammar is None else max(steps, stepper.decoding.block_length + 1)


def read_counts(state) -> list[int]:
    """The step's one read: each row's masks left (the constrained rows' report with it, their host
    commits counted in: not sent yet)."""
    counts, report = read_with(state.masked, state.grammar)
    if state.grammar is not None:
        state.grammar.after_read(report)
        for row in state.grammar.rows:
            counts[row] = state.grammar.block(row).count(None)
    return counts


def before_step(state, mask_id: int) -> GrammarInputs | None:
    """The step's grammar copy: the host's commits written into the blocks (their masks counted again on
    the device: the host counted them already), the stepping constrained rows' masks."""
    grammar = state.grammar
    if grammar is None:
        return None
    cycle, counts = state.layout, state.counts
    live = [i for i, count in enumerate(counts) if count] if state.gather_rows else list(range(len(counts)))
    offsets = [sum(counts[i] for i in live[:place]) for place in range(len(live))]
    first = {i: offsets[place] for place, i in enumerate(live) if i in grammar.rows and counts[i]}
    inputs = grammar.send(live, first, cycle.thresholds)
    if inputs.commits:
        cycle.blocks[inputs.commit_rows, inputs.commit_positions] = inputs.commit_tokens
        state.masked = (cycle.blocks == mask_id).sum(1)
    return inputs


def keep_report(state, inputs: GrammarInputs | None, commit) -> None:
    """The step's proposals and confidences, read with the next step's read."""
    if inputs is not None:
        state.grammar.keep_report(inputs.step, commit.proposals, commit.confidence)


def host_blocks(state, blocks: list[list[int]]) -> None:
    """The constrained rows' blocks as the host has them (its last commits were never sent), the grammar's
    cost in the cycle's stats."""
    if state.grammar is not None:
        for row in state.grammar.rows:
            blocks[row] = state.grammar.block(row)
        state.stats.add_grammar(state.grammar.cost)
