"""Applications: one streaming application = one store namespace = one snapshot lineage.

Deliberately minimal; the control-plane issue extends it (jobs, owners, code versions).
"""

from __future__ import annotations

from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models

MAX_PARALLELISM_LIMIT = 32768
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"


class Application(models.Model):
    """A streaming application whose snapshots live in `store_namespace` of the store.

    `max_parallelism` (M) is fixed for the lineage at creation; changing it is an explicit
    rehash migration that creates a new commit.
    """

    name = models.CharField(max_length=100, unique=True, validators=[RegexValidator(NAME_PATTERN)])
    store_namespace = models.CharField(
        max_length=100, unique=True, validators=[RegexValidator(NAME_PATTERN)]
    )
    max_parallelism = models.PositiveIntegerField(
        default=128, validators=[MinValueValidator(1), MaxValueValidator(MAX_PARALLELISM_LIMIT)]
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(max_parallelism__gte=1)
                & models.Q(max_parallelism__lte=MAX_PARALLELISM_LIMIT),
                name="application_max_parallelism_range",
            ),
        ]

    def __str__(self) -> str:
        return self.name
