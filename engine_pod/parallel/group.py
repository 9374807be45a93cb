"""A tensor-parallel group: this process's rank among the group's processes, how the model is spread over
them (its layout: tensor parallelism, expert parallelism or both), and the collectives a sharded model makes
(torch.distributed: gloo on CPUs, NCCL on GPUs), counted with the bytes each rank puts into them.

A rank that dies ends the others' next collective at once (its connections close). On CPUs a collective
waits for the slowest rank however long it computes, and ends with GroupFailed once it has waited the
group's timeout and no other rank has made progress for as long (``parallel/progress.py``: a rank stopped,
frozen or waiting for something that never comes); on GPUs each collective is bounded by the timeout. So
the whole group ends rather than waiting forever, and a slow machine is not mistaken for a hung one. A
follower waits for the leader's next message under the same rule, so an idle leader sends one every
``pulse_s`` (runner/tensor_parallel.py): an idle group stays up. Until the group has started (``started``:
rank 0 has told the others their runner), its collectives wait up to ``START_TIMEOUT_S`` instead: the ranks
of a multi-node group start as their pods do, and load their shards at their own pace.
"""

from __future__ import annotations

import contextlib
import pickle
import socket
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from engine_pod.parallel.layout import GroupLayout
from engine_pod.parallel.progress import GroupProgress, StalledGroup

COLLECTIVE_TIMEOUT_S = 30.0  # how long a collective waits while no other rank makes progress
START_TIMEOUT_S = 600.0  # how long joining and the collectives before the runner starts wait
PULSES_PER_TIMEOUT = 6  # an idle leader's keep-alive messages within one collective timeout


class GroupFailed(ConnectionError):
    """A rank of the group stopped or stopped answering: the whole group ends."""


TIMEOUT_SHARE = 0.9  # a collective that failed after this share of its timeout ran out of time


@contextlib.contextmanager
def _collective(kind: str, timeout_s: float) -> Iterator[None]:
    """A collective whose failure (a rank gone, or silent past ``timeout_s``) ends this rank in one line
    that says which of the two happened."""
    began = time.monotonic()
    try:
        yield
    except RuntimeError as exc:  # gloo and NCCL report a lost peer or a timeout as RuntimeError
        raise GroupFailed(failure_line(kind, timeout_s, time.monotonic() - began, exc)) from None


def failure_line(kind: str, timeout_s: float, waited_s: float, exc: BaseException) -> str:
    """What a failed collective says: a rank that did not answer within the timeout (the collective ran
    out of time, or the library says it timed out), or a rank that stopped (its connection closed before)."""
    text = str(exc).strip()
    reason = text.splitlines()[0][:200] if text else type(exc).__name__
    lowered = text.lower()
    timed_out = waited_s >= TIMEOUT_SHARE * timeout_s or "timed out" in lowered or "timeout" in lowered
    if timed_out:
        what = f"a rank did not answer within {timeout_s:.0f} s"
    else:
        what = f"a rank stopped (its connection closed after {waited_s:.1f} s)"
    return f"the tensor-parallel group failed in {kind}: {what} ({reason})"


@dataclass
class TensorParallel:
    """This process's place in a group of ``size`` processes (rank 0 decides; the others follow), how the
    model is spread over them (``layout``), and how many collectives it has made and the bytes it put into
    them, by kind."""

    rank: int = 0
    size: int = 1
    counts: Counter = field(default_factory=Counter)
    timeout_s: float = COLLECTIVE_TIMEOUT_S  # how long each collective waits for the other ranks
    steady: Any = None  # the process group with that timeout (None: the default one, which waits longer)
    starting: bool = True  # collectives run in the default group, under START_TIMEOUT_S, until started()
    layout: GroupLayout | None = None  # None: tensor parallelism over all ``size`` ranks
    sent: Counter = field(default_factory=Counter)  # bytes this rank put into collectives, by kind
    # the others' progress (CPUs): a running group's waits end when it stops, not at a fixed time (None:
    # each collective is bounded by ``timeout_s``)
    progress: GroupProgress | None = None

    def __post_init__(self) -> None:
        if self.layout is None:
            self.layout = GroupLayout(tensor=self.size)
        if self.layout.ranks != self.size:
            raise ValueError(f"a group of {self.size} ranks cannot hold {self.layout.describe()}")

    @property
    def tensor_size(self) -> int:
        """Ranks the dense parts (attention, dense MLPs, the vocabulary) are split over: 1 where repeated."""
        return self.size if self.layout.dense_split else 1

    @property
    def tensor_rank(self) -> int:
        return self.rank if self.layout.dense_split else 0

    @property
    def expert_sets(self) -> int:
        """Sets of ranks the routed experts are spread over (each holds experts / sets whole experts)."""
        return self.layout.expert

    @property
    def expert_set(self) -> int:
        """The set of experts this rank holds."""
        return self.rank // self.expert_width_ranks

    @property
    def expert_width_ranks(self) -> int:
        """Ranks each held expert is split over by width (tensor parallelism inside the experts)."""
        return self.size // self.layout.expert

    @property
    def expert_width_rank(self) -> int:
        return self.rank % self.expert_width_ranks

    def clear_counts(self) -> None:
        """Start counting collectives and bytes again."""
        self.counts.clear()
        self.sent.clear()

    def started(self) -> None:
        """The group runs: from here on every collective waits as ``join_group`` says (every rank calls it
        at the same point: after the runner's message)."""
        self.starting = False

    @property
    def _group(self) -> Any:
        return None if self.starting else self.steady

    def _run(self, kind: str, collective, *args: Any, **kwargs: Any) -> None:
        """``collective`` (a torch.distributed one) over the group: until it has started, bounded by
        START_TIMEOUT_S; then, on CPUs, for as long as another rank makes progress (GroupProgress), else
        by ``timeout_s``. A failure ends this rank in one line (GroupFailed) that says what happened."""
        group = self._group
        by_progress = self.progress is not None and group is not None
        bound = START_TIMEOUT_S if self.starting or self.steady is None else self.timeout_s
        with _collective(kind, START_TIMEOUT_S if by_progress else bound):
            if not by_progress:
                collective(*args, group=group, **kwargs)
                return
            began = time.monotonic()
            try:
                self.progress.wait(collective(*args, group=group, async_op=True, **kwargs), began)
            except StalledGroup as stalled:
                group.abort()  # the collective waits no more: the group can be left at once
                what = f"a rank did not answer within {self.timeout_s:.0f} s ({stalled})"
                raise GroupFailed(f"the tensor-parallel group failed in {kind}: {what}") from None

    @property
    def leads(self) -> bool:
        return self.rank == 0

    @property
    def pulse_s(self) -> float:
        """How often an idle leader tells the followers it is there: well within the timeout their wait
        for its next message has."""
        return self.timeout_s / PULSES_PER_TIMEOUT

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` summed over the ranks, in place."""
        if self.size > 1:
            self.counts["all_reduce"] += 1
            self.sent["all_reduce"] += tensor.numel() * tensor.element_size()
            self._run("an all-reduce", dist.all_reduce, tensor)
        return tensor

    def max_of(self, value: int) -> int:
        """The largest of every rank's ``value``."""
        if self.size == 1:
            return value
        self.counts["max"] += 1
        box = torch.tensor([value], dtype=torch.long)
        self.sent["max"] += box.element_size()
        self._run("an all-reduce", dist.all_reduce, box, op=dist.ReduceOp.MAX)
        return int(box.item())

    def all_gather_last(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every rank's ``tensor`` side by side along its last dimension, in rank order."""
        if self.size == 1:
            return tensor
        self.counts["all_gather"] += 1
        tensor = tensor.contiguous()
        self.sent["all_gather"] += tensor.numel() * tensor.element_size()
        parts = [torch.empty_like(tensor) for _ in range(self.size)]
        self._run("an all-gather", dist.all_gather, parts, tensor)
        return torch.cat(parts, -1)

    def broadcast(self, message: Any = None) -> Any:
        """Rank 0's ``message`` (a picklable object), on every rank."""
        if self.size == 1:
            return message
        self.counts["broadcast"] += 1
        payload = pickle.dumps(message) if self.leads else b""
        length = torch.tensor([len(payload)], dtype=torch.long)
        self._run("a broadcast", dist.broadcast, length, src=0)
        if self.leads:
            data = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        else:
            data = torch.empty(int(length.item()), dtype=torch.uint8)
        self._run("a broadcast", dist.broadcast, data, src=0)
        return message if self.leads else pickle.loads(data.numpy().tobytes())


SINGLE = TensorParallel()  # one process: every collective is the identity


def free_address() -> str:
    """A loopback address with a free port, for a group's rendezvous."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


def join_group(
    rank: int,
    size: int,
    address: str,
    device: torch.device,
    timeout_s: float = COLLECTIVE_TIMEOUT_S,
    layout: GroupLayout | None = None,
) -> TensorParallel:
    """Join the group at ``address`` as ``rank`` of ``size`` (NCCL on GPUs, gloo elsewhere), the model
    spread by ``layout`` (None: tensor parallelism over every rank): waiting for the others up to
    START_TIMEOUT_S; each collective after ``started``, on CPUs, while another rank makes progress or up
    to ``timeout_s`` since the last did (up to START_TIMEOUT_S in all), on GPUs up to ``timeout_s``."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    with _collective("joining the group", START_TIMEOUT_S):
        dist.init_process_group(
            backend,
            init_method=f"tcp://{address}",
            rank=rank,
            world_size=size,
            timeout=timedelta(seconds=START_TIMEOUT_S),
        )
        by_progress = backend == "gloo"  # NCCL's collectives run on the device: each bounded as it is
        bound = START_TIMEOUT_S if by_progress else timeout_s
        steady = dist.new_group(list(range(size)), timeout=timedelta(seconds=bound), backend=backend)
    progress = GroupProgress(rank, size, address, timeout_s) if by_progress else None
    if progress is not None:
        _watching.append(progress)
    parallel = TensorParallel(
        rank, size, timeout_s=timeout_s, steady=steady, layout=layout, progress=progress
    )
    return parallel


_watching: list[GroupProgress] = []  # this process's group's progress thread (stopped when it leaves)


def leave_group() -> None:
    while _watching:
        _watching.pop().stop()
    if dist.is_initialized():
        dist.destroy_process_group()
