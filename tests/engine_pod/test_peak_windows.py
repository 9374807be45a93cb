"""CPU peak windows (``device_memory.reset_peak(..., resident_window=True)``): a CPU profile measures its
grid in one fresh process, each shape in a window of peak resident memory of its own, floored by what the
process peaked at before (its imports and model load); where the kernel refuses the reset, each shape
after the first gets a fresh process as before."""

from __future__ import annotations

import json

import pytest
import torch

from engine_pod import device_memory
from engine_pod.device_memory import peak_bytes, reset_peak, resident_windows
from engine_pod.isolation import run_in_child
from engine_pod.profiling import points as profiler_points
from engine_pod.profiling.grid import Point
from tests.engine_pod.shared_profiles import scored_small_profile

MIB = 2**20
BALLAST = 256 * MIB
SMALL = 16 * MIB


def _touched(size: int) -> int:
    """``size`` bytes allocated, written and freed (1 MiB and more come from mmap: freed at once)."""
    block = torch.ones(size // 4, dtype=torch.float32)
    total = int(block[:: 4096 // 4].sum())
    del block
    return total


def _three_windows() -> tuple[int, int, int, bool]:
    cpu = torch.device("cpu")
    reset_peak(cpu, resident_window=True)  # the first window: the floor is the process's peak until now
    floor = peak_bytes(cpu)
    _touched(BALLAST)
    first = peak_bytes(cpu)
    reset_peak(cpu, resident_window=True)
    _touched(SMALL)
    return floor, first, peak_bytes(cpu), resident_windows()


def test_a_window_peaks_at_its_own_work_and_never_below_the_process_peak_before_the_first():
    floor, first, second, windows = run_in_child(_three_windows)  # a fresh process: its floor its own
    assert windows
    assert first >= floor + BALLAST * 0.9, (floor, first)
    assert floor <= second < first - BALLAST // 2, (floor, first, second)


def test_where_the_kernel_refuses_the_reset_the_peak_stays_the_whole_process(monkeypatch, tmp_path):
    monkeypatch.setattr(device_memory, "CLEAR_REFS", tmp_path / "missing" / "clear_refs")
    monkeypatch.setattr(device_memory, "_resident", device_memory._ResidentPeak())
    reset_peak(torch.device("cpu"), resident_window=True)
    assert not resident_windows()
    assert peak_bytes(torch.device("cpu")) == device_memory._resident_high_water_mark()


class _RefusingSession:
    """A one-process session whose kernel refused the window: its first point is answered, then closed."""

    closed = 0

    def __init__(self, serve, cfg) -> None:
        pass

    def ask(self, point: Point) -> tuple[Point, bool]:
        return Point(point.rows, point.width, 1), False

    def close(self) -> None:
        type(self).closed += 1


def test_without_windows_each_point_after_the_first_runs_in_a_fresh_process(monkeypatch):
    fresh = []
    monkeypatch.setattr(profiler_points, "ChildSession", _RefusingSession)
    monkeypatch.setattr(
        profiler_points,
        "run_in_child",
        lambda f, cfg, point: fresh.append(point) or Point(point.rows, point.width, 2),
    )
    cfg = profiler_points.ProfileConfig(model="builtin:tiny-llada")
    with profiler_points.CpuPoints(cfg) as points:
        assert points.measured_in == "one fresh process"
        measured = [points.measure(Point(rows, 64)) for rows in (1, 2, 3)]
        assert points.measured_in == "a fresh process each"
    assert [p.peak_bytes for p in measured] == [1, 2, 2] and fresh == [Point(2, 64), Point(3, 64)]
    assert _RefusingSession.closed == 1


@pytest.fixture(scope="module")
def small_profile(tmp_path_factory):
    path, _, _ = scored_small_profile(tmp_path_factory)
    return json.loads(path.read_text())


def test_the_cpu_profile_measured_its_grid_and_checks_in_one_fresh_process(small_profile):
    assert small_profile["points_measured_in"] == "one fresh process"
    assert small_profile["peak_measure"] == "resident"
    peaks = [p["peak_bytes"] for p in small_profile["points"]]
    # every window floored by the process's imports and model load: no shape below the smallest's floor
    assert min(peaks) > small_profile["weights_bytes"], peaks
