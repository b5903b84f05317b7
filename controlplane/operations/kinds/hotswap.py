"""hotswap: replace a running job by a new version at a swap epoch S, exactly once.

The new job is a fork of the old job's branch (the ``fork`` operation) started beside it;
both number epochs and read input alike. The coordinator delivers S to both jobs in a
two-step commit (`runners.engine.hotswap`): prepare (both control documents), wait until
both acknowledged it in a committed epoch, commit, re-point the downstream jobs that read the
old job's branch output (they read it up to S and the new job's branch after S), wait until
the old job committed S and the new job emitted its first epoch after S, then retire the old
job (its runner stops by itself at the boundary after S; the job is marked stopped with the
reason). Every epoch's results reach the output from exactly one job: the old one up to S,
the new one after. Each phase is idempotent (the
swap state lives in the control documents and manifests), so a worker killed mid-operation
resumes, and either job may crash and restart between the steps.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from controlplane.errors import InvalidRequest, OperationFailed
from controlplane.jobs.models import Job, JobState
from controlplane.jobs.selectors import job_get
from controlplane.jobs.services import job_set_state, job_stop_runs
from controlplane.operations.framework import (
    CancelledError,
    OperationSpec,
    Phase,
    PhaseContext,
    Target,
)
from controlplane.operations.kinds.common import float_param, int_param, reject_unknown, str_param
from controlplane.operations.params import DEFAULT_STOP_DEADLINE_S, default_of
from controlplane.operations.webs import web_edges
from runners.engine.hotswap import (
    SwapError,
    SwapSide,
    acknowledged,
    check_swappable,
    head_epoch,
    repoint_downstream,
    send_phase,
    swapped,
)


def side_of(job: Job) -> SwapSide:
    return SwapSide(job.effective_store_url, job.application.store_namespace, job.branch)


def _sides(ctx: PhaseContext) -> tuple[SwapSide, SwapSide]:
    return side_of(ctx.job), side_of(job_get(name=str(ctx.params["new_job"])))


class HotswapSpec(OperationSpec):
    kind = "hotswap"
    summary = "swap a job for a new version at epoch S: old output up to S, new after"

    def clean(self, params: Mapping[str, Any], target: Target) -> dict[str, Any]:
        reject_unknown(params, self.kind)
        job = target.job
        assert job is not None
        name = str_param(params, "new_job", required=True)
        assert name is not None
        try:
            new = job_get(name=name)
        except Exception:
            raise InvalidRequest(
                f"no job {name!r}", fields={"new_job": ["unknown job"]}, code="unknown_job"
            ) from None
        if new.pk == job.pk:
            raise InvalidRequest("a job cannot be swapped for itself", code="no_change")
        old_side, new_side = side_of(job), side_of(new)
        try:
            check_swappable(old_side, new_side)
        except SwapError as exc:
            raise InvalidRequest(
                str(exc), fields={"new_job": [str(exc)]}, code="not_swappable"
            ) from None
        cleaned: dict[str, Any] = {
            "new_job": new.name,
            "lead_epochs": int_param(
                params, "lead_epochs", default=default_of(self.kind, "lead_epochs")
            ),
            "timeout_s": float_param(params, "timeout_s", default_of(self.kind, "timeout_s")),
        }
        s = int_param(params, "swap_epoch")
        if s is not None:
            now = max(head_epoch(old_side), head_epoch(new_side))
            if s <= now:
                raise InvalidRequest(
                    f"swap_epoch {s} is not in the future (the jobs are at epoch {now})",
                    fields={"swap_epoch": [f"must be > {now}"]},
                )
            cleaned["swap_epoch"] = s
        return cleaned

    def phases(self, params: Mapping[str, Any]) -> list[Phase]:
        return [
            Phase("prepare", _prepare, cancellable=True),
            Phase("await_prepared", _await_prepared, cancellable=True),
            Phase("commit", _commit),
            Phase("repoint", _repoint),
            Phase("await_swapped", _await_swapped),
            Phase("retire", _retire),
        ]


def _swap_epoch(ctx: PhaseContext) -> int:
    old, new = _sides(ctx)

    def choose() -> int:
        given = ctx.params.get("swap_epoch")
        if given is not None:
            return int(given)
        return max(head_epoch(old), head_epoch(new)) + int(ctx.params["lead_epochs"])

    return int(ctx.remember("swap_epoch", choose))


def _prepare(ctx: PhaseContext) -> None:
    old, new = _sides(ctx)
    s = _swap_epoch(ctx)
    send_phase(str(ctx.operation.pk), old, new, s, "prepared")
    ctx.operation.result = {**ctx.operation.result, "swap_epoch": s}
    ctx.operation.save(update_fields=["result", "updated_at"])
    ctx.progress(1.0, f"swap epoch {s} prepared in both control documents")


def _await_prepared(ctx: PhaseContext) -> None:
    old, new = _sides(ctx)
    swap_id = str(ctx.operation.pk)

    def both() -> tuple[int, int] | None:
        a, b = acknowledged(old, swap_id, "prepared"), acknowledged(new, swap_id, "prepared")
        return None if a is None or b is None else (a, b)

    try:
        a, b = ctx.wait_until(
            both,
            timeout_s=float(ctx.params["timeout_s"]),
            what="both jobs to acknowledge the swap in a committed epoch",
            cancellable=True,
        )
    except (CancelledError, OperationFailed):
        # before the commit the swap can still be called off: the old job emits again
        send_phase(swap_id, old, new, _swap_epoch(ctx), "aborted")
        raise
    ctx.progress(1.0, f"acknowledged in epoch {a} (old) and {b} (new)")


def _commit(ctx: PhaseContext) -> None:
    old, new = _sides(ctx)
    send_phase(str(ctx.operation.pk), old, new, _swap_epoch(ctx), "committed")
    ctx.progress(1.0, "swap committed in both control documents")


def _await_swapped(ctx: PhaseContext) -> None:
    old, new = _sides(ctx)
    s = _swap_epoch(ctx)
    swap_id = str(ctx.operation.pk)
    ctx.wait_until(
        lambda: True if swapped(old, new, swap_id, s) else None,
        timeout_s=float(ctx.params["timeout_s"]),
        what=f"the old job to commit epoch {s} and the new one to emit after it",
    )
    ctx.operation.result = {**ctx.operation.result, "swapped": True}
    ctx.operation.save(update_fields=["result", "updated_at"])
    ctx.progress(1.0, f"output comes from {ctx.params['new_job']} after epoch {s}")


def _repoint(ctx: PhaseContext) -> None:
    """Every job reading the old job's branch output reads the new job's after S."""
    old_job = ctx.job
    old, new = _sides(ctx)
    s = _swap_epoch(ctx)

    def readers() -> list[list[str]]:
        return sorted(
            [e.downstream, e.source]
            for e in web_edges()
            if e.upstream == old_job.name and e.downstream != ctx.params["new_job"]
        )

    targets = ctx.remember("downstream", readers)
    for name, source in targets:
        repoint_downstream(side_of(job_get(name=name)), source, old, new, s, str(ctx.operation.pk))
    ctx.operation.result = {**ctx.operation.result, "repointed": [n for n, _ in targets]}
    ctx.operation.save(update_fields=["result", "updated_at"])
    ctx.progress(
        1.0,
        f"{len(targets)} downstream job(s) read {ctx.params['new_job']} after epoch {s}"
        if targets
        else "no downstream jobs read the old job's output",
    )


def _retire(ctx: PhaseContext) -> None:
    """The old job stopped by itself at the boundary after S: record it as retired."""
    job = ctx.job
    s = _swap_epoch(ctx)
    job_stop_runs(job, deadline_s=float(ctx.params.get("stop_deadline_s", DEFAULT_STOP_DEADLINE_S)))
    job_set_state(
        job,
        JobState.STOPPED,
        reason=f"retired: swapped for {ctx.params['new_job']} at epoch {s} (hotswap "
        f"{ctx.operation.pk})",
    )
    ctx.progress(1.0, f"{job.name} retired at epoch {s}")


__all__ = ["HotswapSpec"]
