"""A job's autoscaling policy and the decisions taken under it (with their inputs)."""

from __future__ import annotations

from django.db import models

from controlplane.autoscaler.decision import MODES, Policy
from controlplane.jobs.models import Job

_DEFAULT = Policy()


class AutoscalePolicy(models.Model):
    """One job's policy (no row: mode off). See `decision.Policy` for the fields' meaning."""

    job = models.OneToOneField(Job, on_delete=models.CASCADE, related_name="autoscale_policy")
    mode = models.CharField(max_length=10, choices=[(m, m) for m in MODES], default=_DEFAULT.mode)
    target_utilisation = models.FloatField(default=_DEFAULT.target_utilisation)
    min_parallelism = models.PositiveIntegerField(default=_DEFAULT.min_parallelism)
    max_parallelism = models.PositiveIntegerField(default=_DEFAULT.max_parallelism)
    scale_up_window = models.PositiveIntegerField(default=_DEFAULT.scale_up_window)
    scale_down_window = models.PositiveIntegerField(default=_DEFAULT.scale_down_window)
    cooldown_epochs = models.PositiveIntegerField(default=_DEFAULT.cooldown_epochs)
    metric_window = models.PositiveIntegerField(default=_DEFAULT.metric_window)
    catch_up_epochs = models.PositiveIntegerField(default=_DEFAULT.catch_up_epochs)
    utilisation_min = models.FloatField(default=_DEFAULT.utilisation_min)
    utilisation_max = models.FloatField(default=_DEFAULT.utilisation_max)
    min_dwell_s = models.FloatField(default=_DEFAULT.min_dwell_s)
    updated_at = models.DateTimeField(auto_now=True)

    FIELDS = (
        "mode",
        "target_utilisation",
        "min_parallelism",
        "max_parallelism",
        "scale_up_window",
        "scale_down_window",
        "cooldown_epochs",
        "metric_window",
        "catch_up_epochs",
        "utilisation_min",
        "utilisation_max",
        "min_dwell_s",
    )

    def __str__(self) -> str:
        return f"{self.job.name}: {self.mode}"

    def policy(self) -> Policy:
        return Policy(**{name: getattr(self, name) for name in self.FIELDS})


class AutoscaleDecision(models.Model):
    """One evaluation that found something to say: a recommendation or an applied rescale."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="autoscale_decisions")
    created_at = models.DateTimeField(auto_now_add=True)
    mode = models.CharField(max_length=10)
    action = models.CharField(max_length=12)  # hold | scale_up | scale_down
    epoch = models.PositiveBigIntegerField(null=True, blank=True)
    current_parallelism = models.PositiveIntegerField()
    recommended_parallelism = models.PositiveIntegerField()
    reason = models.TextField()
    inputs = models.JSONField(default=dict)
    #: what happened: "recommended", "requested" (a rescale operation), "refused" (why in
    #: `outcome_detail`), "held"
    outcome = models.CharField(max_length=12)
    outcome_detail = models.TextField(blank=True, default="")
    operation = models.ForeignKey(
        "operations.Operation", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["job", "-created_at"], name="autoscale_job_recent")]

    def __str__(self) -> str:
        change = f"{self.current_parallelism}->{self.recommended_parallelism}"
        return f"{self.job.name} {self.action} {change}"
