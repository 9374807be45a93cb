"""BlockServe and static scheduling logic, driven without a model (the scheduler is torch-free)."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dllm_contracts.request_params import GREEDY, RequestParams
from dllm_contracts.scheduler_config import SchedulerConfig, SchedulerConfigError, problems_of
from engine_pod.scheduler.blockserve import BlockServeScheduler, ClaimPlan
from engine_pod.scheduler.box import BatchBox
from engine_pod.scheduler.pending_queue import PendingQueue
from engine_pod.scheduler.request import Request, RequestError, RequestState
from engine_pod.scheduler.static import StaticScheduler
from tests.engine_utils import tokens

L = 4
EOS = 99


def fake_blocks(output, stop_after: dict[str, int]) -> list[list[int]]:
    """Each row's block: ordinary tokens, or EOS when its request should stop at this block."""
    blocks = []
    for request_id, row in zip(output.request_ids, output.rows):
        block_index = (len(row.prefix_ids) - int(request_id.split("-")[1])) // L
        stop = stop_after.get(request_id)
        blocks.append([EOS] * L if stop is not None and block_index >= stop else [1] * L)
    return blocks


class ManualClock:
    """A scheduler clock that moves only when a test says (one unit per block cycle in ``drive``)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def blockserve(clock=None, **settings) -> BlockServeScheduler:
    return BlockServeScheduler(L, [EOS], SchedulerConfig(**settings), clock=clock or ManualClock())


def make_request(index: int, prompt_len: int, blocks: int) -> Request:
    return Request(f"r{index}-{prompt_len}", tuple([7] * prompt_len), blocks)


def drive(scheduler, requests, stop_after, max_cycles=10_000):
    for request in requests:
        scheduler.add(request)
    outputs = []
    while scheduler.has_unfinished():
        output = scheduler.schedule()
        assert not output.is_empty
        outputs.append(output)
        scheduler.update_from_output(output, fake_blocks(output, stop_after))
        if isinstance(scheduler.clock, ManualClock):
            scheduler.clock.now += 1
        assert len(outputs) < max_cycles
    return outputs


@pytest.mark.parametrize("admission", ["preempt", "projected"])
@pytest.mark.parametrize("seed", range(8))
def test_budget_holds_at_every_cycle_and_everything_finishes(admission, seed):
    rng = random.Random(seed)
    requests = [make_request(i, rng.randint(1, 40), rng.randint(1, 6)) for i in range(30)]
    stop_after = {r.request_id: rng.randint(0, 5) for r in requests if rng.random() < 0.5}
    budget = max(r.peak_width(L) for r in requests) + rng.randint(0, 150)
    scheduler = blockserve(token_budget=budget, admission=admission, max_rows=12)
    outputs = drive(scheduler, requests, stop_after)
    for output in outputs:
        assert output.cost <= budget
        assert len(output.rows) <= 12
        assert output.box_width == max(len(row.prefix_ids) + L for row in output.rows)
    assert all(r.state is RequestState.FINISHED for r in requests)
    for request in requests:
        expected_blocks = min(request.max_blocks, stop_after.get(request.request_id, 99) + 1)
        assert len(request.generated) == expected_blocks * L


def test_rows_are_at_different_blocks_in_one_batch():
    requests = [make_request(i, 5 + i, 6) for i in range(4)]
    scheduler = blockserve(token_budget=200, max_rows=2)
    outputs = drive(scheduler, requests, {"r0-5": 0})
    mixed = [
        o
        for o in outputs
        if len({(len(row.prefix_ids) - int(i.split("-")[1])) // L for i, row in zip(o.request_ids, o.rows)})
        > 1
    ]
    assert mixed, "a finished request's slot should be refilled while the other row is mid-generation"


def test_sand_filling_prefers_requests_that_fit_inside_the_box():
    scheduler = blockserve(token_budget=10_000, admission="projected", max_rows=2)
    wide = make_request(0, 30, 1)  # peak 34
    scheduler.add(wide)
    scheduler.schedule()
    long_short = make_request(1, 2, 20)  # peak 82: shortest prompt, but widens the box
    fits = make_request(2, 20, 2)  # peak 28: longer prompt, fits inside the box
    scheduler.add(long_short)
    scheduler.add(fits)
    output = scheduler.schedule()
    assert output.request_ids == [wide.request_id, fits.request_id]


def test_a_long_prompt_does_not_widen_a_batch_of_short_ones_until_it_has_waited():
    """Dense layout: a lone long prompt would make every short row pay for its left padding."""
    clock = ManualClock()
    scheduler = blockserve(clock, token_budget=10_000, max_wait_s=2, layout="dense")
    short = [make_request(i, 3, 6) for i in range(8)]  # width 7 each
    long_prompt = make_request(8, 40, 1)  # width 44: 8 x 7 + 44 < 0.9 x 9 x 44
    for request in [*short, long_prompt]:
        scheduler.add(request)
    first = scheduler.schedule()
    assert first.request_ids == [r.request_id for r in short] and first.box_width == 7
    admitted_at = None
    for cycle in range(1, 6):
        scheduler.update_from_output(first, [[1] * L for _ in first.rows])
        clock.now += 1  # one time unit per block cycle
        first = scheduler.schedule()
        if long_prompt.request_id in first.request_ids:
            admitted_at = cycle
            break
    assert admitted_at is not None and admitted_at >= 2, "it waits (here until it ages), not admitted at once"
    without_rule = blockserve(token_budget=10_000, min_padding_efficiency=0.0)
    for request in [make_request(i, 3, 6) for i in range(8)] + [make_request(8, 40, 1)]:
        without_rule.add(request)
    assert len(without_rule.schedule().request_ids) == 9


def test_preempted_request_keeps_its_blocks_and_resumes():
    scheduler = blockserve(token_budget=3 * (10 + 3 * L), admission="preempt")
    requests = [make_request(i, 10, 6) for i in range(3)]
    outputs = drive(scheduler, requests, {})
    assert any(o.preempted for o in outputs)
    assert any(r.num_preemptions > 0 for r in requests)
    assert all(len(r.generated) == 6 * L for r in requests)


def test_aging_prevents_starvation_of_long_prompts():
    scheduler = blockserve(token_budget=200, max_wait_s=3, max_rows=3)
    long_prompt = make_request(0, 60, 1)
    scheduler.add(long_prompt)
    for i in range(1, 200):
        scheduler.add(make_request(i, 2, 1))
    cycles = 0
    while long_prompt.state is not RequestState.FINISHED:
        output = scheduler.schedule()
        scheduler.update_from_output(output, fake_blocks(output, {}))
        scheduler.clock.now += 1
        cycles += 1
    assert cycles < 10


def test_request_wider_than_the_budget_is_rejected():
    scheduler = blockserve(token_budget=40)
    with pytest.raises(RequestError, match="more than the token budget"):
        scheduler.add(make_request(0, 30, 4))


def test_static_runs_until_the_slowest_row_and_admits_in_arrival_order():
    scheduler = StaticScheduler(L, [EOS], batch_size=2)
    requests = [make_request(0, 3, 1), make_request(1, 9, 3), make_request(2, 1, 1)]
    outputs = drive(scheduler, requests, {})
    assert [o.request_ids for o in outputs] == [["r0-3", "r1-9"]] * 3 + [["r2-1"]]
    assert [row.active for row in outputs[1].rows] == [False, True]
    # block canvas: no masked suffix (attention would not see it); a finished row keeps the batch's pace
    assert [o.box_width for o in outputs[:3]] == [9 + L, 9 + 2 * L, 9 + 3 * L]
    assert [len(row.prefix_ids) for row in outputs[2].rows] == [3, 9 + 2 * L]  # never past its own budget
    full = drive(
        StaticScheduler(L, [EOS], batch_size=2, masked_suffix=True),
        [make_request(i, *s) for i, s in enumerate([(3, 1), (9, 3)])],
        {},
    )
    assert all(o.box_width == 9 + 3 * L for o in full)  # Fast-dLLM's canvas: the whole budget, always


def test_cancel_removes_pending_and_running_requests():
    scheduler = blockserve(token_budget=100, max_rows=1)
    first, second = make_request(0, 3, 5), make_request(1, 3, 5)
    scheduler.add(first)
    scheduler.add(second)
    scheduler.schedule()
    assert scheduler.cancel(second.request_id).state is RequestState.CANCELLED
    assert scheduler.cancel(first.request_id).state is RequestState.CANCELLED
    assert not scheduler.has_unfinished()
    assert scheduler.schedule().is_empty


def test_scheduler_modules_do_not_import_torch():
    code = (
        "import sys; import engine_pod.scheduler.blockserve, engine_pod.scheduler.static; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def _shape(index: int, prompt_len: int, blocks: int, arrival: float) -> Request:
    request = make_request(index, prompt_len, blocks)
    request.arrival_time = arrival
    return request


@pytest.mark.parametrize("admission", ["preempt", "projected"])
@pytest.mark.parametrize("seed", range(12))
def test_what_the_scheduler_chooses_to_claim_it_admits_at_the_next_boundary(admission, seed):
    """The claim plan and choose() are the admission decision itself: every chosen candidate joins the
    next cycle (none is rejected or left waiting), the budget holds, and a candidate that can never fit
    is never chosen."""
    rng = random.Random(seed)
    clock = ManualClock()
    budget = rng.randint(150, 600)
    scheduler = blockserve(clock, token_budget=budget, admission=admission, max_rows=rng.randint(4, 20))
    for index in range(rng.randint(0, 4)):  # some rows already running, at different blocks
        request = make_request(100 + index, rng.randint(1, 20), rng.randint(1, 5))
        if scheduler.fits(request):
            scheduler.add(request)
    output = scheduler.schedule()
    scheduler.update_from_output(output, fake_blocks(output, {}))
    clock.now = 10.0
    plan = scheduler.claim_plan()
    candidates = [
        _shape(
            index, rng.randint(1, rng.choice([budget // 4, budget])), rng.randint(1, 6), rng.uniform(0, 10)
        )
        for index in range(30)
    ]
    chosen = scheduler.choose(candidates) if plan else []
    assert all(scheduler.fits(c) for c in chosen)
    if plan:
        assert all(c.prefix_len() <= plan.max_prefix for c in chosen if clock.now - c.arrival_time <= 5.0)
    for request in chosen:
        scheduler.add(request)
    chosen_ids = {c.request_id for c in chosen}
    assert not chosen_ids & {r.request_id for r in scheduler.unadmittable()}
    output = scheduler.schedule()
    assert chosen_ids <= set(output.admitted)
    assert output.cost <= budget


def test_a_request_past_the_wait_bound_is_chosen_first_and_holds_its_place_until_it_fits():
    clock = ManualClock()
    scheduler = blockserve(clock, token_budget=100, max_wait_s=5)
    running = make_request(0, 40, 4)
    scheduler.add(running)
    scheduler.schedule()  # one row of width 44
    old_wide = _shape(1, 60, 1, arrival=0.0)  # width 64: does not fit next to the running row
    short = _shape(2, 2, 1, arrival=4.0)
    clock.now = 4.5
    assert [r.request_id for r in scheduler.choose([old_wide, short])] == [short.request_id]  # not aged yet
    clock.now = 6.0
    assert scheduler.choose([old_wide, short]) == []  # aged and not fitting: nobody overtakes it
    scheduler.cancel(running.request_id)
    assert [r.request_id for r in scheduler.choose([short, old_wide])][0] == old_wide.request_id


def test_a_packed_batch_costs_the_sum_of_its_widths_and_admits_a_long_prompt_at_once():
    """Packed: no padding, so a long prompt joins short ones without waiting, and the budget counts the
    tokens that exist; the same rows as a dense box would cost 9 x 44 = 396."""
    budget = 8 * (3 + L) + 40 + L
    packed = blockserve(token_budget=budget, max_wait_s=0)
    dense = blockserve(token_budget=budget, max_wait_s=0, layout="dense", min_padding_efficiency=0)
    for scheduler in (packed, dense):
        for i in range(8):
            scheduler.add(make_request(i, 3, 6))
        scheduler.add(make_request(8, 40, 1))
    out = packed.schedule()
    assert len(out.rows) == 9 and out.packed and out.cost == budget == out.row_total
    out = dense.schedule()
    assert len(out.rows) == 8 and not out.packed and out.cost == 8 * (3 + L)  # the long one does not fit


@given(
    st.lists(st.tuples(st.integers(1, 60), st.integers(1, 5)), min_size=1, max_size=40), st.integers(0, 400)
)
def test_a_packed_batch_never_holds_more_tokens_than_the_budget(shapes, slack):
    """Every cycle's sum of row widths stays within the budget, whatever the prompts and lengths."""
    budget = max(p + b * L for p, b in shapes) + slack
    scheduler = blockserve(token_budget=budget, max_wait_s=0)
    for i, (prompt, blocks) in enumerate(shapes):
        scheduler.add(make_request(i, prompt, blocks))
    while scheduler.has_unfinished():
        output = scheduler.schedule()
        assert output.row_total <= budget and output.cost == output.row_total
        scheduler.update_from_output(output, fake_blocks(output, {}))


def _brute_cost(rows: list[tuple[int, int]], packed: bool) -> int:
    admissions = [a for a, _ in rows]
    return sum(admissions) if packed else len(admissions) * max(admissions, default=0)


@given(
    rows=st.lists(st.tuples(st.integers(1, 60), st.integers(1, 60)), max_size=6),
    candidate=st.tuples(st.integers(1, 60), st.integers(1, 60)),
    budget=st.integers(1, 400),
    packed=st.booleans(),
)
def test_the_batch_box_keeps_what_a_brute_force_count_of_its_rows_gives(rows, candidate, budget, packed):
    """Admission's running totals against their definitions over the whole list of rows: the cost, the
    cost with one more row, the widest row one more admission may have, and the padding efficiency."""
    box = BatchBox(packed=packed)
    for admission, row in rows:
        box.add(admission, row)
    assert box.cost == _brute_cost(rows, packed)
    assert box.cost_with(candidate[0]) == _brute_cost(rows + [candidate], packed)
    fitting = [w for w in range(1, budget + 1) if _brute_cost(rows + [(w, w)], packed) <= budget]
    assert box.widest_addition(budget) == max(fitting, default=0)
    widths = [r for _, r in rows] + [candidate[1]]
    expected = 1.0 if packed else sum(widths) / (len(widths) * max(widths))
    assert box.efficiency_with(candidate[1]) == pytest.approx(expected)


SCHEDULERS = {
    "blockserve-packed": lambda: blockserve(token_budget=200),
    "blockserve-dense": lambda: blockserve(token_budget=200, layout="dense"),
    "static-dense": lambda: StaticScheduler(L, [EOS], batch_size=2),
    "static-packed": lambda: StaticScheduler(L, [EOS], batch_size=2, layout="packed"),
}


@pytest.mark.parametrize("name", SCHEDULERS)
def test_each_row_carries_its_requests_settings_and_the_output_its_batchs_shape(name):
    scheduler = SCHEDULERS[name]()
    tuned = make_request(0, 5, 3)
    tuned.params = RequestParams(
        threshold=0.5, logprobs=2, temperature=0.7, top_p=0.9, top_k=5, seed=3, family={"entropy_bound": 0.5}
    )
    plain = make_request(1, 2, 3)
    for request in (tuned, plain):
        scheduler.add(request)
    output = scheduler.schedule()
    rows = dict(zip(output.request_ids, output.rows))
    assert sorted(output.admitted) == sorted([tuned.request_id, plain.request_id])
    mine, other = rows[tuned.request_id], rows[plain.request_id]
    assert mine.params is tuned.params and other.params is GREEDY  # carried, not copied
    assert mine.active and other.active
    assert output.packed is name.endswith("packed")
    widths = [scheduler.row_width_of(row) for row in output.rows]
    assert widths == [len(row.prefix_ids) + L for row in output.rows]  # block canvas: no suffix
    assert output.box_width == max(widths) and output.row_total == sum(widths)
    assert output.gather_rows is name.startswith("blockserve")


def test_a_static_batchs_finished_row_is_eos_filled_to_the_batchs_block_and_never_committed():
    scheduler = StaticScheduler(L, [EOS], batch_size=2)
    quick, slow = make_request(0, 3, 4), make_request(1, 2, 4)
    outputs = drive(scheduler, [quick, slow], {quick.request_id: 0, slow.request_id: 2})
    assert len(outputs) == 3  # the slow row ends at its third block; the quick row keeps its pace
    for cycle, output in enumerate(outputs[1:], start=1):
        row = dict(zip(output.request_ids, output.rows))[quick.request_id]
        assert not row.active and row.suffix_blocks == 0 and row.suffix_visible
        assert row.prefix_ids == tuple([7] * 3) + tuple([EOS] * L * cycle)
    full = StaticScheduler(L, [EOS], batch_size=2, masked_suffix=True)
    outputs = drive(full, [make_request(0, 3, 4), make_request(1, 2, 4)], {"r0-3": 0, "r1-2": 2})
    finished = dict(zip(outputs[1].request_ids, outputs[1].rows))["r0-3"]
    assert finished.prefix_ids == tuple([7] * 3) + tuple([EOS] * L * 3)  # the full canvas's width


@pytest.mark.parametrize(
    "field, bad, good, says",
    [
        ("token_budget", 0, 1, "token_budget must be positive, got 0"),
        ("max_rows", 0, 1, "max_rows must be positive, got 0"),
        ("admission", "fifo", "projected", "admission must be one of preempt, projected, got 'fifo'"),
        ("min_padding_efficiency", 1.01, 1.0, "min_padding_efficiency must be in [0, 1], got 1.01"),
        ("min_padding_efficiency", -0.01, 0.0, "min_padding_efficiency must be in [0, 1], got -0.01"),
        ("max_wait_s", -0.5, 0.0, "max_wait_s must be at least 0 seconds, got -0.5"),
        ("layout", "ragged", "dense", "layout must be one of packed, dense, got 'ragged'"),
    ],
)
def test_each_setting_out_of_range_is_named_with_its_bounds(field, bad, good, says):
    """The boundary value is accepted, the one past it refused with a message naming the setting."""
    assert getattr(SchedulerConfig(**{field: good}), field) == good
    with pytest.raises(SchedulerConfigError) as refused:
        SchedulerConfig(**{field: bad})
    assert str(refused.value) == says


def test_every_problem_is_reported_at_once_and_the_budget_must_hold_a_block():
    with pytest.raises(SchedulerConfigError) as refused:
        SchedulerConfig(token_budget=0, max_rows=0)
    assert str(refused.value) == "token_budget must be positive, got 0; max_rows must be positive, got 0"
    config = SchedulerConfig(token_budget=33)
    assert config.problems(block_length=32) == {}
    assert SchedulerConfig(token_budget=32).problems(block_length=32) == {
        "token_budget": "32 cannot hold even one block of 32"
    }
    settings = {"token_budget": 8, "max_rows": 1, "admission": "preempt", "min_padding_efficiency": 0.5}
    assert problems_of(settings | {"max_wait_s": 0.0}) == {}  # layout left out: the default


def test_the_full_canvas_materialises_each_rows_masked_suffix_and_costs_its_peak():
    config = SchedulerConfig(token_budget=400, layout="dense")
    scheduler = BlockServeScheduler(L, [EOS], config, clock=ManualClock(), masked_suffix=True)
    request = make_request(0, 5, 3)
    scheduler.add(request)
    widths = []
    for blocks_left in (2, 1, 0):
        output = scheduler.schedule()
        (row,) = output.rows
        assert (row.suffix_blocks, row.suffix_visible) == (blocks_left, True)
        widths.append(output.box_width)
        scheduler.update_from_output(output, fake_blocks(output, {}))
    assert widths == [5 + 3 * L] * 3  # prompt, committed blocks and the visible suffix: always the peak


def test_timestamps_states_and_counts_along_a_requests_life():
    clock = ManualClock()
    scheduler = blockserve(clock=clock, token_budget=2 * (10 + 3 * L), admission="preempt")
    first, second = make_request(0, 10, 3), make_request(1, 10, 3)
    clock.now = 5.0
    scheduler.add(first)
    output = scheduler.schedule()
    assert first.state is RequestState.RUNNING and first.first_scheduled_time == 5.0
    clock.now = 6.0
    scheduler.update_from_output(output, fake_blocks(output, {}))
    scheduler.schedule()
    assert first.first_scheduled_time == 5.0  # the first time only
    scheduler.add(second)
    clock.now = 9.0
    assert scheduler.cancel(second.request_id) is second
    assert (second.state, second.finish_time) == (RequestState.CANCELLED, 9.0)
    assert scheduler.cancel("no-such-request") is None


def test_a_batch_exactly_at_the_budget_keeps_every_row_and_one_past_it_preempts_the_widest_once():
    width = 10 + 2 * L  # each request's width at its last block: prompt, one block, the active one
    at_budget = blockserve(token_budget=2 * width, admission="preempt", layout="dense")
    requests = [make_request(i, 10, 2) for i in range(2)]
    outputs = drive(at_budget, requests, {})
    assert not any(o.preempted for o in outputs) and all(r.num_preemptions == 0 for r in requests)
    over = blockserve(token_budget=2 * width - 1, admission="preempt", layout="dense")
    requests = [make_request(i, 10, 2) for i in range(2)]
    outputs = drive(over, requests, {})
    assert outputs[1].preempted and len(outputs[1].rows) == 1
    assert sorted(r.num_preemptions for r in requests) == [0, 1]
    assert all(len(r.generated) == 2 * L for r in requests)


def test_the_claim_plan_reads_as_many_as_there_is_room_for_and_no_longer_than_fits():
    assert blockserve(token_budget=L + 1, max_rows=3).claim_plan() == ClaimPlan(count=3, max_prefix=1)
    packed = blockserve(token_budget=100, max_rows=2)
    packed.add(make_request(0, 10, 3))
    assert packed.claim_plan() is None  # a request of our own waits: it goes first
    packed.schedule()
    assert packed.claim_plan() == ClaimPlan(count=1, max_prefix=100 - (10 + L) - L)
    packed.add(make_request(1, 10, 3))
    packed.schedule()
    assert packed.claim_plan() is None  # every row taken
    for budget, plan in [(2 * (10 + L), ClaimPlan(count=4, max_prefix=10)), (2 * (10 + L) - 1, None)]:
        dense = blockserve(token_budget=budget, max_rows=5, layout="dense")
        dense.add(make_request(0, 10, 3))
        dense.schedule()
        assert dense.claim_plan() == plan  # one more row as wide as the first fits, or none does


def test_waiting_exactly_the_bound_is_not_yet_past_it():
    clock = ManualClock()
    scheduler = blockserve(clock, token_budget=200, max_wait_s=3)
    request = _shape(0, 5, 1, 2.0)  # enqueued at t=2
    assert not scheduler._aged(request, 5.0) and scheduler._aged(request, 5.01)
    assert not scheduler._aged(_shape(1, 5, 1, None), 100.0)  # no arrival time: it has not waited
    assert not blockserve(clock, token_budget=200, max_wait_s=0)._aged(request, 100.0)  # fairness off


def test_a_wider_row_is_admitted_while_the_box_keeps_exactly_the_useful_share_asked():
    """Two rows of widths w and 2w in a dense box: efficiency 3w / 4w = 0.75."""
    scheduler = blockserve(token_budget=400, layout="dense", min_padding_efficiency=0.75)
    wider = make_request(1, 2 * (10 + L) - L, 1)  # its row is twice as wide
    assert scheduler._dense_enough(wider, _box_with(10))
    stricter = blockserve(token_budget=400, layout="dense", min_padding_efficiency=0.76)
    assert not stricter._dense_enough(wider, _box_with(10))
    assert stricter._dense_enough(make_request(2, 10, 1), _box_with(10))  # inside the box: no padding
    assert stricter._dense_enough(wider, BatchBox())  # the first row always


def _box_with(prompt_len: int) -> BatchBox:
    box = BatchBox()
    box.add(prompt_len + L, prompt_len + L)
    return box


def test_a_row_inside_the_box_is_admitted_however_much_padding_the_box_already_has():
    box = _box_with(10)
    box.add(4 + L, 4 + L)  # rows of 14 and 8: efficiency (14 + 8) / 28 < 0.9 already
    strict = blockserve(token_budget=400, layout="dense", min_padding_efficiency=0.9)
    assert strict._dense_enough(make_request(2, 10, 1), box)  # exactly the box's width: inside it


def test_projected_admission_prefers_a_request_exactly_as_wide_as_the_box():
    """Projected: the first pending request (shortest first) whose peak fits inside the box's widest
    admission, here one exactly as wide, before the shortest."""
    scheduler = blockserve(token_budget=400, admission="projected", layout="dense")
    box = BatchBox()
    box.add(10 + 2 * L, 10 + L)  # a running row whose peak is 10 + 2L
    queue = PendingQueue([make_request(1, 2, 9), make_request(2, 10, 2)])  # peaks 2 + 9L and 10 + 2L
    assert scheduler._candidate(queue, box, 0.0).request_id == "r2-10"


def test_the_full_canvas_admits_against_each_rows_peak():
    """On the full canvas a row is always as wide as its peak: two requests of peak 5 + 3L do not fit
    a budget of one peak plus a little, though their first rows (5 + L) would."""
    config = SchedulerConfig(token_budget=5 + 3 * L + 8, layout="dense")
    scheduler = BlockServeScheduler(L, [EOS], config, clock=ManualClock(), masked_suffix=True)
    for index in range(2):
        scheduler.add(make_request(index, 5, 3))
    assert len(scheduler.schedule().rows) == 1


def test_a_pending_queue_finds_only_what_it_holds():
    queue = PendingQueue([make_request(0, 3, 1)])
    assert queue.find("r0-3").request_id == "r0-3" and queue.find("r9-9") is None


def test_no_claim_is_planned_when_what_is_left_cannot_hold_a_block_and_a_token():
    scheduler = blockserve(token_budget=L + 1, max_rows=2)
    assert scheduler.claim_plan() == ClaimPlan(count=2, max_prefix=1)
    second = blockserve(token_budget=2 * L + 1, max_rows=2)
    second.add(make_request(0, 1, 1))
    second.schedule()
    assert second.claim_plan() is None  # L tokens left: a block, but no prompt token


def test_a_static_batch_takes_one_row_or_more_and_a_known_layout():
    assert StaticScheduler(L, [EOS], batch_size=1).batch_size == 1  # what sequential runs use
    with pytest.raises(ValueError, match=r"^batch size must be positive, got 0$"):
        StaticScheduler(L, [EOS], batch_size=0)
    with pytest.raises(ValueError, match=r"^layout must be one of packed, dense, got 'ragged'$"):
        StaticScheduler(L, [EOS], batch_size=2, layout="ragged")


def test_a_request_becomes_blocks_once_for_the_layout_of_the_scheduler_it_joins():
    """On the absolute grid a prompt's tail shares the first block: 13 prompt tokens and 10 asked are
    ceil((5 + 10) / 8) = 2 blocks, the widest row 8 + 16 = 24. A worker judges a queued candidate by its
    shape, so the shape must be that request; a request shaped for the other layout is refused."""
    from dllm_contracts.queue.ops import Candidate
    from engine_pod.worker.claims import Claims

    scheduling = SchedulerConfig(token_budget=100)
    on_grid = BlockServeScheduler(8, [], scheduling, grid_aligned=True)
    request = on_grid.request_for("r", [1] * 13, tokens(10))
    assert (request.grid_head, request.max_blocks, request.peak_width(8)) == (5, 2, 24)
    shape = Claims(None, on_grid, scheduling, "w").shape(Candidate("r", 13, 13, 10, 0.0))
    sizes = [(r.grid_head, r.max_blocks, r.prefix_len(), r.peak_width(8)) for r in (shape, request)]
    assert sizes[0] == sizes[1]
    off_grid = BlockServeScheduler(8, [], scheduling)
    assert off_grid.request_for("r", [1] * 13, tokens(10)).peak_width(8) == 13 + 16
    with pytest.raises(RequestError, match="another block layout"):
        off_grid.add(request)
