"""Whose queue it is: ``dllm serve`` binds its queue (and so its data directory) to the model it serves.

The queue's Redis records the model last served on it (``ServiceKeys.served_model``). A start with
another model over work still waiting for the recorded one is refused, in one line naming both models and
the work, unless the user says what to do with that work: fail it (``--on-model-change fail``: each
waiting request then ends with an error that names both models, as a worker refuses a request stamped for
another model), or serve it first with the recorded model (``--exit-when-drained``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from dllm_contracts.model_identity import ServedRecord
from dllm_contracts.queue.keys import ServiceKeys

logger = logging.getLogger(__name__)
ON_MODEL_CHANGE = ("refuse", "fail")  # what a start with another model does with the work waiting
DRAIN_POLL_S = 1.0  # how often --exit-when-drained looks at the queue


class QueueHeldError(ValueError):
    """The queue holds work accepted for another model; the message says what and how to go on."""


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


def drained(client, service: str) -> bool:
    """Whether no accepted work waits on the queue (what ``--exit-when-drained`` waits for)."""
    return waiting_work(client, ServiceKeys(service)).empty


class QueueOwner:
    """``dllm serve``'s side of it: binds the queue before the worker starts, and with
    ``--exit-when-drained`` stops the supervisor once nothing waits."""

    def __init__(self, redis_url: str, service: str, serving: ServedRecord, where: str) -> None:
        self.redis_url, self.service, self.serving, self.where = redis_url, service, serving, where

    def _client(self):
        from dllm_contracts.queue.connect import sync_client

        return sync_client(self.redis_url, socket_timeout=10, socket_connect_timeout=10)

    def bind(self, on_change: str) -> None:
        client = self._client()
        try:
            bind_queue(client, self.service, self.serving, on_change, self.where)
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
