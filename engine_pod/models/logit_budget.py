"""How many logits the LM head materializes at once (torch-free: DecodingConfig holds one, every family's
model applies it through models/logit_head.py)."""

from __future__ import annotations

from dataclasses import dataclass

AUTO_ENTRIES = 1 << 24  # the automatic chunk: about this many vocabulary entries (64 MB in float32)
AUTO_MIN_POSITIONS, AUTO_MAX_POSITIONS = 32, 1024
AUTO_POSITION_MULTIPLE = 32  # the head multiplies rows in tiles of 32 (models/row_invariant.TILE_ROWS)


@dataclass(frozen=True)
class LogitBudget:
    """How the LM head materializes logits (models/logit_head.py applies it): ``positions``, the most
    positions whose logits exist at once (None: automatic, about ``AUTO_ENTRIES`` entries, 32 to 1024 and a multiple of 32
    positions); ``candidates``, k."""

    positions: int | None = None
    candidates: int = 0  # k: the logits of each position's k candidates only (0: the whole vocabulary)

    def columns(self, vocab: int) -> int:
        """Logits per position: k where candidates restrict the vocabulary, else all of it."""
        return self.candidates if 0 < self.candidates < vocab else vocab

    def chunk(self, vocab: int) -> int:
        """Positions per chunk for a head of ``vocab`` columns."""
        if self.positions is not None:
            return self.positions
        fitting = (
            min(AUTO_MAX_POSITIONS, AUTO_ENTRIES // vocab) // AUTO_POSITION_MULTIPLE * AUTO_POSITION_MULTIPLE
        )
        return max(AUTO_MIN_POSITIONS, fitting)
