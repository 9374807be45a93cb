"""The processes of a tensor-parallel group: on each of its machines (nodes) the calling process is the
machine's first rank and spawns the others, each loading its shard of the model; rank 0 (node 0's calling
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

from engine_pod.loading.loader import LoadedModel, load_model
from engine_pod.loading.sharded import load_shard
from engine_pod.parallel.group import COLLECTIVE_TIMEOUT_S, free_address, join_group, leave_group
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


@dataclass(frozen=True)
class GroupPlace:
    """A group of ``size`` ranks over ``nodes`` machines, this one ``node`` (its ranks ``first`` to
    ``first + per_node - 1``), meeting at ``address`` (node 0's HOST:PORT; None on one machine)."""

    size: int = 1
    nodes: int = 1
    node: int = 0
    address: str | None = None

    def __post_init__(self) -> None:
        if self.size < 1 or self.nodes < 1 or self.size % self.nodes:
            raise ValueError(f"--tensor-parallel {self.size} must be a multiple of --nodes {self.nodes}")
        if not 0 <= self.node < self.nodes:
            raise ValueError(f"--node-rank {self.node} must be below --nodes {self.nodes}")
        if self.nodes > 1 and not self.address:
            raise ValueError("a group over several nodes needs --group-address (node 0's HOST:PORT)")

    @property
    def per_node(self) -> int:
        return self.size // self.nodes

    @property
    def first(self) -> int:
        return self.node * self.per_node


@contextlib.contextmanager
def tensor_parallel_group(place: GroupPlace, model: ModelArgs) -> Iterator[LoadedModel]:
    """This machine's first rank's shard of the model (the whole model for one rank), its other ranks
    spawned and following rank 0. Rank 0 leads: on leaving, it tells every rank to stop and its own are
    waited for (killed past the collective timeout). Another node's first rank follows (the caller runs
    ``follow``)."""
    if place.size == 1:
        yield load_model(model.spec, model.device, model.dtype, model.seed, model.family)
        return
    address, size, first = place.address or free_address(), place.size, place.first
    spawn = multiprocessing.get_context("spawn")
    followers = [
        spawn.Process(target=_follower, args=(first + i, size, address, model, i), daemon=True)
        for i in range(1, place.per_node)
    ]
    for process in followers:
        process.start()
    try:
        parallel = join_group(first, size, address, torch.device(model.on_rank(0)))
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


def _follower(rank: int, size: int, address: str, model: ModelArgs, local: int) -> None:
    """A spawned rank (``local``: its place on this machine): join, load its shard, follow rank 0 until told
    to stop; an error ends it in one line (rank 0 reports the group's failure)."""
    torch.set_num_threads(model.threads)
    try:
        parallel = join_group(rank, size, address, torch.device(model.on_rank(local)))
        loaded = load_shard(model.spec, parallel, model.on_rank(local), model.dtype, model.seed, model.family)
        follow(loaded, make_runner)
    except Exception as exc:  # noqa: BLE001 - a rank's failure ends it with one line, not a traceback
        logger.error("tensor-parallel rank %d stopped: %s", rank, exc)
        sys.exit(1)
    finally:
        leave_group()
