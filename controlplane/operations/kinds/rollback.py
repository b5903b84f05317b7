"""rollback: return a branch to an earlier snapshot and go on from its state and offsets.

The abandoned commits stay reachable: an automatic tag names the old head, and the reflog
records the move. The new head is a "rollback" commit whose parent is the target snapshot
(same state and offsets), so the lineage shows where and why history turned back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from controlplane.applications.sinks import rollback_confirmation
from controlplane.errors import InvalidRequest, OperationFailed
from controlplane.jobs.store import job_repository
from controlplane.operations import integrity
from controlplane.operations.commits import derived_commit, tag_snapshot, update_control
from controlplane.operations.framework import OperationSpec, Phase, PhaseContext, Target
from controlplane.operations.kinds.common import (
    float_param,
    now_iso,
    phase_await_running,
    phase_relaunch,
    phase_stop,
    reject_unknown,
    resolve_snapshot,
    str_param,
)
from controlplane.operations.params import default_of
from snapshots_store import Manifest


class RollbackSpec(OperationSpec):
    kind = "rollback"
    summary = "move the branch back to an earlier snapshot and restart from it"

    def clean(self, params: Mapping[str, Any], target: Target) -> dict[str, Any]:
        reject_unknown(params, self.kind)
        job = target.job
        assert job is not None
        rev = str_param(params, "to", required=True)
        assert rev is not None
        repo = job_repository(job)
        head = repo.read_ref(f"heads/{job.branch}")
        if head is None:
            raise InvalidRequest(
                f"branch {job.branch!r} has no commits: nothing to roll back", code="empty_branch"
            )
        if rev == integrity.NEWEST_INTACT:
            sid = integrity.newest_intact(repo, job.branch)
        else:
            sid = resolve_snapshot(repo, rev, field="to")
        integrity.require_intact(repo, sid, job.branch)
        if sid == head.target:
            raise InvalidRequest(
                f"{rev} is the head of {job.branch} already",
                fields={"to": ["is the head"]},
                code="no_change",
            )
        if not repo.is_ancestor(sid, head.target):
            raise InvalidRequest(
                f"{rev} ({sid[:12]}) is not an earlier snapshot of branch {job.branch}; "
                "to start from a snapshot of another branch, fork it",
                fields={"to": ["not an ancestor of the branch head"]},
                code="not_an_ancestor",
            )
        cleaned: dict[str, Any] = {"to": sid, "rev": rev}
        # log sinks cannot go back: the operator confirms, the audit (these params) says so
        cleaned.update(rollback_confirmation(job.version.config, params))
        for name in ("stop_deadline_s", "start_timeout_s"):
            if name in params:
                cleaned[name] = float_param(params, name, default_of(self.kind, name))
        return cleaned

    def phases(self, params: Mapping[str, Any]) -> list[Phase]:
        return [
            Phase("check_source", _check_source, cancellable=True),
            Phase("verify_target", _verify_target, cancellable=True),
            Phase("stop", phase_stop, cancellable=True),
            Phase("tag_abandoned", _tag_abandoned),
            Phase("move_head", _move_head),
            Phase("restart", phase_relaunch),
            Phase("await_running", phase_await_running),
        ]


def source_retention_problem(job: Any, manifest: Manifest) -> str | None:
    """Why the job's source can no longer replay from `manifest`'s offsets (None: it can)."""
    from runners.engine.main import load_job
    from runners.engine.state_ops import replay_problem

    job_args = dict(job.version.config.get("job_args") or {})
    try:
        engine_job = load_job(job.version.job, job_args)
    except SystemExit as exc:  # load_job explains a bad reference or bad arguments
        return f"cannot load job {job.version.job}: {exc}"
    return replay_problem(engine_job.source, manifest)


def _check_source(ctx: PhaseContext) -> None:
    job = ctx.job
    manifest = job_repository(job).read_manifest(ctx.params["to"])
    problem = source_retention_problem(job, manifest)
    if problem:
        raise OperationFailed(
            f"cannot roll back to {ctx.params['to'][:12]} (epoch {manifest.epoch}): the source "
            f"no longer retains its offsets: {problem}. Choose a later snapshot, or restore "
            "the input and retry.",
            code="offsets_not_retained",
        )
    ctx.progress(1.0, f"the source still holds the input after epoch {manifest.epoch}")


def _tag_abandoned(ctx: PhaseContext) -> None:
    job = ctx.job
    repo = job_repository(job)
    head = repo.read_ref(f"heads/{job.branch}")
    assert head is not None
    old = ctx.remember("abandoned_head", lambda: head.target)
    name = f"rollback-{str(ctx.operation.pk)[:8]}-abandoned"
    tag_snapshot(
        repo,
        name,
        old,
        operation_id=str(ctx.operation.pk),
        reason=f"kept by rollback of {job.branch} to {ctx.params['to'][:12]}",
    )
    ctx.remember("abandoned_tag", lambda: name)
    ctx.progress(1.0, f"tagged the abandoned head {old[:12]} as {name}")


def _verify_target(ctx: PhaseContext) -> None:
    integrity.verify_before_moving(job_repository(ctx.job), ctx.params["to"], ctx.job.branch)
    ctx.progress(1.0, f"snapshot {ctx.params['to'][:12]} is intact")


def _move_head(ctx: PhaseContext) -> None:
    job = ctx.job
    repo = job_repository(job)
    target = ctx.params["to"]
    old = ctx.data["abandoned_head"]
    created_at = ctx.remember("created_at", now_iso)
    requester = ctx.operation.requested_by
    sid = derived_commit(
        repo,
        target,
        job.branch,
        kind="rollback",
        expected_head=old,
        operation_id=str(ctx.operation.pk),
        created_at=created_at,
        reason=f"rollback to {target[:12]}",
        provenance={
            "operation": "rollback",
            "rolled_back_to": target,
            "abandoned_head": old,
            "abandoned_tag": ctx.data.get("abandoned_tag", ""),
            "requested_by": "" if requester is None else requester.get_username(),
            "reason": ctx.operation.reason,
        },
        parallelism=job.parallelism,
    )
    # The engine reads the parallelism from the control document first: keep it in step.
    update_control(repo, job.branch, {"parallelism": job.parallelism})
    ctx.operation.result = {
        **ctx.operation.result,
        "snapshot": sid,
        "abandoned_head": old,
        "abandoned_tag": ctx.data.get("abandoned_tag"),
    }
    ctx.operation.save(update_fields=["result", "updated_at"])
    ctx.progress(1.0, f"branch {job.branch} now at {sid[:12]} (state of {target[:12]})")
