"""Phases several operation kinds share: stop the job, relaunch it, wait until it runs."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from django.utils import timezone

from controlplane.errors import InvalidRequest, OperationFailed
from controlplane.jobs.models import Job, JobState, Run, RunPhase
from controlplane.jobs.services import (
    job_set_state,
    job_stop_runs,
    run_launch,
    run_logs,
    run_refresh,
)
from controlplane.jobs.store import job_repository
from controlplane.operations.framework import PhaseContext
from controlplane.operations.params import (
    DEFAULT_START_TIMEOUT_S,
    DEFAULT_STOP_DEADLINE_S,
    MAX_WAIT_S,
    allowed_names,
)
from runners.job_spec import new_run_id
from snapshots_store import StoreError, UnknownRevisionError
from snapshots_store.codec import format_timestamp


def now_iso() -> str:
    """Now as the store writes its own timestamps (`…Z`, microseconds), for manifests an
    operation commits: `epochal store log` shows one format whoever committed."""
    return format_timestamp(timezone.now())


def int_param(
    params: Mapping[str, Any], name: str, *, default: int | None = None, minimum: int = 1
) -> int | None:
    value = params.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidRequest(
            f"{name} must be an integer >= {minimum}", fields={name: [f"got {value!r}"]}
        )
    return value


def float_param(
    params: Mapping[str, Any], name: str, default: float, *, maximum: float = MAX_WAIT_S
) -> float:
    """A duration in seconds, above 0 and at most `maximum`."""
    value = params.get(name, default)
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0 < value <= maximum
    ):
        raise InvalidRequest(
            f"{name} must be a number of seconds above 0 and at most {maximum:g}",
            fields={name: [f"above 0 and at most {maximum:g}; got {value!r}"]},
        )
    return float(value)


def str_param(params: Mapping[str, Any], name: str, *, required: bool = False) -> str | None:
    value = params.get(name)
    if value is None or value == "":
        if required:
            raise InvalidRequest(f"{name} is required", fields={name: ["this field is required"]})
        return None
    if not isinstance(value, str):
        raise InvalidRequest(f"{name} must be a string", fields={name: [repr(value)]})
    return value


def reject_unknown(params: Mapping[str, Any], kind: str) -> None:
    """InvalidRequest naming each parameter the kind's schema does not declare."""
    allowed = allowed_names(kind)
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise InvalidRequest(
            f"unknown parameters {unknown}; allowed: {sorted(allowed)}",
            fields={name: ["unknown parameter"] for name in unknown},
        )


def resolve_snapshot(job_or_repo: Any, rev: str, *, field: str) -> str:
    repo = job_repository(job_or_repo) if isinstance(job_or_repo, Job) else job_or_repo
    try:
        return repo.resolve(rev)
    except UnknownRevisionError as exc:
        raise InvalidRequest(
            str(exc), fields={field: [str(exc)]}, code="unknown_snapshot"
        ) from None
    except StoreError as exc:
        raise InvalidRequest(
            f"{field}={rev!r}: {exc}", fields={field: [str(exc)]}, code="unknown_snapshot"
        ) from None


def job_is_running(job: Job) -> bool:
    live = job.runs.filter(phase__in=[RunPhase.PENDING, RunPhase.RUNNING]).exists()
    return live or job.state in (JobState.RUNNING, JobState.STARTING)


# -- phases --------------------------------------------------------------------------------


def phase_stop(ctx: PhaseContext) -> None:
    """Stop the job's live runs at an epoch boundary (force after the deadline)."""
    job = ctx.job
    was_running = ctx.remember("was_running", lambda: job_is_running(job))
    if not was_running:
        ctx.progress(1.0, "the job was not running")
        return
    job_set_state(job, JobState.STOPPING, reason=f"{ctx.operation.kind} operation")
    deadline = float(ctx.params.get("stop_deadline_s", DEFAULT_STOP_DEADLINE_S))
    stopped = job_stop_runs(job, deadline_s=deadline)
    ctx.progress(1.0, f"stopped {len(stopped)} run(s) at an epoch boundary")


def phase_relaunch(ctx: PhaseContext) -> None:
    """Launch a new run if the job ran before the operation (or the operation starts it)."""
    job = ctx.job
    if not ctx.data.get("was_running", True) and not ctx.params.get("start"):
        ctx.progress(1.0, "the job stays stopped (it was not running)")
        return
    run_id = ctx.remember("run_id", new_run_id)
    run = run_launch(job, run_id=run_id, operation=ctx.operation)
    ctx.progress(1.0, f"launched run {run.run_id} at parallelism {run.parallelism}")


def phase_await_running(ctx: PhaseContext) -> None:
    """Wait until the launched run has started its engine (or already finished cleanly)."""
    run_id = ctx.data.get("run_id")
    if run_id is None:
        ctx.progress(1.0, "nothing launched")
        return
    timeout = float(ctx.params.get("start_timeout_s", DEFAULT_START_TIMEOUT_S))

    def started() -> Run | None:
        run = run_refresh(Run.objects.get(run_id=run_id))
        if run.phase == RunPhase.FAILED:
            tail = run_logs(run, tail_lines=15)
            job_set_state(run.job, JobState.FAILED, reason=run.reason)
            raise OperationFailed(
                f"run {run_id} failed while starting: {run.reason}. Last log lines:\n{tail}",
                code="run_failed",
                detail={"run_id": run_id},
            )
        if run.phase in (RunPhase.SUCCEEDED, RunPhase.STOPPED):
            return run
        if run.phase == RunPhase.RUNNING and _engine_started(run):
            return run
        return None

    run = ctx.wait_until(started, timeout_s=timeout, what=f"run {run_id} to start")
    ctx.progress(1.0, f"run {run.run_id} is {run.phase}")


def _engine_started(run: Run) -> bool:
    for line in run_logs(run, tail_lines=200).splitlines():
        if line.startswith("{") and '"event"' in line:
            try:
                if json.loads(line).get("event") in ("started", "committed", "stopped"):
                    return True
            except ValueError:
                continue
    return False
