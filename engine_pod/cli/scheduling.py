"""BlockServe's flags (``dllm bench``, ``dllm worker``, ``dllm serve``): defaults and ranges come from
``SchedulerConfig``, the one home of both."""

from __future__ import annotations

import argparse
import logging

from dllm_contracts.head_sparse_config import memory_settings
from dllm_contracts.profile_summary import ProfileSummary
from dllm_contracts.scheduler_config import (
    ADMISSION_MODES,
    BURST_QUIET_S,
    DEFAULTS,
    LAYOUTS,
    SchedulerConfig,
    problems_of,
)
from engine_pod.cli.budget import add_budget_args, read_profile, resolve_budget
from engine_pod.cli.common import CliError
from engine_pod.cli.prefill_chunk_arg import prefill_chunk_setting, prefill_chunk_settings
from engine_pod.cli.sparse_args import SPARSE_FLAGS, sparse_settings

logger = logging.getLogger(__name__)


def add_scheduler_args(parser: argparse.ArgumentParser, compare: bool = False) -> None:
    """The token budget (``--token-budget`` or ``--profile``) and BlockServe's admission settings;
    ``compare`` (a benchmark's): ``--prefill-chunk`` takes a comma list, every policy run with each."""
    add_budget_args(parser)
    group = parser.add_argument_group("BlockServe admission")
    group.add_argument(
        "--max-rows",
        type=int,
        default=DEFAULTS.max_rows,
        help=f"most active rows (default: {DEFAULTS.max_rows})",
    )
    group.add_argument(
        "--admission",
        choices=ADMISSION_MODES,
        default=DEFAULTS.admission,
        help="preempt: admit against the next widths, preempting rows that outgrow the budget; projected: "
        f"against each row's peak width (default: {DEFAULTS.admission})",
    )
    group.add_argument(
        "--min-padding-efficiency",
        type=float,
        default=DEFAULTS.min_padding_efficiency,
        help="widen the box for a longer prompt only while this share of positions stays useful "
        f"(default: {DEFAULTS.min_padding_efficiency}; 0: admission limited by the token budget alone)",
    )
    group.add_argument(
        "--layout",
        choices=LAYOUTS,
        default=DEFAULTS.layout,
        help="packed: rows concatenated with no padding, a batch costs the sum of its rows' widths; dense: "
        f"rows left-padded to the widest, a batch costs rows x widest (default: {DEFAULTS.layout})",
    )
    group.add_argument(
        "--max-wait",
        type=float,
        default=DEFAULTS.max_wait_s,
        help="seconds a request may wait after it was enqueued before it is admitted next, whatever its "
        f"width (default: {DEFAULTS.max_wait_s}; 0: no fairness bound)",
    )
    group.add_argument(
        "--batch-max-wait",
        type=float,
        default=DEFAULTS.batch_max_wait_s,
        help="batch lines run in the capacity interactive requests leave; one queued longer than this many "
        f"seconds is admitted as an aged request (default: {DEFAULTS.batch_max_wait_s}; 0: never)",
    )
    group.add_argument(
        "--batch-max-rows",
        type=int,
        default=DEFAULTS.batch_max_rows,
        help="batch lines a worker runs at a time at most, beside interactive requests "
        f"(default: {DEFAULTS.batch_max_rows}; 0: as many as the budget holds)",
    )
    group.add_argument(
        "--batch-window",
        type=float,
        default=DEFAULTS.batch_window_s,
        help="seconds an idle worker woken by new work waits while more keeps arriving, so that a burst "
        f"starts as one batch (default: {DEFAULTS.batch_window_s}; a pause of {BURST_QUIET_S * 1000:g} ms "
        "ends it; 0: claim at once)",
    )
    group.add_argument(
        "--prefill-chunk",
        type=prefill_chunk_settings if compare else prefill_chunk_setting,
        default=(None,) if compare else None,
        metavar="TOKENS" + ("[,TOKENS...]" if compare else ""),
        help="block-diffusion models (LLaDA2.0, SDAR) and DiffusionGemma's context encoder: compute a long "
        "prompt's keys and values this many tokens (whole blocks) per block cycle, beside the decoding "
        "rows, so that it does not stall them; LLaDA: a row wider than twice this refreshes its dual cache a "
        "few layers per cycle (as many pieces as it has chunks, at most one per layer) "
        "(default, or auto: 512, or an eighth of the token budget if smaller; 0 or off: the whole prompt "
        "at once)" + ("; a comma list (off,512,256) runs every policy with each" if compare else ""),
    )
    phases = parser.add_argument_group("dLLM-Serve phases (--policy dllm-serve)")
    phases.add_argument(
        "--refresh-quota",
        type=float,
        default=DEFAULTS.refresh_quota,
        help="share of the token budget one step may spend on refreshes while an interactive request runs "
        f"(default: {DEFAULTS.refresh_quota})",
    )
    phases.add_argument(
        "--batch-refresh-quota",
        type=float,
        default=DEFAULTS.batch_refresh_quota,
        help="the same while only batch lines run; a request must refresh within the smaller of the two "
        f"quotas (default: {DEFAULTS.batch_refresh_quota})",
    )
    phases.add_argument(
        "--refresh-interval",
        type=int,
        default=DEFAULTS.refresh_interval,
        help="a row refreshes its cache every this many of its forwards as well as at its block's first "
        f"(default: {DEFAULTS.refresh_interval}: at the first only)",
    )
    phases.add_argument(
        "--step-level",
        action=argparse.BooleanOptionalAction,
        default=DEFAULTS.step_level,
        help="end a cycle at the first step after which a row's block is complete, the others carrying "
        "their blocks on, so that rows start their next block and new requests join at that step "
        "(default: on; --no-step-level: at block boundaries only)",
    )
    phases.add_argument(
        "--cache-share",
        type=float,
        default=None,
        help="share of a token's profiled peak memory its cache holds (the rest is the refresh forward's): "
        "dLLM-Serve admits more cached tokens the lower it is (default: the --profile's, where it "
        f"measured one, else {DEFAULTS.cache_share}: admit as BlockServe)",
    )


FLAGS = {
    "token_budget": "--token-budget",
    "max_rows": "--max-rows",
    "admission": "--admission",
    "min_padding_efficiency": "--min-padding-efficiency",
    "max_wait_s": "--max-wait",
    "batch_max_wait_s": "--batch-max-wait",
    "batch_max_rows": "--batch-max-rows",
    "layout": "--layout",
    "batch_window_s": "--batch-window",
    "refresh_quota": "--refresh-quota",
    "batch_refresh_quota": "--batch-refresh-quota",
    "refresh_interval": "--refresh-interval",
    "cache_share": "--cache-share",
    "step_level": "--step-level",
    "prefill_chunk": "--prefill-chunk",
}  # SchedulerConfig's field -> the flag that sets it


def _cache_share(args: argparse.Namespace, profile) -> float:
    """--cache-share, else the profile's measure, else the default (admit as BlockServe)."""
    if args.cache_share is not None:
        return args.cache_share
    if profile is not None and profile.cache_share is not None:
        return profile.cache_share
    return DEFAULTS.cache_share


def scheduler_config(args: argparse.Namespace) -> SchedulerConfig:
    """The validated settings; a bad one is a CliError naming its flag."""
    profile = read_profile(args.profile) if args.profile else None
    if profile is not None:
        _check_profile_fits(args, profile)
    settings = dict(
        token_budget=resolve_budget(args),
        max_rows=args.max_rows,
        admission=args.admission,
        min_padding_efficiency=args.min_padding_efficiency,
        max_wait_s=args.max_wait,
        batch_max_wait_s=args.batch_max_wait,
        batch_max_rows=args.batch_max_rows,
        layout=args.layout,
        batch_window_s=args.batch_window,
        refresh_quota=args.refresh_quota,
        batch_refresh_quota=args.batch_refresh_quota,
        refresh_interval=args.refresh_interval,
        cache_share=_cache_share(args, profile),
        step_level=args.step_level,
        prefill_chunk=_first(args.prefill_chunk),
    )
    problems = problems_of(settings)
    if problems:
        raise CliError("; ".join(f"{FLAGS[name]} {message}" for name, message in problems.items()))
    return SchedulerConfig(**settings)


def _first(chunk):
    """A benchmark's ``--prefill-chunk`` is a tuple (one run per size): the config takes its first; the
    benchmark replaces it for each run."""
    return chunk[0] if isinstance(chunk, tuple) else chunk


def _check_profile_fits(args: argparse.Namespace, profile: ProfileSummary) -> None:
    """A profile's budget holds for the layout and the tensor-parallel size it was measured at only."""
    if profile.layout is not None and profile.layout != args.layout:
        raise CliError(
            f"--profile {args.profile} counts tokens of the {profile.layout} layout: run with --layout "
            f"{profile.layout}, or profile again with --layout {args.layout}"
        )
    _check_profile_sparse(args, profile)
    ranks, experts = getattr(args, "tensor_parallel", 1), getattr(args, "expert_parallel", 1)
    if (profile.tensor_parallel, profile.expert_parallel) != (ranks, experts):
        asked = ProfileSummary(1, tensor_parallel=ranks, expert_parallel=experts).sizes()
        raise CliError(
            f"--profile {args.profile} was measured at {profile.sizes()} (its budget is per rank of a group "
            f"of that size): run with {profile.sizes()}, or profile again with {asked}"
        )


def _sparse_words(settings: dict | None) -> str:
    if settings is None:
        return "--sparse-cache off"
    return " ".join(f"{SPARSE_FLAGS[name]} {value}" for name, value in settings.items())


_WARNED_DENSE: set[str] = set()  # dense profiles already warned about under a sparse cache


def _check_profile_sparse(args: argparse.Namespace, profile: ProfileSummary) -> None:
    """A budget measured with a head-sparse cache holds for those settings only: refused with others (the
    dense cache holds every position of a row, a higher retention more of them). One measured with the
    dense cache is warned about under a sparse cache: it does not count what the refresh's scoring adds,
    and a sparse cache holds less, so it may be above or below what the cache needs."""
    if profile.source != "measured":
        return
    asked = memory_settings(sparse_settings(args)) if hasattr(args, "sparse_cache") else None
    if profile.sparse_cache is None and asked is not None:
        if args.profile in _WARNED_DENSE:
            return
        _WARNED_DENSE.add(args.profile)  # once per process, however often the settings are read
        logger.warning(
            "--profile %s was measured with the dense cache, not %s: profile with those flags to measure "
            "the token budget the sparse cache holds",
            args.profile,
            _sparse_words(asked),
        )
    elif asked != profile.sparse_cache:
        raise CliError(
            f"--profile {args.profile} was measured with {_sparse_words(profile.sparse_cache)}: run with "
            f"those settings, or profile again with {_sparse_words(asked)}"
        )


def check_stagger(args: argparse.Namespace) -> None:
    """dllm-serve's model and decoding, refused in one line before any run."""
    from dllm_contracts.run_rules import stagger_problem
    from engine_pod.families.registry import family_of
    from engine_pod.loading.loader import load_metadata

    family = family_of(load_metadata(args.model, args.family)[0])
    problem = stagger_problem(family.display_name, family.kind.name, args.cache, args.remasking)
    if problem:
        raise CliError(problem)
