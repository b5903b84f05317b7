"""Writes for jobs and runs: create a job, launch / stop / watch its runs through a launcher.

Every function here is idempotent: a run is identified by its `run_id`, chosen and written to
the database (with its whole spec) before the launcher is called, and launchers treat a
second start of the same run id as the same run.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from controlplane.applications.models import Application, ApplicationVersion
from controlplane.applications.sinks import sink_spec_fields, version_sink_errors
from controlplane.applications.stores import store_credentials
from controlplane.errors import Conflict, InvalidRequest, Unprocessable
from controlplane.jobs.events import engine_event
from controlplane.jobs.models import DesiredState, Job, JobState, Run, RunPhase, Watch
from controlplane.jobs.selectors import RUN_WATCH
from controlplane.jobs.spark_conf import operator_spark_conf
from controlplane.jobs.spark_ui import record_spark_ui, spark_ui_conf
from runners import entry_points
from runners.job_spec import JobSpec, JobSpecError, Resources, Toleration, new_run_id
from runners.launcher import Launcher, LauncherError, RunHandle, RunNotFoundError
from runners.launcher import RunPhase as LauncherPhase
from runners.launchers import RUNNERS, get_launcher
from snapshots_store.errors import InvalidNameError
from snapshots_store.names import check_branch_name

log = logging.getLogger(__name__)

#: A run's and its job's reason when the control plane stopped it while shutting down.
SHUTDOWN_REASON = "stopped by shutdown of the control plane"
#: The engine's stop reasons that mean a signal stopped it (not a stop request, not the end
#: of its input): SIGTERM / SIGINT, possibly "SIGTERM: epoch N abandoned before its commit".
_SIGNAL_REASONS = ("SIGTERM", "SIGINT", "SIGHUP")

_LAUNCHERS: dict[str, Launcher] = {}

SPEC_CONFIG_KEYS = frozenset(
    {
        "job_args",
        "resources",
        "image",
        "service_account",
        "node_selector",
        "tolerations",
        "image_pull_secrets",
        "store_credentials_secret",
        "spark_conf",
        "max_epochs",
        "sinks",
    }
)


def launcher_for(name: str) -> Launcher:
    """One launcher per runner name and process (the local one tracks its children)."""
    if name not in _LAUNCHERS:
        _LAUNCHERS[name] = get_launcher(name)
    return _LAUNCHERS[name]


def version_config_errors(config: Mapping[str, Any]) -> dict[str, list[str]]:
    """Field errors of a version's `config` (empty when a job spec can be built from it)."""
    if not isinstance(config, Mapping):
        return {"config": ["must be a JSON object"]}
    unknown = sorted(set(config) - SPEC_CONFIG_KEYS)
    if unknown:
        return {"config": [f"unknown keys {unknown}; allowed: {sorted(SPEC_CONFIG_KEYS)}"]}
    try:
        _spec_fields(config)
    except (JobSpecError, TypeError, ValueError) as exc:
        return {"config": [str(exc)]}
    sinks = version_sink_errors(config.get("sinks", []))
    return {"config": sinks} if sinks else {}


def _spec_fields(config: Mapping[str, Any]) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    if "resources" in config:
        if not isinstance(config["resources"], Mapping):
            raise JobSpecError("resources must be an object")
        fields["resources"] = Resources(**config["resources"])
    if "tolerations" in config:
        fields["tolerations"] = tuple(Toleration(**t) for t in config["tolerations"])
    if "image_pull_secrets" in config:
        fields["image_pull_secrets"] = tuple(config["image_pull_secrets"])
    for key in ("image", "service_account", "store_credentials_secret", "max_epochs"):
        if key in config:
            fields[key] = config[key]
    for key in ("node_selector", "spark_conf", "job_args"):
        if key in config:
            if not isinstance(config[key], Mapping):
                raise JobSpecError(f"{key} must be an object")
            fields[key] = dict(config[key])
    return fields


def job_spec(job: Job, *, run_id: str, parallelism: int | None = None) -> JobSpec:
    """The launch spec of one run of `job` (version config + job placement)."""
    version = job.version
    unusable = entry_points.lookup_error(entry_points.JOBS, version.job)
    if unusable:
        raise InvalidRequest(
            f"job {job.name}: version {version.number} names job {version.job!r}, which "
            f"cannot run: {unusable}. An admin creates a version naming a registered job "
            "(GET /api/entry-points/) and the job switches to it",
            code="unregistered_job",
            fields={"job": [unusable]},
        )
    fields = _spec_fields(version.config)
    if version.config.get("sinks"):  # refuses to launch, naming the sink, when one is bad
        fields.update(sink_spec_fields(version.config["sinks"]))
    fields["spark_conf"] = {
        **spark_ui_conf(job.name),
        **fields.get("spark_conf", {}),
        **job.spark_conf,
    }
    store = job.application.store
    if store is not None and store.credentials_secret:
        fields.setdefault("store_credentials_secret", store.credentials_secret)
    if store is not None and store.credentials_env:
        store_credentials(store)  # refuses to launch, naming the variables, when one is missing
        fields["store_credentials_env"] = store.credentials_env
    try:
        return JobSpec(
            application=job.application.name,
            namespace=job.application.store_namespace,
            branch=job.branch,
            store_url=job.effective_store_url,
            job=version.job,
            parallelism=parallelism or job.parallelism,
            follow=job.follow,
            run_id=run_id,
            **fields,
        )
    except (JobSpecError, TypeError) as exc:
        raise InvalidRequest(
            f"job {job.name}: version {version.number} cannot be launched: {exc}",
            code="invalid_job_spec",
        ) from None


def job_create(
    *,
    name: str,
    application: Application,
    version: ApplicationVersion,
    branch: str = "main",
    parallelism: int = 2,
    runner: str = "",
    follow: bool = True,
    max_restarts: int = 5,
    restart_backoff_s: int = 10,
    spark_conf: Mapping[str, Any] | None = None,
    created_by: AbstractBaseUser | None = None,
) -> Job:
    """Create a job (stopped) for `branch` of `application`; start it with a start operation."""
    fields: dict[str, list[str]] = {}
    try:
        check_branch_name(branch)
    except InvalidNameError as exc:
        fields["branch"] = [str(exc)]
    if version.application_id != application.pk:
        fields["version"] = [f"version {version.number} belongs to another application"]
    if isinstance(parallelism, bool) or not isinstance(parallelism, int) or parallelism < 1:
        fields["parallelism"] = ["must be a positive integer"]
    elif parallelism > application.max_parallelism:
        raise Unprocessable(
            f"parallelism {parallelism} is more than the application's max parallelism "
            f"M={application.max_parallelism}",
            fields={"parallelism": [f"at most M={application.max_parallelism}"]},
        )
    if runner not in ("", *RUNNERS):
        fields["runner"] = [f"must be one of {', '.join(RUNNERS)} (empty: the deployment's RUNNER)"]
    if spark_conf:
        try:
            spark_conf = operator_spark_conf(spark_conf)
        except InvalidRequest as exc:
            fields.update(exc.fields)
    if fields:
        raise InvalidRequest(f"cannot create job {name!r}: {sorted(fields)}", fields=fields)
    job = Job(
        name=name,
        application=application,
        version=version,
        branch=branch,
        parallelism=parallelism,
        runner=runner,
        follow=follow,
        max_restarts=max_restarts,
        restart_backoff_s=restart_backoff_s,
        spark_conf=dict(spark_conf or {}),
        created_by=created_by,
    )
    from django.core.exceptions import ValidationError

    try:
        # Uniqueness is the database's to decide (a taken name is a 409, even under a race).
        job.full_clean(validate_unique=False, validate_constraints=False)
    except ValidationError as exc:
        raise InvalidRequest(f"cannot create job {name!r}", fields=exc.message_dict) from None
    try:
        with transaction.atomic():
            job.save()
    except IntegrityError:
        existing = Job.objects.filter(application=application, branch=branch).first()
        if existing is not None:
            raise Conflict(
                f"branch {branch!r} of {application.name} already has job {existing.name!r}",
                code="job_exists",
            ) from None
        raise Conflict(f"a job named {name!r} exists already", code="job_exists") from None
    return job


# -- runs --------------------------------------------------------------------------------


def run_launch(
    job: Job, *, run_id: str | None = None, parallelism: int | None = None, operation: Any = None
) -> Run:
    """Launch a run of `job` (or find the one launched before with this `run_id`)."""
    run_id = run_id or new_run_id()
    run = Run.objects.filter(run_id=run_id).first()
    if run is None:
        spec = job_spec(job, run_id=run_id, parallelism=parallelism)
        run = Run.objects.create(
            job=job,
            run_id=run_id,
            runner=job.effective_runner,
            parallelism=spec.parallelism,
            spec=spec.to_dict(),
            operation=operation,
        )
    if run.handle is None:
        spec = JobSpec.from_dict(run.spec)
        try:
            handle = launcher_for(run.runner).start(spec)
        except LauncherError as exc:
            run.phase, run.reason, run.finished_at = RunPhase.FAILED, str(exc), timezone.now()
            run.save(update_fields=["phase", "reason", "finished_at"])
            raise
        run.handle = handle.to_dict()
        run.phase = RunPhase.RUNNING
        run.started_at = timezone.now()
        run.save(update_fields=["handle", "phase", "started_at"])
    Job.objects.filter(pk=job.pk).update(
        state=JobState.RUNNING,
        desired_state=DesiredState.RUNNING,
        parallelism=run.parallelism,
        status_reason="",
        updated_at=timezone.now(),
    )
    job.refresh_from_db()
    return run


def _handle(run: Run) -> RunHandle | None:
    return None if run.handle is None else RunHandle.from_dict(run.handle)


def run_refresh(run: Run) -> Run:
    """Ask the launcher where `run` is and record it (a finished run stays finished)."""
    handle = _handle(run)
    if handle is None or not run.live:
        return run
    try:
        status = launcher_for(run.runner).status(handle)
    except RunNotFoundError as exc:
        run.phase, run.reason, run.finished_at = RunPhase.FAILED, str(exc), timezone.now()
        run.save(update_fields=["phase", "reason", "finished_at"])
        return run
    mapping = {
        LauncherPhase.PENDING: RunPhase.PENDING,
        LauncherPhase.RUNNING: RunPhase.RUNNING,
        LauncherPhase.SUCCEEDED: RunPhase.SUCCEEDED,
        LauncherPhase.FAILED: RunPhase.FAILED,
    }
    phase, reason = mapping[status.phase], status.reason
    if phase == RunPhase.SUCCEEDED:
        # The engine exits 0 however it stopped; its last words say how.
        said = engine_stop_reason(run)
        if said.startswith(_SIGNAL_REASONS):
            phase = RunPhase.STOPPED
            reason = f"stopped by {said.split(':')[0]} from outside the control plane"
        else:
            reason = said
    if phase != run.phase or reason != run.reason:
        run.phase, run.reason = phase, reason
        if status.finished:
            run.finished_at = timezone.now()
        run.save(update_fields=["phase", "reason", "finished_at"])
    return record_spark_ui(run, lambda lines: run_logs(run, tail_lines=lines))


def engine_stop_reason(run: Run) -> str:
    """The reason of the engine's last `{"event": "stopped", "reason": …}` line in the run's
    log ("no new data", "stop requested", "SIGTERM", …; "" when it printed none)."""
    for line in reversed(run_logs(run, tail_lines=200).splitlines()):
        event = engine_event(line) if '"stopped"' in line else None
        if event is not None and event["event"] == "stopped":
            return str(event.get("reason") or "")
    return ""


def run_stop(run: Run, *, deadline_s: float) -> Run:
    """Stop `run` at its next epoch boundary, forcing it after `deadline_s`; idempotent."""
    handle = _handle(run)
    if handle is not None:
        try:
            status = launcher_for(run.runner).stop(handle, deadline_s)
        except RunNotFoundError:
            status = None
        reason = "stopped" if status is None or not status.reason else status.reason
    else:
        reason = "stopped before it was launched"
    if run.live or run.phase != RunPhase.STOPPED:
        run.phase, run.reason = RunPhase.STOPPED, reason
        run.finished_at = run.finished_at or timezone.now()
        run.save(update_fields=["phase", "reason", "finished_at"])
    return run


def run_logs(run: Run, *, tail_lines: int = 100) -> str:
    handle = _handle(run)
    if handle is None:
        return ""
    try:
        return launcher_for(run.runner).logs(handle, tail_lines)
    except LauncherError as exc:
        return f"(logs unavailable: {exc})"


def job_stop_runs(job: Job, *, deadline_s: float) -> list[Run]:
    """Stop every live run of `job` (normally one)."""
    stopped = [
        run_stop(run, deadline_s=deadline_s)
        for run in job.runs.filter(phase__in=[RunPhase.PENDING, RunPhase.RUNNING])
    ]
    Job.objects.filter(pk=job.pk).update(
        state=JobState.STOPPED, desired_state=DesiredState.STOPPED, updated_at=timezone.now()
    )
    job.refresh_from_db()
    return stopped


def job_set_parallelism(job: Job, parallelism: int, *, latest_run: bool = False) -> None:
    """Record that `job` runs (or will run) at `parallelism`; with `latest_run`, that its
    newest run does too (a live rescale took effect in it)."""
    Job.objects.filter(pk=job.pk).update(parallelism=parallelism)
    if latest_run:
        run = Run.objects.filter(job=job).order_by("-created_at").first()
        if run is not None:
            Run.objects.filter(pk=run.pk).update(parallelism=parallelism)
    job.refresh_from_db()


def job_set_state(job: Job, state: str, *, reason: str = "", **fields: Any) -> None:
    Job.objects.filter(pk=job.pk).update(
        state=state, status_reason=reason, updated_at=timezone.now(), **fields
    )
    job.refresh_from_db()


# -- the control plane's own watch and shutdown ---------------------------------------------


def watch_record(at: dt.datetime | None = None) -> None:
    """Record that the reconciler has just checked every live run (`selectors.job_shown_state`
    reads it)."""
    Watch.objects.update_or_create(name=RUN_WATCH, defaults={"at": at or timezone.now()})


def runs_stop_for_shutdown(
    *, deadline_s: float = 60.0, say: Callable[[str], None] = lambda _line: None
) -> list[Run]:
    """The control plane shuts down: stop every live run at its next epoch boundary (forced
    after `deadline_s`), all at once, and record why. Unlike a stop operation this leaves
    each job's desired state alone, so the reconciler starts the jobs that should be running
    again from their heads when the control plane comes back."""
    runs = list(
        Run.objects.filter(phase__in=[RunPhase.PENDING, RunPhase.RUNNING]).select_related("job")
    )
    errors: dict[str, str] = {}

    def stop(run: Run) -> None:
        try:
            run_stop(run, deadline_s=deadline_s)
            forced = "" if run.reason in ("stopped", "") else f" ({run.reason})"
            Run.objects.filter(pk=run.pk).update(reason=SHUTDOWN_REASON + forced)
            Job.objects.filter(pk=run.job_id).update(
                state=JobState.STOPPED, status_reason=SHUTDOWN_REASON, updated_at=timezone.now()
            )
        except Exception as exc:  # the others must still stop
            errors[run.run_id] = str(exc)
        finally:
            connection.close()  # this thread's own connection

    threads = [threading.Thread(target=stop, args=(run,)) for run in runs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for run in runs:
        run.refresh_from_db()
        if run.run_id in errors:
            say(
                f"  run {run.run_id} of job {run.job.name}: could not stop it: {errors[run.run_id]}"
            )
        else:
            say(f"  run {run.run_id} of job {run.job.name}: {run.reason}")
    return runs


#: The shortest interval of periodic savepoints (each is an operation and a tag).
MIN_SAVEPOINT_INTERVAL_S = 10


def job_set_savepoint_schedule(job: Job, *, interval_s: int, retention: int) -> Job:
    """Set `job`'s periodic savepoints: every `interval_s` seconds (0: off), keeping the
    newest `retention` (0: all). The reconciler takes them (operations/schedule.py)."""
    fields: dict[str, list[str]] = {}
    if interval_s != 0 and interval_s < MIN_SAVEPOINT_INTERVAL_S:
        fields["interval_s"] = [f"0 (off) or at least {MIN_SAVEPOINT_INTERVAL_S} seconds"]
    if retention < 0:
        fields["retention"] = ["0 (keep all) or more"]
    if fields:
        raise InvalidRequest(f"cannot schedule savepoints of {job.name}: {fields}", fields=fields)
    Job.objects.filter(pk=job.pk).update(
        savepoint_interval_s=interval_s, savepoint_retention=retention, updated_at=timezone.now()
    )
    job.refresh_from_db()
    return job
