"""rescale: change a job's parallelism, live at the next epoch or by a restart.

Live: the new parallelism goes into the branch's control document; the engine applies it at
the next epoch boundary (the first epoch at the new parallelism is a commit of kind
"rescale"). Restart: stop at an epoch boundary, commit a metadata-only "rescale" snapshot
(key groups make the state layout independent of the parallelism, so nothing is copied),
relaunch with resources for the new parallelism, restore from that snapshot.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from controlplane.errors import InvalidRequest
from controlplane.jobs.models import Job
from controlplane.jobs.services import job_set_parallelism, job_set_state
from controlplane.jobs.store import job_repository
from controlplane.operations.commits import derived_commit, update_control
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
)
from controlplane.operations.params import DEFAULT_STOP_DEADLINE_S, RESCALE_MODES, default_of
from runners.job_spec import JobSpec

MODES = RESCALE_MODES


def lineage_max_parallelism(job: Job) -> int:
    """M of the job's lineage: the head's (fixed once committed), else the application's."""
    repo = job_repository(job)
    head = repo.read_ref(f"heads/{job.branch}")
    if head is None:
        return job.application.max_parallelism
    return repo.read_manifest(head.target).max_parallelism


def choose_mode(job: Job, parallelism: int) -> str:
    """Policy for mode=auto: live when the running run has cores for the new parallelism."""
    if not job_is_running(job):
        return "restart"
    run = job.runs.order_by("-created_at").first()
    if run is None or run.handle is None:
        return "restart"
    spec = JobSpec.from_dict(run.spec)
    if run.runner == "local":
        return "live" if parallelism <= run.parallelism else "restart"
    have = spec.resources.executor_count(spec.parallelism) * spec.resources.executor_cores
    return "live" if parallelism <= have else "restart"


class RescaleSpec(OperationSpec):
    kind = "rescale"
    summary = "change the parallelism, live at the next epoch or by a restart"

    def clean(self, params: Mapping[str, Any], target: Target) -> dict[str, Any]:
        reject_unknown(params, self.kind)
        job = target.job
        assert job is not None
        p = int_param(params, "parallelism")
        if p is None:
            raise InvalidRequest("parallelism is required", fields={"parallelism": ["required"]})
        m = lineage_max_parallelism(job)
        if p > m:
            raise InvalidRequest(
                f"parallelism {p} exceeds the lineage's max parallelism M={m} (key groups); "
                "a larger M needs a rehash migration first",
                fields={"parallelism": [f"must be <= {m}"]},
                code="parallelism_above_max",
            )
        if p == job.parallelism:
            raise InvalidRequest(
                f"job {job.name} already runs at parallelism {p}",
                fields={"parallelism": ["unchanged"]},
                code="no_change",
            )
        mode = params.get("mode", default_of(self.kind, "mode"))
        if mode not in MODES:
            raise InvalidRequest(f"mode must be one of {MODES}", fields={"mode": [repr(mode)]})
        if mode == "live" and not job_is_running(job):
            raise InvalidRequest(
                f"a live rescale needs a running job; {job.name} is {job.state}: use "
                "mode=restart (it rescales the stopped job and leaves it stopped)",
                fields={"mode": ["live needs a running job"]},
                code="job_not_running",
            )
        chosen = choose_mode(job, p) if mode == "auto" else mode
        cleaned: dict[str, Any] = {
            "parallelism": p,
            "mode": chosen,
            "requested_mode": mode,
            "from_parallelism": job.parallelism,
            "timeout_s": float_param(params, "timeout_s", default_of(self.kind, "timeout_s")),
        }
        if "stop_deadline_s" in params:
            cleaned["stop_deadline_s"] = float_param(
                params, "stop_deadline_s", DEFAULT_STOP_DEADLINE_S
            )
        return cleaned

    def phases(self, params: Mapping[str, Any]) -> list[Phase]:
        if params["mode"] == "live":
            return [
                Phase("write_control", _write_control, cancellable=True),
                Phase("await_effective", _await_effective),
            ]
        return [
            Phase("stop", phase_stop, cancellable=True),
            Phase("rescale_commit", _rescale_commit),
            Phase("write_control", _write_control),
            Phase("relaunch", phase_relaunch),
            Phase("await_running", phase_await_running),
        ]


def _write_control(ctx: PhaseContext) -> None:
    job = ctx.job
    p = int(ctx.params["parallelism"])
    update_control(
        job_repository(job),
        job.branch,
        {"parallelism": p, "operation_id": str(ctx.operation.pk)},
    )
    job_set_parallelism(job, p)
    ctx.progress(1.0, f"control document asks for parallelism {p}")


def _await_effective(ctx: PhaseContext) -> None:
    job = ctx.job
    repo = job_repository(job)
    p = int(ctx.params["parallelism"])
    op_id = str(ctx.operation.pk)

    def applied() -> str | None:
        head = repo.read_ref(f"heads/{job.branch}")
        if head is None:
            return None
        manifest = repo.read_manifest(head.target)
        control = manifest.extra.get("control")
        if manifest.parallelism == p and (
            manifest.operation_id == op_id
            or (isinstance(control, dict) and control.get("operation_id") == op_id)
        ):
            return head.target
        return None

    try:
        sid = ctx.wait_until(
            applied,
            timeout_s=float(ctx.params["timeout_s"]),
            what="an epoch at the new parallelism",
        )
    except Exception:
        if applied() is None and job_is_running(job):
            # No epoch ran (no new input): the request stays in the control document and
            # takes effect with the next epoch. That is success for a live rescale.
            ctx.operation.result = {**ctx.operation.result, "effective": "next epoch"}
            ctx.operation.save(update_fields=["result", "updated_at"])
            ctx.progress(1.0, "no epoch ran yet; parallelism applies at the next epoch")
            return
        raise
    job_set_parallelism(job, p, latest_run=True)
    ctx.operation.result = {**ctx.operation.result, "effective_snapshot": sid}
    ctx.operation.save(update_fields=["result", "updated_at"])
    ctx.progress(1.0, f"epoch {sid[:12]} ran at parallelism {p}")


def _rescale_commit(ctx: PhaseContext) -> None:
    job = ctx.job
    repo = job_repository(job)
    head = repo.read_ref(f"heads/{job.branch}")
    p = int(ctx.params["parallelism"])
    if head is None:
        job_set_state(job, job.state, parallelism=p)
        ctx.progress(1.0, "no commits yet: the first epoch runs at the new parallelism")
        return
    base = ctx.remember("rescale_base", lambda: head.target)
    created_at = ctx.remember("created_at", now_iso)
    requester = ctx.operation.requested_by
    sid = derived_commit(
        repo,
        base,
        job.branch,
        kind="rescale",
        expected_head=base,
        operation_id=str(ctx.operation.pk),
        created_at=created_at,
        reason=f"rescale {ctx.params['from_parallelism']} -> {p}",
        provenance={
            "operation": "rescale",
            "from_parallelism": str(ctx.params["from_parallelism"]),
            "to_parallelism": str(p),
            "requested_by": "" if requester is None else requester.get_username(),
            "reason": ctx.operation.reason,
        },
        parallelism=p,
    )
    ctx.operation.result = {**ctx.operation.result, "snapshot": sid}
    ctx.operation.save(update_fields=["result", "updated_at"])
    job_set_state(job, job.state, parallelism=p)
    ctx.progress(1.0, f"committed rescale snapshot {sid[:12]}")
