"""When a profiled budget deserves a warning: it lies far past the measured grid, or the fit is poor."""

from __future__ import annotations

import pytest

from engine_pod.profiling.extrapolation import MAX_EXTRAPOLATION, MIN_R_SQUARED, Extrapolation


def test_a_budget_within_twice_the_grid_on_a_good_fit_is_not_warned_about():
    within = Extrapolation.of(budget=8000, largest_measured_tokens=4096, r_squared=0.999)
    assert within.factor == 1.95 and not within.beyond_grid and not within.poor_fit
    assert within.warnings() == []


def test_a_budget_far_past_the_grid_names_the_grid_and_the_flag_that_widens_it():
    far = Extrapolation.of(budget=15360, largest_measured_tokens=1024, r_squared=0.999)
    assert far.factor == 15 and far.beyond_grid and far.factor > MAX_EXTRAPOLATION
    (warning,) = far.warnings()
    assert "15x" in warning and "up to 1024 tokens" in warning and "--max-tokens" in warning


@pytest.mark.parametrize("r_squared, warned", [(0.86, True), (MIN_R_SQUARED, False), (0.99, False)])
def test_a_poor_fit_is_warned_about(r_squared, warned):
    fit = Extrapolation.of(budget=1000, largest_measured_tokens=1024, r_squared=r_squared)
    assert fit.poor_fit is warned
    assert any("R^2" in w for w in fit.warnings()) is warned


def test_both_reasons_give_two_warnings_and_the_json_says_which():
    both = Extrapolation.of(budget=15360, largest_measured_tokens=1024, r_squared=0.86)
    assert len(both.warnings()) == 2
    assert both.as_json() == {
        "factor": 15.0,
        "largest_measured_tokens": 1024,
        "r_squared": 0.86,
        "beyond_grid": True,
        "poor_fit": True,
    }
