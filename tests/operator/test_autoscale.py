"""Queue-depth autoscaling decisions."""

from __future__ import annotations

from dllm_operator.autoscale import decide, desired_replicas


def test_desired_replicas_is_clamped():
    assert desired_replicas(0, 10, 1, 4) == 1
    assert desired_replicas(35, 10, 1, 4) == 4
    assert desired_replicas(25, 10, 1, 8) == 3


def test_scale_up_is_immediate_and_scale_down_waits_for_the_delay():
    up = decide(depth=40, current=1, target=10, minimum=1, maximum=8, delay_s=60, below_since=None, now=1000)
    assert up.replicas == 4 and up.below_since is None
    first = decide(
        depth=0, current=4, target=10, minimum=1, maximum=8, delay_s=60, below_since=None, now=1000
    )
    assert first.replicas == 4 and first.below_since == 1000
    later = decide(
        depth=0, current=4, target=10, minimum=1, maximum=8, delay_s=60, below_since=1000, now=1061
    )
    assert later.replicas == 1
