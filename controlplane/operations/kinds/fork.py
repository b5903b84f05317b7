"""fork: a new branch and job from any snapshot, running an existing version, with provenance.

The fork commit reuses the source snapshot's state and offsets (nothing is copied) and records
who forked, from what, why, and which version of the code the new branch runs. An operator's
fork names an existing `version` (default: the source job's, else the latest); only an
admin's fork may create a new version (`job`, `code_version`, `config`: code). Every
parameter is checked before the operation is written, so a refused fork leaves nothing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from django.db import IntegrityError, transaction

from controlplane.accounts.roles import ADMIN, has_role
from controlplane.applications.models import NAME_PATTERN, Application, ApplicationVersion
from controlplane.applications.sinks import shared_sink_errors, sink_writers, version_sink_errors
from controlplane.errors import Conflict, Forbidden, InvalidRequest
from controlplane.jobs.models import Job
from controlplane.jobs.services import job_create, version_config_errors
from controlplane.jobs.spark_conf import operator_spark_conf
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
from controlplane.operations.params import ADMIN_ONLY_PARAMS, DEFAULT_START_TIMEOUT_S, default_of
from runners import entry_points
from snapshots_store.errors import InvalidNameError
from snapshots_store.names import check_branch_name

#: a new version is code: only an admin's fork may give these (an operator names `version`)
ADMIN_PARAMS = ADMIN_ONLY_PARAMS["fork"]


class ForkSpec(OperationSpec):
    kind = "fork"
    needs_job = False
    summary = "new branch (+ job) from any snapshot, running an existing version"

    def authorize(self, params: Mapping[str, Any], target: Target) -> None:
        new_version = sorted(ADMIN_PARAMS & set(params))
        if new_version and target.user is not None and not has_role(target.user, ADMIN):
            raise Forbidden(
                "a fork runs an existing version: job, code_version and config make a new "
                "version, which only an admin may create; name one with version",
                code="admin_only",
                fields={name: ["only an admin may set this; give version"] for name in new_version},
            )

    def clean(self, params: Mapping[str, Any], target: Target) -> dict[str, Any]:
        """Everything is checked here, before the operation is written: a refused fork leaves
        no version, branch or job behind."""
        reject_unknown(params, self.kind)
        application = target.application
        new_version = sorted(ADMIN_PARAMS & set(params))
        self.authorize(params, target)
        if new_version and "version" in params:
            raise InvalidRequest(
                "give either version (an existing one) or job/code_version/config (a new one)",
                fields={"version": [f"not together with {new_version}"]},
            )
        branch = str_param(params, "branch", required=True)
        assert branch is not None
        try:
            check_branch_name(branch)
        except InvalidNameError as exc:
            raise InvalidRequest(str(exc), fields={"branch": [exc.reason]}) from None
        job_name = str_param(params, "job_name") or f"{application.name}-{branch}".replace("/", "-")
        if not re.fullmatch(NAME_PATTERN, job_name):
            raise InvalidRequest(
                f"job_name {job_name!r} is not a job name (letters, digits, '.', '_', '-'; "
                "at most 100); pass job_name",
                fields={"job_name": ["must match " + NAME_PATTERN]},
            )
        start = params.get("start", default_of(self.kind, "start"))
        if not isinstance(start, bool):
            raise InvalidRequest("start must be true or false", fields={"start": ["bool"]})
        p_given = int_param(params, "parallelism")
        spark_conf = operator_spark_conf(params.get("spark_conf", {}))
        base = self._base(params, target)
        cleaned: dict[str, Any] = {
            "branch": branch,
            "job_name": job_name,
            "base_version": None if base is None else base.pk,
            "start": start,
            "spark_conf": spark_conf,
        }
        if new_version:
            cleaned["new_version"] = self._new_version(params, base)
            cleaned["version_id"] = None
        else:
            cleaned["version_id"] = _runnable(application, base).pk
        if "sinks" in params:
            _with_sinks(params["sinks"], cleaned, base)
        config = (
            cleaned["new_version"]["config"]
            if cleaned.get("new_version")
            else base.config
            if base
            else {}
        )
        shared = shared_sink_errors(config, sink_writers(application))
        if shared:
            raise InvalidRequest("; ".join(shared), fields={"version": shared}, code="sink_taken")
        _refuse_taken(application, branch, job_name)
        repo = application_repository(application)
        rev = str_param(params, "snapshot", required=True)
        assert rev is not None
        sid = resolve_snapshot(repo, rev, field="snapshot")
        if repo.read_ref(f"heads/{branch}") is not None:
            raise Conflict(
                f"branch {branch!r} exists already; choose another name",
                code="branch_exists",
                fields={"branch": ["exists"]},
            )
        source = repo.read_manifest(sid)
        p = source.parallelism if p_given is None else p_given
        limit = min(source.max_parallelism, application.max_parallelism)
        if p > limit:
            raise InvalidRequest(
                f"parallelism {p} exceeds the lineage's M={limit}",
                fields={"parallelism": [f"must be <= {limit}"]},
            )
        cleaned.update(snapshot=sid, parallelism=p)
        if "start_timeout_s" in params:
            cleaned["start_timeout_s"] = float_param(
                params, "start_timeout_s", DEFAULT_START_TIMEOUT_S
            )
        return cleaned

    @staticmethod
    def _base(params: Mapping[str, Any], target: Target) -> ApplicationVersion | None:
        """The version the fork runs (or grows a new one from): `version`, else the source
        job's, else the application's latest."""
        application = target.application
        number = int_param(params, "version")
        if number is not None:
            version = application.versions.filter(number=number).first()
            if version is None:
                raise InvalidRequest(
                    f"application {application.name} has no version {number}; list them with "
                    f"GET /api/applications/{application.name}/versions/",
                    fields={"version": [f"no version {number}"]},
                )
            return version
        if target.job is not None:
            return target.job.version
        return application.versions.order_by("-number").first()

    @staticmethod
    def _new_version(params: Mapping[str, Any], base: ApplicationVersion | None) -> dict[str, Any]:
        """The new version an admin's fork creates (job, code_version, config), validated."""
        if base is None and not params.get("job"):
            raise InvalidRequest(
                "the application has no versions to fork from; give job",
                fields={"job": ["required: the application has no versions"]},
            )
        job_name = str_param(params, "job") or (base.job if base else "")
        unusable = entry_points.lookup_error(entry_points.JOBS, job_name)
        if unusable:
            raise InvalidRequest(unusable, fields={"job": [unusable]})
        config = params.get("config", base.config if base else {})
        errors = version_config_errors(config)
        if errors:
            raise InvalidRequest("config cannot be launched", fields=errors)
        code_version = params.get("code_version", base.code_version if base else "")
        if not isinstance(code_version, str) or len(code_version) > 255:
            raise InvalidRequest(
                "code_version is a string of at most 255 characters",
                fields={"code_version": ["string, at most 255 characters"]},
            )
        return {"job": job_name, "code_version": code_version, "config": config}

    def creates_branch(self, params: Mapping[str, Any]) -> str:
        return str(params["branch"])

    def phases(self, params: Mapping[str, Any]) -> list[Phase]:
        create = [Phase("create_version", _create_version, cancellable=True)]
        return [
            *(create if _new_version(params) is not None else []),
            Phase("create_branch", _create_branch),
            Phase("create_job", _create_job),
            Phase("start", _start),
            Phase("await_running", phase_await_running),
        ]


def _new_version(params: Mapping[str, Any]) -> dict[str, Any] | None:
    """The new version to create; operations written before forks ran existing versions
    carried job/code_version/config at the top level."""
    if params.get("new_version"):
        return dict(params["new_version"])
    if "job" in params and "version_id" not in params:
        return {k: params[k] for k in ("job", "code_version", "config")}
    return None


def _version(ctx: PhaseContext) -> ApplicationVersion:
    version_id = ctx.operation.context.get("version_id") or ctx.params.get("version_id")
    return ApplicationVersion.objects.get(pk=version_id)


def _create_version(ctx: PhaseContext) -> None:
    op = ctx.operation
    existing = op.context.get("version_id")
    if existing is not None and ApplicationVersion.objects.filter(pk=existing).exists():
        return
    params = ctx.params
    new = _new_version(params)
    assert new is not None
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
                    job=new["job"],
                    code_version=new["code_version"],
                    config=new["config"],
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
    version = _version(ctx)
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
            version=_version(ctx),
            branch=params["branch"],
            parallelism=params["parallelism"],
            spark_conf=params.get("spark_conf") or None,
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


def _runnable(application: Application, base: ApplicationVersion | None) -> ApplicationVersion:
    """The existing version a fork without a new version runs; InvalidRequest when none can."""
    if base is None:
        raise InvalidRequest(
            f"application {application.name} has no version to fork to; an admin "
            "creates one first (POST /api/applications/{name}/versions/)",
            fields={"version": ["the application has no versions"]},
        )
    unusable = entry_points.lookup_error(entry_points.JOBS, base.job)
    if unusable:
        raise InvalidRequest(
            f"version {base.number} cannot run: {unusable}",
            fields={"version": [unusable]},
            code="unregistered_job",
        )
    return base


def _with_sinks(sinks: Any, cleaned: dict[str, Any], base: ApplicationVersion | None) -> None:
    """The fork writes to `sinks` (registered sink names) instead of its version's: when
    they differ, it runs a new version like its own but for them (an operator picks among
    registered sinks; choosing a place stays with admins)."""
    errors = version_sink_errors(sinks)
    if errors:
        raise InvalidRequest("; ".join(errors), fields={"sinks": errors}, code="unknown_sink")
    source = cleaned.get("new_version") or {
        "job": base.job if base else "",
        "code_version": base.code_version if base else "",
        "config": base.config if base else {},
    }
    config = source["config"] if isinstance(source["config"], Mapping) else {}
    if list(config.get("sinks", [])) == list(sinks):
        return
    new_config = {**config, "sinks": list(sinks)}
    if not sinks:
        del new_config["sinks"]
    cleaned["new_version"] = {**source, "config": new_config}
    cleaned["version_id"] = None


def _refuse_taken(application: Application, branch: str, job_name: str) -> None:
    """Conflict when a job runs `branch` already or `job_name` is taken."""
    taken = Job.objects.filter(application=application, branch=branch).first()
    if taken is not None:
        raise Conflict(
            f"branch {branch!r} exists already (job {taken.name!r} runs it); choose another name",
            code="branch_exists",
            fields={"branch": ["has a job"]},
        )
    if Job.objects.filter(name=job_name).exists():
        raise Conflict(
            f"a job named {job_name!r} exists already; pass job_name",
            code="job_exists",
            fields={"job_name": ["exists"]},
        )
