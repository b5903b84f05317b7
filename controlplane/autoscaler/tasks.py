"""Celery task: evaluate every job's autoscaling policy (beat, `EPOCHAL_AUTOSCALE_INTERVAL_S`)."""

from __future__ import annotations

from celery import shared_task

from controlplane import leadership
from controlplane.autoscaler.services import autoscale_all


@shared_task(name="epochal.autoscale")
def autoscale() -> dict[str, int] | None:
    return leadership.periodic("autoscale", autoscale_all)  # one replica acts (leadership.py)
