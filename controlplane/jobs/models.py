"""Jobs and runs.

A *job* is a deployment of one branch of an application: which version's code it runs, with
what parallelism, on which launcher, and whether it should be running (`desired_state`). A
*run* is one launch of a job (one `run_id`, one driver); a job has many runs over its life
(each restart, rescale with restart, rollback or migration makes a new one).
"""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models

from controlplane.applications.models import NAME_PATTERN, Application, ApplicationVersion
from controlplane.patterns import WholeRegexValidator


class JobState(models.TextChoices):
    CREATED = "created"
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"
    FAILED = "failed"


class DesiredState(models.TextChoices):
    RUNNING = "running"
    STOPPED = "stopped"


class Job(models.Model):
    """A deployment of `branch` of `application`, running `version`'s code."""

    name = models.CharField(
        max_length=100, unique=True, validators=[WholeRegexValidator(NAME_PATTERN)]
    )
    application = models.ForeignKey(Application, on_delete=models.PROTECT, related_name="jobs")
    version = models.ForeignKey(ApplicationVersion, on_delete=models.PROTECT, related_name="jobs")
    branch = models.CharField(max_length=255)
    runner = models.CharField(max_length=20, blank=True, default="")
    parallelism = models.PositiveIntegerField(default=2, validators=[MinValueValidator(1)])
    # The operator's Spark settings: resource keys only (controlplane/jobs/spark_conf.py),
    # over the version's (an admin's, any key).
    spark_conf = models.JSONField(default=dict, blank=True)
    follow = models.BooleanField(default=True)
    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.CREATED)
    desired_state = models.CharField(
        max_length=16, choices=DesiredState.choices, default=DesiredState.STOPPED
    )
    status_reason = models.TextField(blank=True, default="")
    max_restarts = models.PositiveIntegerField(default=5)
    restart_backoff_s = models.PositiveIntegerField(default=10)
    restarts = models.PositiveIntegerField(default=0)
    next_restart_at = models.DateTimeField(null=True, blank=True)
    # Periodic savepoints (the Flink Kubernetes Operator's periodicSavepointInterval): every
    # this many seconds the reconciler tags the running job's head `periodic-BRANCH-TIME`,
    # keeping the newest `savepoint_retention` of them (0: all). 0 seconds: off.
    savepoint_interval_s = models.PositiveIntegerField(default=0)
    savepoint_retention = models.PositiveIntegerField(default=5)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(
                fields=["application", "branch"], name="job_one_per_application_branch"
            ),
            models.CheckConstraint(condition=models.Q(parallelism__gte=1), name="job_parallelism"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def effective_store_url(self) -> str:
        return self.application.effective_store_url

    @property
    def effective_runner(self) -> str:
        return self.runner or settings.EPOCHAL_RUNNER


class RunPhase(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"


class Run(models.Model):
    """One launch of a job: the spec written before the launcher acts, then its handle."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="runs")
    run_id = models.CharField(max_length=32, unique=True)
    runner = models.CharField(max_length=20)
    parallelism = models.PositiveIntegerField()
    spec = models.JSONField()
    handle = models.JSONField(null=True, blank=True)
    phase = models.CharField(max_length=16, choices=RunPhase.choices, default=RunPhase.PENDING)
    reason = models.TextField(blank=True, default="")
    operation = models.ForeignKey(
        "operations.Operation", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # When the reconciler asked for this run's job to start again after the run stopped
    # without the control plane asking (its shutdown, a signal from outside): once per run.
    restart_requested_at = models.DateTimeField(null=True, blank=True)
    # Where the run's Spark UI listens (``http://host:port``), as its driver reported it in
    # its `started` event and checked against where this run's driver can be
    # (`controlplane.jobs.spark_ui`): None until known, "" when the run has no UI.
    spark_ui_url = models.CharField(max_length=300, null=True, blank=True)  # noqa: DJ001

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["job", "-created_at"], name="run_job_recent")]

    def __str__(self) -> str:
        return f"{self.job.name} run {self.run_id}"

    @property
    def live(self) -> bool:
        return self.phase in (RunPhase.PENDING, RunPhase.RUNNING)


class Watch(models.Model):
    """When the control plane last watched the jobs' runs: the reconciler's run watch
    (`epochal.watch_runs`, every `EPOCHAL_RUN_WATCH_INTERVAL_S`) records each pass here. A
    job the database calls running is only known to run while this is recent; otherwise the
    CLI and the dashboard say `unknown (control plane was down)` (`jobs.selectors`)."""

    name = models.CharField(max_length=50, primary_key=True)
    at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.name} watched at {self.at.isoformat()}"


class JobSummary(models.Model):
    """What a job's read shows that changes only when a writer acts: its newest run, its
    active operation and its branch's head. Kept current by the database in the writer's
    own transaction (triggers, `controlplane.jobs.summaries`) — a run created, an operation
    step, a commit moving the head — so readers join one row instead of recomputing it, and
    a writer that crashes mid-step leaves it as consistent as the rows it describes.

    The links carry no database constraint: a writer deleting rows in bulk is never failed
    by the summary, and a reader's outer join simply finds nothing."""

    job = models.OneToOneField(
        Job, primary_key=True, on_delete=models.CASCADE, related_name="summary"
    )
    latest_run = models.ForeignKey(
        Run, null=True, on_delete=models.DO_NOTHING, db_constraint=False, related_name="+"
    )
    active_operation = models.ForeignKey(
        "operations.Operation",
        null=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="+",
    )
    head = models.ForeignKey(
        "lineage.Snapshot",
        null=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="+",
    )

    def __str__(self) -> str:
        return f"summary of job {self.job_id}"
