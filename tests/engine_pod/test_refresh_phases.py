"""Which rows refresh at a step (kinds/bidirectional/phase_plan.py, decided on the device): the quota caps a step's
refresh positions, due rows are taken longest-waiting first with no overtaking, and a row wider than the
quota steps alone. The plan is checked against a plain host-side reading of the same rule, on random
states (property test) and on hand-made cases."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine_pod.kinds.bidirectional.phase_plan import plan_phases


@dataclass(frozen=True)
class StepPhases:
    """One step's rows by phase (row numbers in the cycle, in row order)."""

    refresh: list[int]
    reuse: list[int]
    waiting: list[int]
    refresh_tokens: int  # positions the step's refreshes compute

    @property
    def stepping(self) -> list[int]:
        return sorted(self.refresh + self.reuse)


def refresh_due(forwards: int, interval: int) -> bool:
    """Whether a row that has taken ``forwards`` forwards in its block refreshes at its next one."""
    return forwards == 0 or (interval > 0 and forwards % interval == 0)


def step_phases(
    going_on: Sequence[bool],
    forwards: Sequence[int],
    waited: Sequence[int],
    widths: Sequence[int],
    interval: int,
    quota: int | None,
) -> StepPhases:
    """The step's phases: rows ``going_on`` whose refresh is due (by their ``forwards`` so far and the
    ``interval``) refresh while their ``widths`` fit the ``quota`` (None: no cap), taken by most steps
    ``waited``; the rest of them wait; every other row going on reuses its cache."""
    reuse = [r for r, on in enumerate(going_on) if on and not refresh_due(forwards[r], interval)]
    due = [r for r, on in enumerate(going_on) if on and refresh_due(forwards[r], interval)]
    due.sort(key=lambda r: (-waited[r], r))
    refresh, tokens = [], 0
    for place, row in enumerate(due):
        if quota is not None and tokens + widths[row] > quota and (refresh or reuse):
            waiting = sorted(due[place:])
            return StepPhases(sorted(refresh), reuse, waiting, tokens)
        refresh.append(row)
        tokens += widths[row]
        if quota is not None and tokens > quota:  # a row wider than the quota, alone: nothing else steps
            return StepPhases(refresh, reuse, sorted(due[place + 1 :]), tokens)
    return StepPhases(sorted(refresh), reuse, [], tokens)


def _on_device(going_on, forwards, waited, widths, interval, quota) -> StepPhases:
    """plan_phases's plan, as lists (the reference's shape)."""
    plan = plan_phases(
        torch.tensor(going_on),
        torch.tensor(forwards),
        torch.tensor(waited),
        torch.tensor(widths),
        interval,
        quota,
    )
    rows = lambda flags: [r for r, flag in enumerate(flags.tolist()) if flag]  # noqa: E731
    refresh = rows(plan.refresh)
    return StepPhases(refresh, rows(plan.reuse), rows(plan.waiting), sum(widths[r] for r in refresh))


states = st.integers(1, 12).flatmap(
    lambda n: st.tuples(
        st.lists(st.booleans(), min_size=n, max_size=n),
        st.lists(st.integers(0, 9), min_size=n, max_size=n),
        st.lists(st.integers(0, 4), min_size=n, max_size=n),
        st.lists(st.integers(1, 80), min_size=n, max_size=n),
        st.integers(0, 3),
        st.one_of(st.none(), st.integers(1, 200)),
    )
)


@settings(max_examples=300, deadline=None)
@given(state=states)
def test_the_device_plan_is_the_rule(state):
    assert _on_device(*state) == step_phases(*state)


def test_a_row_refreshes_at_its_blocks_first_forward_and_every_interval():
    assert [refresh_due(f, 0) for f in range(5)] == [True, False, False, False, False]
    assert [refresh_due(f, 2) for f in range(5)] == [True, False, True, False, True]


def test_refreshes_stay_within_the_quota_and_the_rest_wait():
    plan = _on_device([True] * 4, [0, 0, 0, 0], [0] * 4, [30, 30, 30, 30], interval=0, quota=70)
    assert plan.refresh == [0, 1] and plan.waiting == [2, 3] and plan.reuse == []
    assert plan.refresh_tokens == 60 <= 70


def test_no_quota_refreshes_every_due_row_at_once():
    plan = _on_device([True] * 3, [0, 0, 0], [0] * 3, [30, 40, 50], interval=0, quota=None)
    assert plan.refresh == [0, 1, 2] and plan.refresh_tokens == 120


def test_rows_past_their_first_forward_reuse_their_cache():
    plan = _on_device([True, True, False], [1, 0, 0], [0, 0, 0], [30, 30, 30], interval=0, quota=10)
    assert plan.reuse == [0] and plan.waiting == [1] and plan.refresh == []


def test_the_longest_waiting_row_goes_first_and_nobody_overtakes_it():
    plan = _on_device([True] * 3, [0, 0, 0], [0, 5, 1], [10, 60, 10], interval=0, quota=65)
    assert plan.refresh == [1]  # row 1 waited most; row 2 would fit beside it (70 > 65: it does not)
    plan = _on_device([True] * 3, [0, 0, 0], [0, 5, 1], [3, 60, 10], interval=0, quota=64)
    assert plan.refresh == [1] and plan.waiting == [0, 2]  # row 0 would fit, and waits for row 2


def test_a_row_wider_than_the_quota_steps_alone():
    plan = _on_device([True, True], [0, 0], [0, 0], [90, 10], interval=0, quota=50)
    assert plan.refresh == [0] and plan.waiting == [1] and plan.refresh_tokens == 90
    plan = _on_device([True, True], [1, 0], [0, 0], [30, 90], interval=0, quota=50)
    assert plan.reuse == [0] and plan.waiting == [1]  # while another row steps, it waits
