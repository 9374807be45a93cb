"""A worker's warm prefixes, computed into the block prefix cache and pinned before it claims any work.

Each prefix's whole blocks are computed once (the runner's ``warm_prefix``: one forward, as a request's
first) and pinned: eviction never drops them. Their pages come out of the token budget: the scheduler
admits rows against the budget less the pinned tokens, and in a packed batch a row whose prompt starts
with a warm prefix costs nothing more for its pinned blocks (as blocks the batch's rows share). Prefixes
that would leave no room for a request of one token and one block are refused in one line.
"""

from __future__ import annotations

import logging

from engine_pod.runner.contract import Runner
from engine_pod.scheduler.base import Scheduler
from engine_pod.scheduler.shared_blocks import PinnedBlocks
from engine_pod.scheduler.warm_prefixes import warm_prefix_problem

logger = logging.getLogger(__name__)


def check_warm_prefixes(runner: Runner, scheduler: Scheduler, prefixes: tuple[tuple[int, ...], ...]) -> None:
    """Refuse, in one line, warm prefixes this model, policy or budget cannot hold."""
    family, decoding = runner.loaded.family, runner.decoding
    problem = warm_prefix_problem(
        family.display_name, family.kind.name, decoding.cache, decoding.prefix_cache
    )
    if problem is not None:
        raise ValueError(problem)
    if not hasattr(scheduler, "pin_prefix"):
        raise ValueError("--warm-prefix needs a policy with a token budget (blockserve)")
    L, budget = decoding.block_length, scheduler.config.token_budget
    pinned = PinnedBlocks()
    for prefix in prefixes:
        pinned.add(list(prefix), L)
    if pinned.tokens + L + 1 > budget:
        raise ValueError(
            f"the warm prefixes hold {pinned.tokens} tokens of whole blocks, which leaves the token budget "
            f"{budget} no room for a request (at least {L + 1} tokens): raise the budget or warm less"
        )


def pin_warm_prefixes(runner: Runner, scheduler: Scheduler, prefixes: tuple[tuple[int, ...], ...]) -> int:
    """Compute and pin every prefix's whole blocks (runner and scheduler alike); returns the tokens pinned."""
    if not prefixes:
        return 0
    check_warm_prefixes(runner, scheduler, prefixes)
    L, pinned = runner.decoding.block_length, 0
    for number, prefix in enumerate(prefixes, 1):
        if len(prefix) < L:
            logger.warning(
                "warm prefix %d has %d tokens, less than a block (%d): nothing of it is cached",
                number,
                len(prefix),
                L,
            )
        runner.warm_prefix(list(prefix))
        pinned += scheduler.pin_prefix(list(prefix))
    logger.info(
        "warmed %d prefix(es): %d tokens (%d blocks of %d) pinned in the prefix cache; the token budget "
        "left for requests is %d of %d",
        len(prefixes),
        pinned,
        pinned // L,
        L,
        scheduler.token_budget,
        scheduler.config.token_budget,
    )
    return pinned
