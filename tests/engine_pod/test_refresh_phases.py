"""Which rows refresh at a step (scheduler/refresh_phases.py): the quota caps a step's refresh positions,
due rows are taken longest-waiting first with no overtaking, and a row wider than the quota steps alone."""

from __future__ import annotations

from engine_pod.scheduler.refresh_phases import refresh_due, step_phases


def test_a_row_refreshes_at_its_blocks_first_forward_and_every_interval():
    assert [refresh_due(f, 0) for f in range(5)] == [True, False, False, False, False]
    assert [refresh_due(f, 2) for f in range(5)] == [True, False, True, False, True]


def test_refreshes_stay_within_the_quota_and_the_rest_wait():
    plan = step_phases([True] * 4, [0, 0, 0, 0], [0] * 4, [30, 30, 30, 30], interval=0, quota=70)
    assert plan.refresh == [0, 1] and plan.waiting == [2, 3] and plan.reuse == []
    assert plan.refresh_tokens == 60 <= 70


def test_no_quota_refreshes_every_due_row_at_once():
    plan = step_phases([True] * 3, [0, 0, 0], [0] * 3, [30, 40, 50], interval=0, quota=None)
    assert plan.refresh == [0, 1, 2] and plan.refresh_tokens == 120


def test_rows_past_their_first_forward_reuse_their_cache():
    plan = step_phases([True, True, False], [1, 0, 0], [0, 0, 0], [30, 30, 30], interval=0, quota=10)
    assert plan.reuse == [0] and plan.waiting == [1] and plan.refresh == []
    assert plan.stepping == [0]


def test_the_longest_waiting_row_goes_first_and_nobody_overtakes_it():
    plan = step_phases([True] * 3, [0, 0, 0], [0, 5, 1], [10, 60, 10], interval=0, quota=65)
    assert plan.refresh == [1]  # row 1 waited most; row 2 would fit beside it (70 > 65: it does not)
    plan = step_phases([True] * 3, [0, 0, 0], [0, 5, 1], [3, 60, 10], interval=0, quota=64)
    assert plan.refresh == [1] and plan.waiting == [0, 2]  # row 0 would fit, and waits for row 2


def test_a_row_wider_than_the_quota_steps_alone():
    plan = step_phases([True, True], [0, 0], [0, 0], [90, 10], interval=0, quota=50)
    assert plan.refresh == [0] and plan.waiting == [1] and plan.refresh_tokens == 90
    plan = step_phases([True, True], [1, 0], [0, 0], [30, 90], interval=0, quota=50)
    assert plan.reuse == [0] and plan.waiting == [1]  # while another row steps, it waits
