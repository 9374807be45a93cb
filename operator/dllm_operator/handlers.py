"""Kopf handlers: small decorated functions that call the reconciler and write status and events."""

from __future__ import annotations

import logging

import kopf

from dllm_operator.config import GROUP, PLURAL, VERSION, OperatorSettings
from dllm_operator.k8s import KubeClient
from dllm_operator.reconcile import Outcome, Reconciler

RESYNC_S = OperatorSettings.from_env().resync_seconds  # the timer's period is fixed when handlers register
WATCH_TIMEOUT_S = 60  # a watch the API server leaves silent is re-opened after this long
TIMER_EXIT_POLL_S = 1.0  # how often a deletion looks whether the resync under way has ended
_state: dict[str, Reconciler] = {}


def reconciler() -> Reconciler:
    """One reconciler per operator run, built from the environment when first needed."""
    if "r" not in _state:
        settings = OperatorSettings.from_env()
        _state["r"] = Reconciler(settings, KubeClient.from_settings(settings))
    return _state["r"]


def reset() -> None:
    """Forget the reconciler (a new operator run in the same process reads the environment again)."""
    _state.clear()


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_) -> None:
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=GROUP)
    settings.posting.level = logging.INFO
    settings.watching.server_timeout = WATCH_TIMEOUT_S
    # a resync under way when the service is deleted ends within one reconcile (deletion_guard.py): look
    # again this often whether it has, before the finalizer goes (Kopf's default waits a minute)
    settings.background.cancellation_polling = TIMER_EXIT_POLL_S


@kopf.on.login()
def login(**kwargs):
    api_url = OperatorSettings.from_env().api_url
    if api_url:
        return kopf.ConnectionInfo(server=api_url, insecure=True)
    return kopf.login_via_client(**kwargs)


def _write(outcome: Outcome, body, patch: kopf.Patch) -> None:
    for key, value in outcome.status.items():
        patch.status[key] = value
    for kind, reason, message in outcome.events:
        kopf.event(body, type=kind, reason=reason, message=message)


@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
@kopf.on.resume(GROUP, VERSION, PLURAL)
def reconcile_spec(body, patch: kopf.Patch, **_) -> None:
    _write(reconciler().reconcile(dict(body)), body, patch)


@kopf.timer(GROUP, VERSION, PLURAL, interval=RESYNC_S, initial_delay=RESYNC_S / 2)
def resync(body, patch: kopf.Patch, **_) -> None:
    """Level-based progress: profiling results, readiness and queue-depth autoscaling."""
    _write(reconciler().reconcile(dict(body), autoscale_now=True), body, patch)


@kopf.on.delete(GROUP, VERSION, PLURAL)
def cleanup(name: str, namespace: str, uid: str, logger: logging.Logger, **_) -> None:
    deleted = reconciler().delete_children(namespace, name, uid)
    logger.info("deleted %d children of %s/%s", deleted, namespace, name)
