"""The head-sparse cache's settings: one frozen class, its defaults and ranges (torch-free: the engine's
flags and the operator's spec check both take them from here).

Off by default. ``uniform``: every head of every layer keeps ``retention`` of each row's context.
``head-centric``: per layer, heads ranked by importance (``dllm heads``) fall into three groups: the core
share kept whole, the regular heads at ``retention``, the minor share at ``minor_retention`` (never more
than ``retention``). The active block's own positions are always kept.

Which positions a head keeps (not how many): ``scoring`` (``probability``: the attention probability the
block's queries give each key, averaged over them and summed over a K/V head's query heads;
``mean-query-logit``: the pre-softmax logit of the block's mean query against each key, the most over a
K/V head's query heads), ``pool_kernel`` (each context position scores the most of the scores of its
neighbours within the kernel), ``selection`` (``per-head``: each K/V head its own positions; ``shared``: one
set for every head of a layer, ranked by the scores summed over all query heads) and ``selection_delay``
(a block's first forwards that compute every position without selecting; the selection is made at the
full forward after them). dLLM-Serve's published code selects by ``mean-query-logit``, ``pool_kernel`` 3,
``selection_delay`` 1, per head or shared.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

MODES = ("off", "head-centric", "uniform")
SCORINGS = ("probability", "mean-query-logit")
SELECTIONS = ("per-head", "shared")
MAX_MINOR_RETENTION = 0.2
MAX_POOL_KERNEL = 15  # odd, so that a position's neighbours lie evenly on both sides
MAX_SELECTION_DELAY = 32
LABELS = {  # HeadSparseConfig's field -> how its messages name it
    "mode": "sparse cache mode",
    "retention": "retention",
    "minor_retention": "minor retention",
    "core_share": "core share",
    "minor_share": "minor share",
    "consistency": "consistency threshold",
    "scoring": "sparse scoring",
    "pool_kernel": "pool kernel",
    "selection": "sparse selection",
    "selection_delay": "selection delay",
    "importance": "head-centric retention",
}


# per mode, the settings besides the mode that decide what the cache holds (a profile records them; the
# importance, the consistency threshold, the scoring, pooling, selection and delay choose which positions
# are kept, not how many)
MEMORY_FIELDS = {
    "off": (),
    "uniform": ("retention",),
    "head-centric": ("retention", "minor_retention", "core_share", "minor_share"),
}


class HeadSparseConfigError(ValueError):
    """Head-sparse settings out of range."""


@dataclass(frozen=True)
class HeadSparseConfig:
    mode: str = "off"  # off | head-centric | uniform
    retention: float = 0.5  # r: share of each row's context a (regular, or every uniform) head keeps
    core_share: float = 0.2  # head-centric: share of each layer's heads kept whole (the most important)
    minor_share: float = 0.2  # head-centric: share of each layer's heads sparsified hardest (the least)
    minor_retention: float = 0.2  # head-centric: the minor heads' retention (at most 0.2, and at most r)
    # cross-step consistency: a head whose scores over the positions it scored at the request's previous
    # refresh have a cosine similarity above this with the scores it ranked by then keeps that ranking
    # there (its selection stays put); 1 never holds (each refresh selects afresh)
    consistency: float = 0.9
    scoring: str = "probability"  # what ranks a key: probability | mean-query-logit (module docstring)
    pool_kernel: int = 1  # each context position scores the most of this many around it (odd; 1: itself)
    selection: str = "per-head"  # per-head: each K/V head keeps its own positions; shared: one set per layer
    selection_delay: int = 0  # a block's first forwards that compute every position before the selecting one
    importance: str | None = None  # the JSON ``dllm heads`` wrote (head-centric needs it)

    def __post_init__(self) -> None:
        problems = problems_of(asdict(self))
        if problems:
            name, message = next(iter(problems.items()))
            raise HeadSparseConfigError(f"{LABELS[name]} {message}")

    @property
    def on(self) -> bool:
        return self.mode != "off"

    def group_retentions(self) -> tuple[float, float, float]:
        """(core, regular, minor) retention of head-centric groups."""
        return 1.0, self.retention, min(self.minor_retention, self.retention)

    def group_sizes(self, heads: int) -> tuple[int, int, int]:
        """(core, regular, minor) heads of a head-centric layer of ``heads`` K/V heads: the shares rounded
        half up (0.2 of 6 heads is 1, of 32 is 6), the core first."""
        core = min(math.floor(self.core_share * heads + 0.5), heads)
        minor = min(math.floor(self.minor_share * heads + 0.5), heads - core)
        return core, heads - core - minor, minor

    def context_kept_share(self, heads: int) -> float:
        """The share of a row's context (its positions outside the active block, which is always kept)
        that the cache keeps, over a layer's ``heads`` K/V heads: 1 when off. What dLLM-Serve's admission
        counts a row's held cache at (scheduler/dllm_serve.py)."""
        if self.mode == "off":
            return 1.0
        if self.mode == "uniform":
            return self.retention
        sizes = self.group_sizes(heads)
        return sum(n * r for n, r in zip(sizes, self.group_retentions())) / heads


def problems_of(settings: dict) -> dict[str, str]:
    """HeadSparseConfig's checks for settings not yet made a config (every field given), by field, each
    message to follow the field's name, so that each caller can name the settings its own way (a flag, a
    resource's field)."""
    mode, retention, minor = settings["mode"], settings["retention"], settings["minor_retention"]
    core_share, minor_share = settings["core_share"], settings["minor_share"]
    consistency, kernel, delay = settings["consistency"], settings["pool_kernel"], settings["selection_delay"]
    checks = [
        ("mode", mode not in MODES, f"must be one of {', '.join(MODES)}, got {mode!r}"),
        ("retention", not 0.0 < retention <= 1.0, f"must be in (0, 1], got {retention}"),
        (
            "minor_retention",
            not 0.0 < minor <= MAX_MINOR_RETENTION,
            f"must be in (0, {MAX_MINOR_RETENTION}], got {minor}",
        ),
        ("core_share", not 0.0 <= core_share <= 1.0, f"must be in [0, 1], got {core_share}"),
        ("minor_share", not 0.0 <= minor_share <= 1.0, f"must be in [0, 1], got {minor_share}"),
        (
            "minor_share",
            core_share + minor_share > 1.0,
            f"and the core share together must be at most 1, got {minor_share} and {core_share}",
        ),
        ("consistency", not -1.0 <= consistency <= 1.0, f"must be in [-1, 1], got {consistency}"),
        (
            "scoring",
            settings["scoring"] not in SCORINGS,
            f"must be one of {', '.join(SCORINGS)}, got {settings['scoring']!r}",
        ),
        (
            "pool_kernel",
            not (_is_int(kernel) and 1 <= kernel <= MAX_POOL_KERNEL and kernel % 2 == 1),
            f"must be an odd whole number from 1 to {MAX_POOL_KERNEL}, got {kernel}",
        ),
        (
            "selection",
            settings["selection"] not in SELECTIONS,
            f"must be one of {', '.join(SELECTIONS)}, got {settings['selection']!r}",
        ),
        (
            "selection_delay",
            not (_is_int(delay) and 0 <= delay <= MAX_SELECTION_DELAY),
            f"must be a whole number from 0 to {MAX_SELECTION_DELAY}, got {delay}",
        ),
        (
            "importance",
            mode == "head-centric" and not settings["importance"],
            "needs head importance: pass the JSON `dllm heads` writes (--head-importance), or a --profile "
            "that `dllm profile --score-heads` wrote",
        ),
    ]
    problems: dict[str, str] = {}
    for name, failed, message in checks:
        if failed and name not in problems:
            problems[name] = message
    return problems


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def memory_settings(settings: dict) -> dict | None:
    """What of these settings (HeadSparseConfig's fields, given as a dict) decides the cache's memory, as a
    profile records it: None while the cache is off."""
    mode = settings["mode"]
    if mode == "off":
        return None
    return {"mode": mode} | {name: settings[name] for name in MEMORY_FIELDS.get(mode, ())}
