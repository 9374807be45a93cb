"""How far a profiled budget can be trusted: how far past the measured grid it lies, and how well the
line fits the points it was read from."""

from __future__ import annotations

from dataclasses import asdict, dataclass

MAX_EXTRAPOLATION = 2.0  # a budget more than this many times the largest fitted batch is warned about
MIN_R_SQUARED = 0.95  # a fit that explains less of the measured peaks than this is warned about


@dataclass(frozen=True)
class Extrapolation:
    factor: float  # token budget / the largest batch the fit measured
    largest_measured_tokens: int  # the largest fitted grid point (held-out points excluded)
    r_squared: float  # of the linear fit

    @classmethod
    def of(cls, budget: int, largest_measured_tokens: int, r_squared: float) -> Extrapolation:
        return cls(round(budget / largest_measured_tokens, 2), largest_measured_tokens, round(r_squared, 4))

    @property
    def beyond_grid(self) -> bool:
        return self.factor > MAX_EXTRAPOLATION

    @property
    def poor_fit(self) -> bool:
        return self.r_squared < MIN_R_SQUARED

    def warnings(self) -> list[str]:
        """One sentence per reason to doubt the budget (none: the budget lies within the measured range, or
        close to it, on a good fit)."""
        found = []
        if self.beyond_grid:
            found.append(
                f"the token budget is extrapolated {self.factor:g}x past the measured grid (points up to "
                f"{self.largest_measured_tokens} tokens; one check at the budget): pass --max-tokens at or "
                "above the budget to measure the range it lies in"
            )
        if self.poor_fit:
            found.append(
                f"peak memory fits a line poorly (R^2 {self.r_squared:.2f}, below {MIN_R_SQUARED}): the "
                "measurements were noisy (other load on this machine?) or the grid too small; profile "
                "again, with a larger --max-tokens"
            )
        return found

    def as_json(self) -> dict:
        return asdict(self) | {"beyond_grid": self.beyond_grid, "poor_fit": self.poor_fit}
