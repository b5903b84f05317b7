"""start, stop and savepoint."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from controlplane.errors import Conflict, InvalidRequest
from controlplane.jobs.models import Job
from controlplane.jobs.store import job_repository
from controlplane.operations.commits import initial_commit, tag_snapshot
from controlplane.operations.framework import OperationSpec, Phase, PhaseContext, Target
from controlplane.operations.kinds.common import (
    float_param,
    int_param,
    job_is_running,
    now_iso,
    phase_await_running,
    phase_relaunch,
    phase_stop,
    reject_unknown,
    resolve_snapshot,
    str_param,
)
from controlplane.operations.params import (
    DEFAULT_START_TIMEOUT_S,
    DEFAULT_STOP_DEADLINE_S,
    default_of,
)
from snapshots_store.errors import InvalidNameError
from snapshots_store.names import check_branch_name


class StartSpec(OperationSpec):
    kind = "start"
    summary = "launch the job from its branch head (or an empty initial snapshot)"

    def clean(self, params: Mapping[str, Any], target: Target) -> dict[str, Any]:
        reject_unknown(params, self.kind)
        assert target.job is not None
        if job_is_running(target.job):
            raise Conflict(
                f"job {target.job.name} is already running; stop it first or use rescale",
                code="job_running",
            )
        from_empty = params.get("from_empty", default_of(self.kind, "from_empty"))
        if not isinstance(from_empty, bool):
            raise InvalidRequest(
                "from_empty must be true or false", fields={"from_empty": ["bool"]}
            )
        cleaned: dict[str, Any] = {"from_empty": from_empty, "start": True}
        if "start_timeout_s" in params:
            cleaned["start_timeout_s"] = float_param(
                params, "start_timeout_s", DEFAULT_START_TIMEOUT_S
            )
        return cleaned

    def phases(self, params: Mapping[str, Any]) -> list[Phase]:
        return [
            Phase("prepare", _prepare_start, cancellable=True),
            Phase("launch", phase_relaunch),
            Phase("await_running", phase_await_running),
        ]


def _prepare_start(ctx: PhaseContext) -> None:
    job = ctx.job
    if ctx.operation.requested_via != "reconciler":
        # a person starting the job (after fixing what made it fail) gives it its whole
        # restart budget back; the restart policy's own starts count against it
        Job.objects.filter(pk=job.pk).update(restarts=0, next_restart_at=None)
    repo = job_repository(job)
    head = repo.read_ref(f"heads/{job.branch}")
    if head is not None:
        ctx.remember("base", lambda: head.target)
        ctx.progress(1.0, f"resuming from head {head.target[:12]}")
        return
    if not ctx.params.get("from_empty"):
        ctx.progress(1.0, "the branch has no commits yet: the first epoch starts from nothing")
        return
    created_at = ctx.remember("created_at", now_iso)
    sid = initial_commit(
        repo,
        job.branch,
        max_parallelism=job.application.max_parallelism,
        parallelism=job.parallelism,
        operation_id=str(ctx.operation.pk),
        created_at=created_at,
        code_version=job.version.code_version,
    )
    ctx.remember("base", lambda: sid)
    ctx.progress(1.0, f"created the empty initial snapshot {sid[:12]}")


class StopSpec(OperationSpec):
    kind = "stop"
    summary = "stop the job at its next epoch boundary"

    def clean(self, params: Mapping[str, Any], target: Target) -> dict[str, Any]:
        reject_unknown(params, self.kind)
        cleaned: dict[str, Any] = {}
        if "stop_deadline_s" in params:
            cleaned["stop_deadline_s"] = float_param(
                params, "stop_deadline_s", DEFAULT_STOP_DEADLINE_S
            )
        return cleaned

    def phases(self, params: Mapping[str, Any]) -> list[Phase]:
        return [Phase("stop", phase_stop)]


class SavepointSpec(OperationSpec):
    kind = "savepoint"
    summary = "tag a commit (retention-protected), optionally after forcing a new epoch"

    def clean(self, params: Mapping[str, Any], target: Target) -> dict[str, Any]:
        reject_unknown(params, self.kind)
        assert target.job is not None
        cleaned: dict[str, Any] = {}
        name = str_param(params, "name")
        if name is not None:
            try:
                check_branch_name(name, what="tag")
            except InvalidNameError as exc:
                raise InvalidRequest(str(exc), fields={"name": [exc.reason]}) from None
            cleaned["name"] = name
        force = params.get("force_epoch", default_of(self.kind, "force_epoch"))
        if not isinstance(force, bool):
            raise InvalidRequest("force_epoch must be true or false", fields={"force_epoch": []})
        snapshot = str_param(params, "snapshot")
        if snapshot is not None and force:
            raise InvalidRequest(
                "give either snapshot or force_epoch, not both",
                fields={"force_epoch": ["cannot be combined with snapshot"]},
            )
        if snapshot is not None:
            cleaned["snapshot"] = resolve_snapshot(target.job, snapshot, field="snapshot")
        elif (
            job_repository(target.job).read_ref(f"heads/{target.job.branch}") is None and not force
        ):
            raise InvalidRequest(
                f"branch {target.job.branch!r} has no commits yet: nothing to savepoint",
                code="empty_branch",
            )
        if force and not job_is_running(target.job):
            raise Conflict(
                f"force_epoch needs a running job; {target.job.name} is {target.job.state}",
                code="job_not_running",
            )
        cleaned["force_epoch"] = force
        cleaned["timeout_s"] = float_param(params, "timeout_s", default_of(self.kind, "timeout_s"))
        return cleaned

    def phases(self, params: Mapping[str, Any]) -> list[Phase]:
        return [Phase("await_epoch", _await_epoch, cancellable=True), Phase("tag", _tag)]


def _head(ctx: PhaseContext) -> str | None:
    job = ctx.job
    ref = job_repository(job).read_ref(f"heads/{job.branch}")
    return None if ref is None else ref.target


def _await_epoch(ctx: PhaseContext) -> None:
    params = ctx.params
    if params.get("snapshot"):
        ctx.remember("snapshot", lambda: params["snapshot"])
        return
    before = ctx.remember("head_before", lambda: _head(ctx))
    if not params.get("force_epoch"):
        ctx.remember("snapshot", lambda: before)
        return

    def moved() -> str | None:
        head = _head(ctx)
        return head if head is not None and head != before else None

    ctx.progress(0.1, "waiting for the next epoch to commit")
    sid = ctx.wait_until(
        moved, timeout_s=float(params["timeout_s"]), what="the next epoch", cancellable=True
    )
    ctx.remember("snapshot", lambda: sid)
    ctx.progress(1.0, f"epoch committed as {sid[:12]}")


def _tag(ctx: PhaseContext) -> None:
    job = ctx.job
    repo = job_repository(job)
    sid = ctx.data["snapshot"]
    manifest = repo.read_manifest(sid)
    name = (
        ctx.params.get("name")
        or f"savepoint-{job.branch.replace('/', '-')}-e{manifest.epoch}-{str(ctx.operation.pk)[:8]}"
    )
    tag_snapshot(
        repo,
        name,
        sid,
        operation_id=str(ctx.operation.pk),
        reason=ctx.operation.reason or f"savepoint of {job.name}",
    )
    ctx.operation.result = {**ctx.operation.result, "tag": name, "snapshot": sid}
    ctx.operation.save(update_fields=["result", "updated_at"])
    ctx.progress(1.0, f"tagged {sid[:12]} as {name}")


__all__ = ["SavepointSpec", "StartSpec", "StopSpec", "int_param"]
