"""Reading policies and decisions."""

from __future__ import annotations

from django.db.models import QuerySet

from controlplane.autoscaler.models import AutoscaleDecision, AutoscalePolicy
from controlplane.jobs.models import Job


def policy_row(job: Job) -> AutoscalePolicy | None:
    return AutoscalePolicy.objects.filter(job=job).first()


def decisions(job: Job) -> QuerySet[AutoscaleDecision]:
    """Newest first."""
    return AutoscaleDecision.objects.filter(job=job).order_by("-created_at", "-id")


def latest_decision(job: Job) -> AutoscaleDecision | None:
    return decisions(job).first()
