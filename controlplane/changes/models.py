"""One row per committed change of a job, operation or lineage (written by triggers)."""

from __future__ import annotations

from django.db import models


class Change(models.Model):
    """`key` changed; `id` (from one sequence) is its revision. Old rows of a key are pruned."""

    key = models.CharField(max_length=100)

    class Meta:
        indexes = [models.Index(fields=["key", "-id"], name="change_key_recent")]

    def __str__(self) -> str:
        return f"{self.key}@{self.pk}"
