"""align: put a downstream job in aligned mode to its upstream job
(van Kaam, "Epoch alignment in stateful streams").

The control plane is the alignment coordinator: it writes commands into the downstream
branch's control document (`runners.engine.alignment`) and watches the sync state the store
shows. ``command=align`` (default) runs the whole protocol: catch_up -> wait until ready ->
align(E) with E a future downstream epoch -> wait until epoch E committed aligned.
``command=catch_up`` stops after ready; ``command=abort`` returns to unaligned. The web
(jobs and branch-output edges, this one included) must stay a DAG.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from controlplane.errors import InvalidRequest, OperationFailed
from controlplane.jobs.models import Job
from controlplane.jobs.selectors import job_get
from controlplane.jobs.store import job_repository
from controlplane.operations.framework import OperationSpec, Phase, PhaseContext, Target
from controlplane.operations.kinds.common import float_param, int_param, reject_unknown, str_param
from controlplane.operations.params import ALIGN_COMMANDS, default_of
from controlplane.operations.webs import source_for, validate_web
from runners.engine.alignment import AlignmentError, AlignmentStatus, alignment_status, send_command

COMMANDS = ALIGN_COMMANDS


def _pair(ctx: PhaseContext) -> tuple[Job, Any]:
    job = ctx.job
    upstream = job_get(name=str(ctx.params["upstream_job"]))
    return job, source_for(upstream, name=str(ctx.params["source"]))


def status_of(job: Job, source: Any) -> AlignmentStatus:
    repo = job_repository(job)
    return alignment_status(repo, job.branch, source, repo.read_control(job.branch)[0])


def _send(ctx: PhaseContext, command: str, from_epoch: int | None = None) -> dict[str, Any]:
    job, source = _pair(ctx)
    try:
        return send_command(job_repository(job), job.branch, source, command, from_epoch=from_epoch)
    except AlignmentError as exc:
        raise OperationFailed(str(exc), code="alignment_refused") from None


class AlignSpec(OperationSpec):
    kind = "align"
    summary = "align a downstream job's epochs to its upstream job (catch up, align, abort)"

    def clean(self, params: Mapping[str, Any], target: Target) -> dict[str, Any]:
        reject_unknown(params, self.kind)
        job = target.job
        assert job is not None
        name = str_param(params, "upstream_job", required=True)
        assert name is not None
        try:
            upstream = job_get(name=name)
        except Exception:
            raise InvalidRequest(
                f"no job {name!r}", fields={"upstream_job": ["unknown job"]}, code="unknown_job"
            ) from None
        if upstream.pk == job.pk:
            raise InvalidRequest(
                f"job {job.name} cannot be aligned to itself: the web would have the cycle "
                f"{job.name} -> {job.name}",
                fields={"upstream_job": ["the job itself"]},
                code="web_cycle",
            )
        validate_web([(upstream.name, job.name)])
        command = params.get("command", default_of(self.kind, "command"))
        if command not in COMMANDS:
            raise InvalidRequest(
                f"command must be one of {COMMANDS}", fields={"command": [repr(command)]}
            )
        cleaned: dict[str, Any] = {
            "upstream_job": upstream.name,
            "source": str_param(params, "source") or default_of(self.kind, "source"),
            "command": command,
            "timeout_s": float_param(params, "timeout_s", default_of(self.kind, "timeout_s")),
        }
        start = int_param(params, "from_epoch")
        if start is not None:
            cleaned["from_epoch"] = start
        source = source_for(upstream, name=cleaned["source"])
        status = status_of(job, source)
        if command != "abort" and status.pending:
            raise InvalidRequest(
                f"an align at epoch {status.from_epoch} is still pending; wait or abort",
                code="alignment_pending",
            )
        if command == "catch_up" and status.state != "unaligned":
            raise InvalidRequest(
                f"catch_up is accepted only when unaligned, not {status.state}",
                code="alignment_refused",
            )
        if command == "align" and status.state == "aligned":
            raise InvalidRequest(f"job {job.name} is aligned already", code="no_change")
        return cleaned

    def phases(self, params: Mapping[str, Any]) -> list[Phase]:
        if params["command"] == "abort":
            return [Phase("abort", _abort)]
        if params["command"] == "catch_up":
            return [
                Phase("catch_up", _catch_up, cancellable=True),
                Phase("await_ready", _await_ready, cancellable=True),
            ]
        return [
            Phase("catch_up", _catch_up, cancellable=True),
            Phase("await_ready", _await_ready, cancellable=True),
            Phase("align", _align),
            Phase("await_aligned", _await_aligned),
        ]


def _catch_up(ctx: PhaseContext) -> None:
    job, source = _pair(ctx)
    status = status_of(job, source)
    if status.state == "unaligned":
        _send(ctx, "catch_up")
        ctx.progress(1.0, f"catching up: {status.lag} upstream epoch(s) behind")
    else:
        ctx.progress(1.0, f"already {status.state}")


def _await_ready(ctx: PhaseContext) -> None:
    job, source = _pair(ctx)

    def ready() -> AlignmentStatus | None:
        status = status_of(job, source)
        return status if status.state in ("ready", "aligned") else None

    status = ctx.wait_until(
        ready,
        timeout_s=float(ctx.params["timeout_s"]),
        what=f"job {job.name} to catch up with {ctx.params['upstream_job']}",
        cancellable=True,
    )
    ctx.operation.result = {**ctx.operation.result, "ready": status.to_dict()}
    ctx.operation.save(update_fields=["result", "updated_at"])
    ctx.progress(1.0, f"ready: {status.lag} upstream epoch(s) behind")


def _align(ctx: PhaseContext) -> None:
    job, source = _pair(ctx)
    status = status_of(job, source)
    if status.state == "aligned" or status.pending:
        ctx.progress(1.0, f"align at epoch {status.from_epoch} already sent")
        return
    start = ctx.remember(
        "from_epoch", lambda: int(ctx.params.get("from_epoch") or status.downstream_epoch + 2)
    )
    doc = _send(ctx, "align", from_epoch=start)
    ctx.progress(1.0, f"aligned from downstream epoch {doc['from_epoch']}")


def _await_aligned(ctx: PhaseContext) -> None:
    job, source = _pair(ctx)

    def aligned() -> AlignmentStatus | None:
        status = status_of(job, source)
        return status if status.state == "aligned" else None

    status = ctx.wait_until(
        aligned,
        timeout_s=float(ctx.params["timeout_s"]),
        what=f"job {job.name} to commit its first aligned epoch",
    )
    ctx.operation.result = {**ctx.operation.result, "aligned": status.to_dict()}
    ctx.operation.save(update_fields=["result", "updated_at"])
    ctx.progress(1.0, f"aligned from epoch {status.from_epoch}")


def _abort(ctx: PhaseContext) -> None:
    _send(ctx, "abort")
    ctx.progress(1.0, "alignment aborted: the job places its own epoch boundaries again")


__all__ = ["AlignSpec"]
