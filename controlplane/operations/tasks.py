"""Celery tasks: thin wrappers around the executor and the reconciler.

Nothing imports this module but Celery's autodiscovery: services enqueue `epochal.run_operation`
by name (`services.operation_enqueue`), so the arrows run tasks -> reconciler -> services.
"""

from __future__ import annotations

from celery import shared_task

from controlplane import leadership
from controlplane.operations.executor import execute
from controlplane.operations.reconciler import collect_garbage_all, reconcile_all, watch_runs


@shared_task(name="epochal.run_operation", acks_late=True, reject_on_worker_lost=True)
def run_operation(operation_id: str) -> str:
    return execute(operation_id)


@shared_task(name="epochal.reconcile")
def reconcile() -> dict[str, int] | None:
    return leadership.periodic("reconcile", reconcile_all)  # one replica acts (leadership.py)


@shared_task(name="epochal.watch_runs", expires=5)
def watch() -> dict[str, int] | None:
    return leadership.periodic("watch-runs", watch_runs)


@shared_task(name="epochal.collect_garbage")
def collect_garbage() -> dict[str, int] | None:
    return leadership.periodic("collect-garbage", collect_garbage_all)
