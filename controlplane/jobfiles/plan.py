"""What a job file changes, as the control plane's ordinary requests, and applying them.

`plan` compares each job of the file with the job the control plane has and lists the
requests that would make them equal (`epochal diff`); `apply` makes those requests
(`epochal apply`). Every change is an ordinary request, so its audit, security model and
idempotency are that request's:

- a job the control plane does not have: the job is created (stopped), as `POST /api/jobs/`;
- `parallelism`: a rescale operation (mode auto);
- `state`: a start or stop operation;
- `version`: a fork of the job's branch at its head running the new version (job
  ``<name>-v<N>`` on branch ``<branch>-v<N>``), and with ``upgrade: hotswap`` then a hotswap
  of the job to that fork once it runs;
- `autoscaler`: the job's autoscaling policy is set (``null``: mode off).

A job has at most one operation at a time: when a job needs two (started and rescaled), the
first is requested and the second waits for the next `apply` (`diff` lists both). A change
already requested (its operation still active) is not requested again.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import transaction

from controlplane.applications.models import Application, ApplicationVersion
from controlplane.autoscaler.decision import Policy
from controlplane.autoscaler.models import AutoscalePolicy
from controlplane.autoscaler.services import policy_set
from controlplane.errors import Conflict, EpochalError, UnusableRequest
from controlplane.jobfiles.document import JobEntry
from controlplane.jobs.models import DesiredState, Job, JobState
from controlplane.jobs.services import job_create
from controlplane.operations.models import ACTIVE_STATES, Operation
from controlplane.operations.services import operation_request
from snapshots_store.errors import InvalidNameError
from snapshots_store.names import check_branch_name

CREATE = "create"
AUTOSCALER = "autoscaler"


@dataclass(frozen=True)
class Change:
    """One request that makes a job as the file says: `request` is an operation kind,
    ``create`` (the job) or ``autoscaler`` (its policy)."""

    job: str
    field: str
    current: Any
    wanted: Any
    request: str
    params: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        what = {CREATE: "create the job", AUTOSCALER: "set the autoscaling policy"}.get(
            self.request, f"{self.request} operation"
        )
        params = f" {self.params}" if self.params and self.request != CREATE else ""
        return f"{self.job}: {self.field} {self.current!r} -> {self.wanted!r}: {what}{params}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "field": self.field,
            "current": self.current,
            "wanted": self.wanted,
            "request": self.request,
            "params": self.params,
        }


@dataclass(frozen=True)
class Outcome:
    """What `apply` did with one change: ``requested``, ``already requested`` (an active
    operation does it), ``done`` (a job created, a policy set), ``waits`` (for the job's
    operation to end: apply again) or ``refused`` (the operation's kind refused it now, e.g.
    the job's state; `detail` says why)."""

    change: Change
    outcome: str
    operation: str | None = None
    #: why a kind refused the request (outcome ``refused``)
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.change.to_dict(),
            "outcome": self.outcome,
            "operation": self.operation,
            "detail": self.detail,
        }


def _refuse(index: int, name: str, message: str) -> UnusableRequest:
    return UnusableRequest(
        f"jobs[{index}].{name}: {message}",
        code="job_file_unusable",
        fields={f"jobs[{index}].{name}": [message]},
    )


def _registered(index: int, entry: JobEntry) -> tuple[Application, ApplicationVersion]:
    """The application and version the entry names, both registered; 422 naming the field."""
    application = Application.objects.select_related("store").filter(name=entry.application)
    app = application.first()
    if app is None:
        raise _refuse(index, "application", f"no registered application {entry.application!r}")
    store = app.store.name if app.store is not None else ""
    if entry.store is not None and entry.store != store:
        raise _refuse(
            index,
            "store",
            f"application {app.name} is in store {store or '(the deployment default)'!r}, not "
            f"{entry.store!r}; moving it is a migrate operation",
        )
    version = ApplicationVersion.objects.filter(application=app, number=entry.version).first()
    if version is None:
        raise _refuse(
            index,
            "version",
            f"application {app.name} has no version {entry.version}; an admin registers one",
        )
    if entry.job is not None and entry.job != version.job:
        raise _refuse(
            index,
            "job",
            f"version {version.number} runs registered job {version.job!r}, not {entry.job!r}",
        )
    return app, version


def _policy(job: Job) -> dict[str, Any] | None:
    row = AutoscalePolicy.objects.filter(job=job).first()
    return None if row is None else {name: getattr(row, name) for name in row.FIELDS}


def _policy_change(index: int, entry: JobEntry, app: Application, job: Job | None) -> Change | None:
    if not entry.has_autoscaler:
        return None
    current = None if job is None else _policy(job)
    wanted = entry.autoscaler
    if wanted is None:
        if current is None or current["mode"] == "off":
            return None
        return Change(entry.name, AUTOSCALER, current["mode"], None, AUTOSCALER, {"mode": "off"})
    merged = {**(current or {}), **wanted}
    problems = Policy(**{**asdict(Policy()), **merged}).problems()
    if merged.get("max_parallelism", 0) > app.max_parallelism:
        problems["max_parallelism"] = f"at most the application's M={app.max_parallelism}"
    if problems:
        fields = {f"jobs[{index}].autoscaler.{k}": [f"must be {v}"] for k, v in problems.items()}
        raise UnusableRequest(
            f"jobs[{index}].autoscaler: the policy's fields do not fit together: "
            + "; ".join(f"{k} must be {v}" for k, v in sorted(problems.items())),
            code="job_file_unusable",
            fields=fields,
        )
    if current is not None and all(current.get(k) == v for k, v in wanted.items()):
        return None
    return Change(entry.name, AUTOSCALER, current, wanted, AUTOSCALER, dict(wanted))


def _version_changes(entry: JobEntry, job: Job) -> list[Change]:
    fork_name = f"{entry.name}-v{entry.version}"
    fork = Job.objects.filter(name=fork_name).first()
    current = job.version.number
    if fork is None:
        params = {
            "snapshot": job.branch,
            "branch": f"{job.branch}-v{entry.version}",
            "job_name": fork_name,
            "version": entry.version,
            "parallelism": entry.parallelism,
            "start": entry.upgrade == "hotswap" or entry.state != "stopped",
        }
        return [Change(entry.name, "version", current, entry.version, "fork", params)]
    if (
        entry.upgrade == "hotswap"
        and fork.state == JobState.RUNNING
        and job.desired_state == DesiredState.RUNNING
    ):
        return [
            Change(entry.name, "version", current, entry.version, "hotswap", {"new_job": fork_name})
        ]
    return []  # rolled out: the fork runs the new version


def entry_changes(index: int, entry: JobEntry) -> list[Change]:
    """The changes one job of the file asks for (422 when it names what is not registered)."""
    app, version = _registered(index, entry)
    job = Job.objects.select_related("version").filter(name=entry.name).first()
    if entry.parallelism > app.max_parallelism:
        raise _refuse(
            index,
            "parallelism",
            f"at most the application's max parallelism M={app.max_parallelism}",
        )
    if job is None:
        try:
            check_branch_name(entry.branch)
        except InvalidNameError as exc:
            raise _refuse(index, "branch", str(exc)) from None
        taken = Job.objects.filter(application=app, branch=entry.branch).first()
        if taken is not None:
            raise _refuse(
                index,
                "branch",
                f"branch {entry.branch!r} of {app.name} already has job {taken.name!r} "
                "(one job per branch): name that job, or another branch",
            )
        changes = [Change(entry.name, "job", None, entry.name, CREATE, entry.to_dict())]
        policy = _policy_change(index, entry, app, None)
        if entry.state == "running":
            changes.append(Change(entry.name, "state", "stopped", "running", "start"))
        return changes + ([policy] if policy else [])
    if job.application_id != app.pk or job.branch != entry.branch:
        raise _refuse(
            index,
            "branch" if job.application_id == app.pk else "application",
            f"job {job.name} runs branch {job.branch!r} of {job.application.name}: a job's "
            "application and branch never change (a fork makes a new job)",
        )
    if dict(job.spark_conf) != entry.resources:
        raise _refuse(
            index,
            "resources",
            f"job {job.name} runs with {dict(job.spark_conf)}; an existing job's resources "
            "change with a fork (its spark_conf), not in place",
        )
    changes: list[Change] = []
    policy = _policy_change(index, entry, app, job)
    if policy is not None:
        changes.append(policy)
    if version.pk != job.version_id:
        return changes + _version_changes(entry, job)
    if entry.state is not None and entry.state != job.desired_state:
        kind = "start" if entry.state == "running" else "stop"
        changes.append(Change(entry.name, "state", job.desired_state, entry.state, kind))
    if entry.parallelism != job.parallelism:
        changes.append(
            Change(
                entry.name,
                "parallelism",
                job.parallelism,
                entry.parallelism,
                "rescale",
                {"parallelism": entry.parallelism},
            )
        )
    return changes


def plan(entries: Iterable[JobEntry]) -> list[Change]:
    """Every change the file asks for, job by job, in the file's order."""
    return [change for i, entry in enumerate(entries) for change in entry_changes(i, entry)]


def _active_same(job: Job, change: Change) -> Operation | None:
    """The job's active operation when it already does `change` (a fork: the application's
    active fork creating the same branch)."""
    if change.request == "fork":
        return Operation.objects.filter(
            application_id=job.application_id,
            kind="fork",
            target_branch=change.params["branch"],
            state__in=ACTIVE_STATES,
        ).first()
    active = Operation.objects.filter(job=job, state__in=ACTIVE_STATES).first()
    if active is None or active.kind != change.request:
        return None
    same = all(active.params.get(k) == v for k, v in change.params.items())
    return active if same else None


def apply(
    entries: list[JobEntry],
    *,
    user: AbstractBaseUser | AnonymousUser | None,
    via: str,
) -> list[Outcome]:
    """Make the requests `plan` lists (all of the file is checked first)."""
    changes = plan(entries)
    by_name = {entry.name: entry for entry in entries}
    outcomes: list[Outcome] = []
    requested: set[str] = set()  # jobs given an operation by this apply
    for change in changes:
        entry = by_name[change.job]
        if change.request == CREATE:
            app, version = _registered(entries.index(entry), entry)
            try:
                with transaction.atomic():
                    job_create(
                        name=entry.name,
                        application=app,
                        version=version,
                        branch=entry.branch,
                        parallelism=entry.parallelism,
                        spark_conf=entry.resources,
                        created_by=user if isinstance(user, AbstractBaseUser) else None,
                    )
            except EpochalError as exc:  # e.g. the name taken a moment ago
                outcomes.append(Outcome(change, "refused", detail=exc.message))
                continue
            outcomes.append(Outcome(change, "done"))
            continue
        job = Job.objects.select_related("application").filter(name=change.job).first()
        if job is None:  # its creation was refused above
            outcomes.append(Outcome(change, "refused", detail=f"there is no job {change.job}"))
            continue
        if change.request == AUTOSCALER:
            try:
                policy_set(job=job, changes=change.params, user=user, source=via)
            except EpochalError as exc:
                outcomes.append(Outcome(change, "refused", detail=exc.message))
                continue
            outcomes.append(Outcome(change, "done"))
            continue
        earlier = _active_same(job, change)
        if earlier is not None:
            outcomes.append(Outcome(change, "already requested", str(earlier.pk)))
            requested.add(job.name)
            continue
        if (
            job.name in requested
            or Operation.objects.filter(job=job, state__in=ACTIVE_STATES).exists()
        ):
            outcomes.append(Outcome(change, "waits"))
            continue
        try:
            done = operation_request(
                kind=change.request,
                application=job.application,
                job=job,
                params=change.params,
                user=user,
                reason="job file",
                via=via,
            )
        except Conflict:
            outcomes.append(Outcome(change, "waits"))
            continue
        except EpochalError as exc:  # the kind's own refusal (the file was checked whole)
            outcomes.append(Outcome(change, "refused", detail=exc.message))
            continue
        requested.add(job.name)
        outcomes.append(Outcome(change, "requested", str(done.operation.pk)))
    return outcomes


def export(*, application: str | None = None) -> list[JobEntry]:
    """Today's jobs as job-file entries (`epochal export`); applying them changes nothing."""
    jobs = Job.objects.select_related("application__store", "version").order_by("name")
    if application:
        jobs = jobs.filter(application__name=application)
    return [
        JobEntry(
            name=job.name,
            application=job.application.name,
            store=job.application.store.name if job.application.store is not None else "",
            version=job.version.number,
            job=job.version.job,
            branch=job.branch,
            parallelism=job.parallelism,
            state=job.desired_state,
            resources=dict(job.spark_conf),
            autoscaler=_policy(job),
            has_autoscaler=True,
        )
        for job in jobs
    ]
