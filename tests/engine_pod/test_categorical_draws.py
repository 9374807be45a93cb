"""The batched categorical draws are torch.multinomial's, row by row, bit for bit."""

from __future__ import annotations

import pytest
import torch

from engine_pod.bench.op_census import counting
from engine_pod.decoding import categorical_draws as draws
from engine_pod.decoding.categorical_draws import categorical_draws


def _distributions(rows: int, temperature: float, seed: int) -> torch.Tensor:
    """[rows, 32, 256] float32 softmax rows, peaked at low temperature (many exact zeros)."""
    logits = torch.randn(rows, 32, 256, generator=torch.Generator().manual_seed(seed)) * 4
    return torch.softmax(logits / temperature, dim=-1, dtype=torch.float32)


def _multinomial_rows(probabilities: torch.Tensor, generators: list[torch.Generator]) -> torch.Tensor:
    return torch.cat(
        [torch.multinomial(p, 1, generator=g).view(1, -1) for p, g in zip(probabilities, generators)]
    )


def _generators(seeds: list[int]) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(seed) for seed in seeds]


@pytest.mark.parametrize("temperature", [0.02, 0.3, 1.0, 5.0])
def test_draws_equal_multinomial_and_leave_each_generator_where_it_leaves_it(temperature: float) -> None:
    probabilities = _distributions(7, temperature, seed=int(temperature * 100))
    probabilities[2] = probabilities[1]
    seeds = [11, 3, 3, 800, 0, 12345, 7]  # rows 1 and 2: the same distributions and seed
    ours, theirs = _generators(seeds), _generators(seeds)
    for _ in range(3):  # consecutive steps: the generators' states carry on
        got = categorical_draws(probabilities, ours)
        assert torch.equal(got, _multinomial_rows(probabilities, theirs))
    assert all(a.get_state().equal(b.get_state()) for a, b in zip(ours, theirs))
    assert torch.equal(got[1], got[2])


def test_every_element_through_the_c_librarys_log1p_gives_the_same_draws(monkeypatch) -> None:
    """The path that recomputes doubles near a float's rounding midpoint, taken by every element."""
    monkeypatch.setattr(draws, "NEAR_MIDPOINT", (1 << 28) + 1)
    probabilities = _distributions(2, 1.0, seed=5)[:, :4]
    ours, theirs = _generators([1, 2]), _generators([1, 2])
    assert torch.equal(categorical_draws(probabilities, ours), _multinomial_rows(probabilities, theirs))


def test_the_exponentials_are_torchs_float_for_float() -> None:
    size = 1 << 20  # about one element in a million is near a rounding midpoint
    probabilities = torch.full((1, 1, size), 1.0 / size)
    expected = torch.empty(size)
    recomputed = 0
    for seed in range(3):
        pending = draws.PendingDraws(probabilities, [torch.Generator().manual_seed(seed)])
        report = pending.report.tolist()
        recomputed += sum(position < size for position in report[0][: len(report[0]) // 2])
        pending.finish(report, bool(pending.valid))
        expected.exponential_(generator=torch.Generator().manual_seed(seed))
        assert torch.equal(pending.waits.view(-1), expected)
    assert recomputed > 0  # the path that recomputes was taken


def test_a_row_with_more_near_midpoint_elements_than_reported_is_drawn_again_serially(monkeypatch) -> None:
    monkeypatch.setattr(draws, "NEAR_MIDPOINT", 1 << 24)  # about one element in 16 is near one
    monkeypatch.setattr(draws, "suspects_kept", lambda elements: 4)
    probabilities = _distributions(3, 1.0, seed=9)
    pending = draws.PendingDraws(probabilities, _generators([1, 2, 3]))
    report = pending.report.tolist()
    assert all(values[4] < 32 * 256 for values in report)  # every row fills its four places and one more
    theirs = _generators([1, 2, 3])
    assert torch.equal(pending.finish(report, True), _multinomial_rows(probabilities, theirs))


def test_drawing_reads_nothing_from_the_device_until_the_step_reads_it() -> None:
    probabilities = _distributions(4, 0.3, seed=3)
    with counting(torch.nn.Module()) as census:
        draws.PendingDraws(probabilities, _generators([0, 1, 2, 3]))
    assert sum(s.sync_count for s in census.segments) == 0
    assert sum(s.host_to_device for s in census.segments) == 0


def test_float64_probabilities_draw_as_multinomial_draws_them() -> None:
    probabilities = _distributions(3, 0.5, seed=2).to(torch.float64)
    ours, theirs = _generators([4, 5, 6]), _generators([4, 5, 6])
    assert torch.equal(categorical_draws(probabilities, ours), _multinomial_rows(probabilities, theirs))


def test_a_distribution_multinomial_refuses_is_refused() -> None:
    probabilities = _distributions(2, 1.0, seed=1)
    probabilities[1, 3, 7] = float("nan")
    with pytest.raises(RuntimeError, match="inf.*nan"):
        categorical_draws(probabilities, _generators([0, 1]))
