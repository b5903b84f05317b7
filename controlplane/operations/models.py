"""Operations: requested changes to jobs and lineages, executed as resumable state machines.

An operation is written (intent) before anything acts on it. A worker takes a time-limited
lease on it, runs its phases in order and records each one; every phase is idempotent, so
when a worker dies the reconciler hands the operation to another worker after the lease
expires and it resumes at the first unfinished phase. At most one operation per job is
active (pending or running) — enforced by a partial unique index, so concurrent requests
cannot both win.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models

from controlplane.applications.models import Application
from controlplane.jobs.models import Job

IDEMPOTENCY_KEY_MAX = 200
"""The longest idempotency key a request may carry (characters)."""


class OperationKind(models.TextChoices):
    START = "start"
    STOP = "stop"
    SAVEPOINT = "savepoint"
    RESCALE = "rescale"
    ROLLBACK = "rollback"
    FORK = "fork"
    MIGRATE = "migrate"
    ALIGN = "align"
    HOTSWAP = "hotswap"


class OperationState(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


ACTIVE_STATES = (OperationState.PENDING, OperationState.RUNNING)
TERMINAL_STATES = (OperationState.SUCCEEDED, OperationState.FAILED, OperationState.CANCELLED)


class Operation(models.Model):
    """One requested operation. `phases` is the ordered list of phase records:
    ``{"name", "state" (pending|running|succeeded|skipped), "started_at", "finished_at",
    "progress" (0..1), "detail"}``; `context` carries what phases decided (run ids, snapshot
    ids) so a resumed phase does the same thing again."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    kind = models.CharField(max_length=16, choices=OperationKind.choices)
    application = models.ForeignKey(
        Application, on_delete=models.CASCADE, related_name="operations"
    )
    job = models.ForeignKey(
        Job, null=True, blank=True, on_delete=models.CASCADE, related_name="operations"
    )
    params = models.JSONField(default=dict)
    reason = models.TextField(blank=True, default="")
    idempotency_key = models.CharField(max_length=IDEMPOTENCY_KEY_MAX, blank=True, default="")
    request_fingerprint = models.CharField(
        max_length=64,
        blank=True,
        default="",
        help_text="sha256 of the request (user, method, path, body) that used idempotency_key.",
    )
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    requested_via = models.CharField(max_length=20, default="api")
    # The branch the operation creates (fork), "" for none: one active operation per new
    # branch of an application, by the unique index below.
    target_branch = models.CharField(max_length=255, blank=True, default="")
    state = models.CharField(
        max_length=16, choices=OperationState.choices, default=OperationState.PENDING
    )
    phases = models.JSONField(default=list)
    current_phase = models.CharField(max_length=40, blank=True, default="")
    progress = models.FloatField(default=0.0)
    context = models.JSONField(default=dict)
    result = models.JSONField(default=dict)
    error_code = models.CharField(max_length=60, blank=True, default="")
    error_message = models.TextField(blank=True, default="")
    cancel_requested = models.BooleanField(default=False)
    attempts = models.PositiveIntegerField(default=0)
    lease_owner = models.CharField(max_length=200, blank=True, default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["job"],
                condition=models.Q(state__in=["pending", "running"]),
                name="operation_one_active_per_job",
            ),
            models.UniqueConstraint(
                fields=["application", "target_branch"],
                condition=models.Q(state__in=["pending", "running"]) & ~models.Q(target_branch=""),
                name="operation_one_active_per_new_branch",
            ),
            models.UniqueConstraint(
                fields=["requested_by", "idempotency_key"],
                condition=~models.Q(idempotency_key=""),
                name="operation_idempotency_key_unique",
            ),
        ]
        indexes = [
            models.Index(fields=["state", "lease_expires_at"], name="operation_state_lease"),
            models.Index(fields=["job", "-created_at"], name="operation_job_recent"),
            models.Index(fields=["application", "-created_at"], name="operation_app_recent"),
        ]

    def __str__(self) -> str:
        target = self.job.name if self.job_id else self.application.name
        return f"{self.kind} {target} ({self.state})"

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES

    @property
    def duration_s(self) -> float | None:
        if self.started_at is None or self.finished_at is None:
            return None
        return (self.finished_at - self.started_at).total_seconds()
