"""fork: a new branch, application version and job from any snapshot, with provenance.

The fork commit reuses the source snapshot's state and offsets (nothing is copied) and records
who forked, from what, why, and which version of the code the new branch runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.db import IntegrityError, transaction

from controlplane.applications.models import ApplicationVersion
from controlplane.errors import Conflict, InvalidRequest
from controlplane.jobs.models import Job
from controlplane.jobs.services import job_create, version_config_errors
from controlplane.jobs.store import application_repository
from controlplane.operations.commits import derived_commit
from controlplane.operations.framework import OperationSpec, Phase, PhaseContext, Target
from controlplane.operations.kinds.common import (
    float_param,
    int_param,
    now_iso,
    phase_await_running,
    phase_relaunch,
    reject_unknown,
    resolve_snapshot,
    str_param,
)
from snapshots_store.errors import InvalidNameError
from snapshots_store.names import check_branch_name

ALLOWED = {
    "snapshot",
    "branch",
    "job_name",
    "job",
    "code_version",
    "config",
    "parallelism",
    "start",
    "start_timeout_s",
}


class ForkSpec(OperationSpec):
    kind = "fork"
    needs_job = False
    summary = "new branch + application version (+ job) from any snapshot"

    def clean(self, params: Mapping[str, Any], target: Target) -> dict[str, Any]:
        reject_unknown(params, ALLOWED)
        application = target.application
        repo = application_repository(application)
        rev = str_param(params, "snapshot", required=True)
        assert rev is not None
        sid = resolve_snapshot(repo, rev, field="snapshot")
        branch = str_param(params, "branch", required=True)
        assert branch is not None
        try:
            check_branch_name(branch)
        except InvalidNameError as exc:
            raise InvalidRequest(str(exc), fields={"branch": [exc.reason]}) from None
        if repo.read_ref(f"heads/{branch}") is not None:
            raise Conflict(
                f"branch {branch!r} exists already; choose another name",
                code="branch_exists",
                fields={"branch": ["exists"]},
            )
        source = repo.read_manifest(sid)
        base = (
            target.job.version
            if target.job is not None
            else application.versions.order_by("-number").first()
        )
        if base is None and not params.get("job"):
            raise InvalidRequest(
                f"application {application.name} has no version to fork from; give job",
                fields={"job": ["required: the application has no versions"]},
            )
        job_ref = str_param(params, "job") or (base.job if base else "")
        config = params.get("config", base.config if base else {})
        errors = version_config_errors(config)
        if errors:
            raise InvalidRequest("config cannot be launched", fields=errors)
        job_name = str_param(params, "job_name") or f"{application.name}-{branch}".replace("/", "-")
        if Job.objects.filter(name=job_name).exists():
            raise Conflict(
                f"a job named {job_name!r} exists already; pass job_name",
                code="job_exists",
                fields={"job_name": ["exists"]},
            )
        p = int_param(params, "parallelism", default=source.parallelism)
        assert p is not None
        if p > source.max_parallelism:
            raise InvalidRequest(
                f"parallelism {p} exceeds the lineage's M={source.max_parallelism}",
                fields={"parallelism": [f"must be <= {source.max_parallelism}"]},
            )
        start = params.get("start", False)
        if not isinstance(start, bool):
            raise InvalidRequest("start must be true or false", fields={"start": ["bool"]})
        cleaned = {
            "snapshot": sid,
            "branch": branch,
            "job_name": job_name,
            "job": job_ref,
            "code_version": str_param(params, "code_version")
            or (base.code_version if base else ""),
            "config": config,
            "base_version": None if base is None else base.pk,
            "parallelism": p,
            "start": start,
        }
        if "start_timeout_s" in params:
            cleaned["start_timeout_s"] = float_param(params, "start_timeout_s", 180)
        return cleaned

    def phases(self, params: Mapping[str, Any]) -> list[Phase]:
        return [
            Phase("create_version", _create_version, cancellable=True),
            Phase("create_branch", _create_branch),
            Phase("create_job", _create_job),
            Phase("start", _start),
            Phase("await_running", phase_await_running),
        ]


def _create_version(ctx: PhaseContext) -> None:
    op = ctx.operation
    existing = op.context.get("version_id")
    if existing is not None and ApplicationVersion.objects.filter(pk=existing).exists():
        return
    params = ctx.params
    for _ in range(5):
        number = (
            ApplicationVersion.objects.filter(application=op.application)
            .order_by("-number")
            .values_list("number", flat=True)
            .first()
            or 0
        ) + 1
        try:
            with transaction.atomic():
                version = ApplicationVersion.objects.create(
                    application=op.application,
                    number=number,
                    job=params["job"],
                    code_version=params["code_version"],
                    config=params["config"],
                    source_snapshot_id=params["snapshot"],
                    parent_id=params.get("base_version"),
                    reason=op.reason,
                    created_by=op.requested_by,
                )
                op.context["version_id"] = version.pk
                op.save(update_fields=["context", "updated_at"])
            break
        except IntegrityError:
            continue  # another fork took this number
    ctx.progress(1.0, f"created version {number}")


def _create_branch(ctx: PhaseContext) -> None:
    op = ctx.operation
    params = ctx.params
    repo = application_repository(op.application)
    version = ApplicationVersion.objects.get(pk=op.context["version_id"])
    created_at = ctx.remember("created_at", now_iso)
    sid = derived_commit(
        repo,
        params["snapshot"],
        params["branch"],
        kind="fork",
        expected_head=None,
        operation_id=str(op.pk),
        created_at=created_at,
        reason=f"fork from {params['snapshot'][:12]}",
        provenance={
            "operation": "fork",
            "source_snapshot": params["snapshot"],
            "requested_by": "" if op.requested_by is None else op.requested_by.get_username(),
            "reason": op.reason,
            "version": str(version.number),
            "job": version.job,
            "code_version": version.code_version,
        },
        parallelism=params["parallelism"],
        code_version=version.code_version,
    )
    op.result = {
        **op.result,
        "snapshot": sid,
        "branch": params["branch"],
        "version": version.number,
    }
    op.save(update_fields=["result", "updated_at"])
    ctx.progress(1.0, f"branch {params['branch']} created at {sid[:12]}")


def _create_job(ctx: PhaseContext) -> None:
    op = ctx.operation
    params = ctx.params
    job = Job.objects.filter(name=params["job_name"]).first()
    if job is None:
        job = job_create(
            name=params["job_name"],
            application=op.application,
            version=ApplicationVersion.objects.get(pk=op.context["version_id"]),
            branch=params["branch"],
            parallelism=params["parallelism"],
            created_by=op.requested_by,
        )
    op.context["fork_job_id"] = job.pk
    op.result = {**op.result, "job": job.name}
    op.save(update_fields=["context", "result", "updated_at"])
    ctx.progress(1.0, f"created job {job.name}")


def _start(ctx: PhaseContext) -> None:
    op = ctx.operation
    if not ctx.params.get("start"):
        ctx.progress(1.0, "not started (start=false)")
        return
    # The relaunch phase works on ctx.job; a fork's operation has none: lend it the new job.
    job = Job.objects.get(pk=op.context["fork_job_id"])
    op.context["was_running"] = True
    original = op.job
    op.job = job
    try:
        phase_relaunch(ctx)
    finally:
        op.job = original
