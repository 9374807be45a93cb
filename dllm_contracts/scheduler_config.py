"""BlockServe's settings: every default and every range, in one place (no torch).

The CLI flags (``dllm bench``, ``dllm worker``, ``dllm serve``), the worker and the operator's spec check
all take their defaults and their validation from ``SchedulerConfig``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from dllm_contracts.defaults import DEFAULT_TOKEN_BUDGET

ADMISSION_MODES = ("preempt", "projected")
# packed: rows concatenated with no padding, a batch costs the sum of its rows' widths;
# dense: rows left-padded to the widest one, a batch costs |A| x box width (DESIGN.md section 2)
LAYOUTS = ("packed", "dense")
# which scheduler serves a worker's queue (engine_pod/scheduler/serving.py); the first is the default
SERVING_POLICIES = ("blockserve", "dllm-serve", "static", "sequential")


DEFAULT_LAYOUT = LAYOUTS[0]
DEFAULT_REFRESH_QUOTA = 0.4  # SchedulerConfig.refresh_quota's default
DEFAULT_BATCH_REFRESH_QUOTA = 0.7  # SchedulerConfig.batch_refresh_quota's default
BATCH_WINDOW_S = 0.15  # SchedulerConfig.batch_window_s's default
BURST_QUIET_S = 0.02  # a pause in arrivals this long ends a batch window: the burst is in (5 ms let a
# gateway's hiccup on a busy host start a burst of 128 with 1 or 105 of them; 20 ms took all 122)
MAX_BATCH_WINDOW_S = 1.0


class SchedulerConfigError(ValueError):
    """Scheduler settings out of range."""


def raise_problems(problems: dict[str, str]) -> None:
    """SchedulerConfigError naming every setting out of range (nothing when there is none)."""
    if problems:
        raise SchedulerConfigError("; ".join(f"{name} {message}" for name, message in problems.items()))


@dataclass(frozen=True)
class SchedulerConfig:
    """How BlockServe admits requests (DESIGN.md section 2)."""

    token_budget: int = DEFAULT_TOKEN_BUDGET  # Cost(A) never exceeds it (see ``layout``)
    max_rows: int = 256  # upper limit on active rows
    admission: str = "preempt"  # preempt: admit against next widths; projected: against peak widths
    # BlockServe widens the box for a longer prompt only while this share of positions stays useful
    # (0: admission limited by the token budget alone). Measured: 0.92 padding on the heterogeneous
    # workload with the budget filled.
    min_padding_efficiency: float = 0.7
    # A request queued longer than this (seconds since it was enqueued) is admitted next, whatever its
    # width: no other request is admitted before it (its reservation). 0 turns fairness off. Measured
    # (300 chat requests, 32 clients, dllm serve, this CPU): the worst task family's p99 latency is
    # 2.2-2.6x the overall median at 0.8 s, 3.0-3.2x at 1 s, 6.3x at 2 s, 11x at 5 s; lower bounds
    # cost throughput (long prompts then widen dense boxes of short ones).
    max_wait_s: float = 0.8
    # Batch lines (the queue's batch lane) are claimed after interactive requests, where these leave room;
    # a batch line queued longer than this is claimed as an aged request (aging: a batch progresses
    # however busy the interactive lane is). 0: batch lines only fill the room interactive traffic leaves.
    batch_max_wait_s: float = 30.0
    # Batch lines one worker runs at a time at most (0: no bound but the budget): on a device whose block
    # cycle slows with every row, a full box of batch lines would slow the interactive requests beside it.
    batch_max_rows: int = 16
    # how a batch is laid out, and so what it costs: packed (the sum of row widths) or dense (|A| x the
    # widest row; min_padding_efficiency applies to dense batches only: a packed one has no padding)
    layout: str = DEFAULT_LAYOUT
    # A worker with nothing to run, woken by new work, waits while more keeps arriving (each pause of
    # BURST_QUIET_S ends the wait), at most this long, so that a burst on its way through the gateway
    # starts as one batch rather than as its first request and a late rest (which would finish a block
    # cycle later). Costs a request that arrives alone at an idle worker one pause. 0: claim at once.
    batch_window_s: float = BATCH_WINDOW_S
    # dLLM-Serve (policy dllm-serve): the share of the token budget one step may spend on refreshes while an
    # interactive request is in the batch, and while only batch lines are (its design document's 40% and
    # 70%; a row must refresh within the smaller alone); each row's refresh interval in forwards (0: at its
    # block's first forward only, Fast-dLLM's dual cache); and the share of a token's profiled peak that its cache holds for the row's whole life (the
    # rest is the refresh forward's and passes; 1: unknown, admit as BlockServe does)
    refresh_quota: float = DEFAULT_REFRESH_QUOTA
    batch_refresh_quota: float = DEFAULT_BATCH_REFRESH_QUOTA
    refresh_interval: int = 0
    cache_share: float = 1.0
    # dLLM-Serve's step-level batching: a cycle ends at the first step after which a row's block is complete
    # while others go on (those carry their blocks on), so that it starts its next block and new requests
    # join at that step instead of when the slowest row's block completes; False: at block boundaries only
    step_level: bool = True
    # chunked prefill (block diffusion's exact cache, DiffusionGemma's context encoder): a prompt's keys and
    # values computed this many tokens (whole blocks) per block cycle, beside the decoding rows; LLaDA's dual
    # cache: a row wider than twice this refreshes a few layers per cycle (scheduler/split_refresh.py); None: 512
    # or an eighth of the budget, whichever is smaller; 0: a prompt's whole prefix in its first block's
    # first forward
    prefill_chunk: int | None = None

    def __post_init__(self) -> None:
        raise_problems(self.problems())

    def problems(self, block_length: int | None = None) -> dict[str, str]:
        """What is out of range: setting name -> what is wrong (empty: valid). With ``block_length``,
        also whether the budget holds one block."""
        return problems_of(asdict(self), block_length)

    @property
    def fairness(self) -> bool:
        return self.max_wait_s > 0


def problems_of(settings: dict, block_length: int | None = None) -> dict[str, str]:
    """``SchedulerConfig.problems`` for settings not yet made a config (every field given: a command
    line, a resource's spec), so that each caller can name the settings its own way (a flag, a field)."""
    budget, rows, mode = settings["token_budget"], settings["max_rows"], settings["admission"]
    efficiency, wait = settings["min_padding_efficiency"], settings["max_wait_s"]
    layout = settings.get("layout", DEFAULT_LAYOUT)
    batch_wait = settings.get("batch_max_wait_s", 0.0)
    batch_rows = settings.get("batch_max_rows", 0)
    window = settings.get("batch_window_s", BATCH_WINDOW_S)
    quota = settings.get("refresh_quota", DEFAULT_REFRESH_QUOTA)
    batch_quota = settings.get("batch_refresh_quota", DEFAULT_BATCH_REFRESH_QUOTA)
    interval, share = settings.get("refresh_interval", 0), settings.get("cache_share", 1.0)
    chunk = settings.get("prefill_chunk")
    checks = {
        "token_budget": (budget < 1, f"must be positive, got {budget}"),
        "max_rows": (rows < 1, f"must be positive, got {rows}"),
        "admission": (
            mode not in ADMISSION_MODES,
            f"must be one of {', '.join(ADMISSION_MODES)}, got {mode!r}",
        ),
        "min_padding_efficiency": (not 0.0 <= efficiency <= 1.0, f"must be in [0, 1], got {efficiency}"),
        "max_wait_s": (not wait >= 0.0, f"must be at least 0 seconds, got {wait}"),
        "batch_max_wait_s": (not batch_wait >= 0.0, f"must be at least 0 seconds, got {batch_wait}"),
        "batch_max_rows": (batch_rows < 0, f"must be at least 0, got {batch_rows}"),
        "layout": (layout not in LAYOUTS, f"must be one of {', '.join(LAYOUTS)}, got {layout!r}"),
        "batch_window_s": (
            not 0.0 <= window <= MAX_BATCH_WINDOW_S,
            f"must be in [0, {MAX_BATCH_WINDOW_S}] seconds, got {window}",
        ),
        "refresh_quota": (not 0.0 < quota <= 1.0, f"must be in (0, 1], got {quota}"),
        "batch_refresh_quota": (not 0.0 < batch_quota <= 1.0, f"must be in (0, 1], got {batch_quota}"),
        "refresh_interval": (interval < 0, f"must be at least 0 forwards, got {interval}"),
        "cache_share": (not 0.0 < share <= 1.0, f"must be in (0, 1], got {share}"),
        "prefill_chunk": (chunk is not None and chunk < 0, f"must be at least 0 tokens, got {chunk}"),
    }
    if block_length is not None and budget < block_length + 1:
        checks["token_budget"] = (True, f"{budget} cannot hold even one block of {block_length}")
    return {name: message for name, (failed, message) in checks.items() if failed}


DEFAULTS = SchedulerConfig()


def admission_flags(config: SchedulerConfig, cache_share: bool = True) -> list[str]:
    """The command line that asks another ``dllm`` command for ``config``'s admission (not its budget).
    ``cache_share`` False leaves ``--cache-share`` out, so that the command takes its ``--profile``'s."""
    return [
        *("--max-rows", str(config.max_rows), "--admission", config.admission),
        *(
            "--min-padding-efficiency",
            str(config.min_padding_efficiency),
            "--max-wait",
            str(config.max_wait_s),
        ),
        *("--batch-max-wait", str(config.batch_max_wait_s), "--batch-max-rows", str(config.batch_max_rows)),
        *("--layout", config.layout, "--batch-window", str(config.batch_window_s)),
        *(
            "--refresh-quota",
            str(config.refresh_quota),
            "--batch-refresh-quota",
            str(config.batch_refresh_quota),
        ),
        *("--refresh-interval", str(config.refresh_interval)),
        *(() if config.step_level else ("--no-step-level",)),
        *(() if config.prefill_chunk is None else ("--prefill-chunk", str(config.prefill_chunk))),
        *(("--cache-share", str(config.cache_share)) if cache_share else ()),
    ]
