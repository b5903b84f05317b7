"""Celery tasks: thin wrappers around the executor and the reconciler.

Nothing imports this module but Celery's autodiscovery: services enqueue `epochal.run_operation`
by name (`services.operation_enqueue`), so the arrows run tasks -> reconciler -> services.
"""

from __future__ import annotations

from celery import shared_task

from controlplane.operations.executor import execute
from controlplane.operations.reconciler import collect_garbage_all, reconcile_all, watch_runs


@shared_task(name="epochal.run_operation", acks_late=True, reject_on_worker_lost=True)
def run_operation(operation_id: str) -> str:
    return execute(operation_id)


@shared_task(name="epochal.reconcile")
def reconcile() -> dict[str, int]:
    return reconcile_all()


@shared_task(name="epochal.watch_runs", expires=5)
def watch() -> dict[str, int]:
    return watch_runs()


@shared_task(name="epochal.collect_garbage")
def collect_garbage() -> dict[str, int]:
    return collect_garbage_all()
