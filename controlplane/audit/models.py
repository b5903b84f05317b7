"""The audit log: who asked for what, when, and how it ended. Append-only."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class AuditKind(models.TextChoices):
    REQUEST = "request"
    EXECUTION = "execution"


class AuditEntry(models.Model):
    """One request (REST, dashboard, CLI) or one step of an operation's execution."""

    at = models.DateTimeField(auto_now_add=True, db_index=True)
    kind = models.CharField(max_length=16, choices=AuditKind.choices)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor_name = models.CharField(max_length=150, blank=True, default="")
    action = models.CharField(max_length=200)
    target = models.CharField(max_length=300, blank=True, default="")
    outcome = models.CharField(max_length=40, blank=True, default="")
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    operation = models.ForeignKey(
        "operations.Operation",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="audit_entries",
    )
    source = models.CharField(max_length=40, blank=True, default="")
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-at", "-id"]
        verbose_name_plural = "audit entries"
        indexes = [
            models.Index(fields=["actor_name", "-at"], name="audit_actor_recent"),
            models.Index(fields=["action", "-at"], name="audit_action_recent"),
        ]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor_name or '-'} {self.action} {self.outcome}"
