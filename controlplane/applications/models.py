"""Applications and their versions.

One streaming application = one store namespace = one snapshot lineage. An application
version is the code and configuration a job runs (`job` reference, `code_version`, `config`);
forks create new versions, recording which snapshot they grew from and why.
"""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models

MAX_PARALLELISM_LIMIT = 32768
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"
JOB_REFERENCE_PATTERN = r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$"


class Application(models.Model):
    """A streaming application whose snapshots live in `store_namespace` of the store.

    `max_parallelism` (M) is fixed for the lineage at creation; changing it is an explicit
    rehash migration that creates a new commit. `store_url` empty means the deployment's
    `STORE_URL`.
    """

    name = models.CharField(max_length=100, unique=True, validators=[RegexValidator(NAME_PATTERN)])
    store_namespace = models.CharField(
        max_length=100, unique=True, validators=[RegexValidator(NAME_PATTERN)]
    )
    max_parallelism = models.PositiveIntegerField(
        default=128, validators=[MinValueValidator(1), MaxValueValidator(MAX_PARALLELISM_LIMIT)]
    )
    store_url = models.CharField(max_length=1000, blank=True, default="")
    description = models.TextField(blank=True, default="")
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

    @property
    def effective_store_url(self) -> str:
        return self.store_url or settings.EPOCHAL_STORE_URL


class ApplicationVersion(models.Model):
    """The code and configuration of an application at one point of its life.

    `config` holds launcher settings (resources, image, node selector, tolerations, spark
    conf, restart policy); see docs/control-plane.md. A version made by a fork records the
    snapshot it grew from (`source_snapshot_id`), who asked (`created_by`) and why (`reason`).
    """

    application = models.ForeignKey(Application, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    job = models.CharField(
        max_length=255,
        validators=[RegexValidator(JOB_REFERENCE_PATTERN, "a job reference is module:attr")],
    )
    code_version = models.CharField(max_length=255, blank=True, default="")
    config = models.JSONField(default=dict, blank=True)
    source_snapshot_id = models.CharField(max_length=64, blank=True, default="")
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children"
    )
    reason = models.TextField(blank=True, default="")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["application", "number"]
        constraints = [
            models.UniqueConstraint(
                fields=["application", "number"], name="application_version_number_unique"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.application.name} v{self.number}"
