"""The processes of a tensor- or expert-parallel group: on each of its machines (nodes) the calling process
is the machine's first rank and checks that the group can be (its sizes, the model's split, each machine's
memory) before it spawns the others, each loading its shard of the model; rank 0 (node 0's calling
process) leads and every other rank follows it (runner/tensor_parallel.py). On a GPU machine its ranks use
``cuda:0`` on (counted from the device named); on CPUs every rank uses the CPU with its share of the
threads (gloo). One machine: the group meets on a free loopback port; several: at node 0's address.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from engine_pod.families.registry import family_of, registered_families
from engine_pod.loading.loader import LoadedModel, check_weights_fit, load_model, parse_dtype
from engine_pod.loading.sharded import build_part, load_shard, model_plan, source_config
from engine_pod.models.config import ModelConfigError
from engine_pod.parallel.group import (
    COLLECTIVE_TIMEOUT_S,
    TensorParallel,
    free_address,
    join_group,
    leave_group,
)
from engine_pod.parallel.place import GroupPlace
from engine_pod.runner.factory import make_runner
from engine_pod.runner.tensor_parallel import STOP, follow

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelArgs:
    """What every rank loads: the model's source, device, dtype, seed and family, and each rank's threads."""

    spec: str
    device: str = "cpu"
    dtype: str = "float32"
    seed: int = 0
    family: str | None = None
    threads: int = 1

    def on_rank(self, local: int) -> str:
        """The device of this machine's ``local``-th rank: counted from the CUDA device named, the CPU as it is."""
        device = torch.device(self.device)
        return f"cuda:{(device.index or 0) + local}" if device.type == "cuda" else self.device


def check_group(place: GroupPlace, model: ModelArgs) -> None:
    """Refuse, in one line and before any rank starts, a group the model cannot be spread over (a family
    that does not split, or has no experts to spread; sizes that do not divide its heads, widths or
    experts) or whose ranks on this machine cannot hold their shares (``loading/memory_check.py``)."""
    parallel = TensorParallel(place.first, place.size, layout=place.layout)
    config, _ = source_config(model.spec, model.family)
    record = family_of(config)
    if place.expert > 1 and not record.expert_parallel:
        spreads = [family.display_name for family in registered_families() if family.expert_parallel]
        raise ModelConfigError(
            f"--expert-parallel {place.expert}: {record.display_name} has no experts to spread (expert "
            f"parallelism is for {' and '.join(spreads)})"
        )
    plan = model_plan(config, parallel)  # the family's split: refuses what does not divide
    device = torch.device(model.on_rank(0))
    if device.type != "meta":
        shares = sum(p.numel() for p in build_part(plan).parameters())
        for local in range(place.per_node if device.type == "cuda" else 1):
            rank_device = torch.device(model.on_rank(local))
            ranks_here = 1 if device.type == "cuda" else place.per_node
            check_weights_fit(config, rank_device, parse_dtype(model.dtype), shares, ranks_here)


@contextlib.contextmanager
def tensor_parallel_group(place: GroupPlace, model: ModelArgs) -> Iterator[LoadedModel]:
    """This machine's first rank's shard of the model (the whole model for one rank), its other ranks
    spawned and following rank 0. Rank 0 leads: on leaving, it tells every rank to stop and its own are
    waited for (killed past the collective timeout). Another node's first rank follows (the caller runs
    ``follow``). What the group cannot be is refused before any rank starts (``check_group``)."""
    if place.size == 1:
        yield load_model(model.spec, model.device, model.dtype, model.seed, model.family)
        return
    check_group(place, model)
    address, size, first = place.address or free_address(), place.size, place.first
    spawn = multiprocessing.get_context("spawn")
    followers = [
        spawn.Process(target=_follower, args=(first + i, place, address, model, i), daemon=True)
        for i in range(1, place.per_node)
    ]
    for process in followers:
        process.start()
    try:
        parallel = join_group(first, size, address, torch.device(model.on_rank(0)), layout=place.layout)
        loaded = load_shard(model.spec, parallel, model.on_rank(0), model.dtype, model.seed, model.family)
        yield loaded
        if parallel.leads:
            parallel.broadcast(STOP)
        for process in followers:
            process.join(timeout=COLLECTIVE_TIMEOUT_S)
    finally:  # a failure (or a follower that did not stop) ends every rank now
        for process in followers:
            if process.is_alive():
                process.kill()
                process.join()
        leave_group()


def _follower(rank: int, place: GroupPlace, address: str, model: ModelArgs, local: int) -> None:
    """A spawned rank (``local``: its place on this machine): join, load its shard, follow rank 0 until told
    to stop; an error ends it in one line (rank 0 reports the group's failure)."""
    torch.set_num_threads(model.threads)
    try:
        device = torch.device(model.on_rank(local))
        parallel = join_group(rank, place.size, address, device, layout=place.layout)
        loaded = load_shard(model.spec, parallel, model.on_rank(local), model.dtype, model.seed, model.family)
        follow(loaded, make_runner)
    except Exception as exc:  # noqa: BLE001 - a rank's failure ends it with one line, not a traceback
        logger.error("tensor-parallel rank %d stopped: %s", rank, exc)
        sys.exit(1)
    finally:
        leave_group()
