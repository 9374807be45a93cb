"""Whose queue it is: ``dllm serve`` binds its queue (and so its data directory) to the model it serves.

The queue's Redis records the model last served on it (``ServiceKeys.served_model``). A start with
another model over work still waiting for the recorded one is refused, in one line naming both models and
the work, unless the user says what to do with that work: fail it (``--on-model-change fail``: each
waiting request then ends with an error that names both models, as a worker refuses a request stamped for
another model), or serve it first with the recorded model (``--exit-when-drained``).

On its own Redis, a start first drops the interactive requests left from before it: they were accepted by
the gateway of a ``dllm serve`` that is gone, and their clients' connections went with it, so nobody would
read their answers. Batches stay, to be served. The binding waits for a Redis that is loading its data (as
long as it loads) or that does not answer yet (up to ``UNREACHABLE_S``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from dllm_contracts.model_identity import ServedRecord
from dllm_contracts.queue.keys import ServiceKeys, request_of
from engine_pod.serve.queue_census import Census, interactive_entries

logger = logging.getLogger(__name__)
DRAIN_POLL_S = 1.0  # how often --exit-when-drained looks at the queue
UNREACHABLE_S = 30.0  # how long a start waits for a Redis that does not answer before it gives up


class QueueHeldError(ValueError):
    """The queue holds work accepted for another model; the message says what and how to go on."""


class QueueUnreachable(ValueError):
    """The queue's Redis did not answer within ``UNREACHABLE_S``; the message says where and why."""


@dataclass(frozen=True)
class WaitingWork:
    requests: int  # accepted and not done: pending in either lane, or in flight
    batches: int  # batches not yet ended (their lines may not all be queued yet)

    @property
    def empty(self) -> bool:
        return not (self.requests or self.batches)

    def __str__(self) -> str:
        return f"{_count(self.requests, 'request')} and {_count(self.batches, 'unfinished batch', 'es')}"


def _count(number: int, noun: str, plural: str = "s") -> str:
    return f"{number} {noun}{'' if number == 1 else plural}"


def waiting_work(client, keys: ServiceKeys) -> WaitingWork:
    return WaitingWork(int(client.scard(keys.live)), int(client.zcard(keys.batch_leases)))


def bind_queue(client, service: str, serving: ServedRecord, on_change: str, where: str) -> None:
    """Record ``serving`` as the queue's model, unless the queue holds work for another and
    ``on_change`` is "refuse" (``QueueHeldError``). ``where``: where the queue is kept, for the message."""
    keys = ServiceKeys(service)
    raw = client.get(keys.served_model)
    recorded = ServedRecord.from_json(raw) if raw else None
    if recorded is not None and recorded.identity != serving.identity:
        waiting = waiting_work(client, keys)
        if not waiting.empty and on_change == "refuse":
            raise QueueHeldError(
                f"the queue in {where} holds {waiting} accepted for the model {recorded.identity} "
                f"(--model {recorded.source}), not {serving.identity}: serve them first "
                f"(dllm serve --model {recorded.source} --exit-when-drained, with the same --data-dir or "
                "--redis-url), or pass --on-model-change fail to end them with an error"
            )
        if not waiting.empty:
            logger.warning(
                "%s waiting for the model %s will end with an error (--on-model-change fail)",
                waiting,
                recorded.identity,
            )
        else:
            logger.info("the queue served %s before; nothing of it waits", recorded.identity)
    client.set(keys.served_model, serving.to_json())


def drop_orphans(client, service: str) -> Census:
    """End every interactive request in the queue (a pending one at once, one in flight at its worker's next
    block), keeping batches: what was dropped."""
    from dllm_contracts.queue.ops import QueueOps
    from dllm_contracts.queue.sync_client import SyncQueue

    keys, ops = ServiceKeys(service), QueueOps(service)
    entries = interactive_entries(client, keys)
    if entries:
        SyncQueue(client, ops).run_all([ops.cancel(entry, 0) for entry in entries])
    dropped = Census(len({request_of(entry) for entry in entries}), len(entries), 0)
    if entries:
        logger.info(
            "dropped %s left from before the last stop: their clients were cut off with it (batches stay)",
            dropped,
        )
    return dropped


def ride_out(call: Callable[[], None], where: str, stopping: threading.Event | None = None) -> bool:
    """``call()`` once Redis lets it through: retried while Redis loads its data (as long as that takes) or
    does not answer (up to ``UNREACHABLE_S``: then ``QueueUnreachable``), each said once. False when
    ``stopping`` was set first (``call`` not done)."""
    from dllm_contracts.queue.resilience import TRANSIENT_ERRORS, Backoff, is_loading  # redis: not for --help

    give_up, backoff, said = time.monotonic() + UNREACHABLE_S, Backoff(max_s=1.0), set()
    while stopping is None or not stopping.is_set():
        try:
            call()
            return True
        except TRANSIENT_ERRORS as exc:
            loading = is_loading(exc)
            if not loading and time.monotonic() > give_up:
                raise QueueUnreachable(f"the queue's Redis ({where}) does not answer: {exc}") from None
            if loading not in said:
                said.add(loading)
                state = "is loading its data" if loading else f"does not answer ({exc})"
                logger.info("the queue's Redis (%s) %s; waiting", where, state)
            if loading:
                give_up = time.monotonic() + UNREACHABLE_S  # counted from when it stops loading
            time.sleep(backoff.next_delay())
    return False


def drained(client, service: str) -> bool:
    """Whether no accepted work waits on the queue (what ``--exit-when-drained`` waits for)."""
    return waiting_work(client, ServiceKeys(service)).empty


class QueueOwner:
    """``dllm serve``'s side of it: binds the queue before the worker starts (on its own Redis, having
    dropped what earlier clients left), and with ``--exit-when-drained`` stops the supervisor once nothing
    waits."""

    def __init__(
        self, redis_url: str, service: str, serving: ServedRecord, where: str, private: bool = False
    ) -> None:
        self.redis_url, self.service, self.serving, self.where = redis_url, service, serving, where
        self.private = private  # dllm serve's own Redis: no gateway but its own ever waits on this queue

    def _client(self):
        from dllm_contracts.queue.connect import sync_client

        return sync_client(self.redis_url, socket_timeout=10, socket_connect_timeout=10)

    def bind(self, on_change: str, stopping: threading.Event | None = None) -> None:
        """See the class; returns early, unbound, when ``stopping`` is set meanwhile."""
        client = self._client()
        steps = [lambda: bind_queue(client, self.service, self.serving, on_change, self.where)]
        if self.private:
            steps.insert(0, lambda: drop_orphans(client, self.service))
        try:
            for step in steps:
                if not ride_out(step, self.where, stopping):
                    return
        finally:
            client.close()

    def stop_when_drained(self, supervisor) -> None:
        """A thread that stops ``supervisor`` (a drain, as Ctrl-C does) once no accepted work waits."""
        import threading

        def watch() -> None:
            client = self._client()
            try:
                while not supervisor.stopping.wait(DRAIN_POLL_S):
                    try:
                        if drained(client, self.service):
                            logger.info(
                                "drained: no accepted work waits for %s; stopping", self.serving.identity
                            )
                            supervisor.stop()
                            return
                    except Exception as exc:  # noqa: BLE001 (Redis restarting: look again)
                        logger.debug("drain check: %s", exc)
            finally:
                client.close()

        threading.Thread(target=watch, name="drain-watch", daemon=True).start()
