"""migrate: move a lineage to another store, or transform a branch's state.

mode=copy replicates the application's lineage (every branch, tag, reflog and reachable object,
verified, byte for byte) into `store` (a store an admin registered; no request names a
URL), then switches the application to it and restarts
the job there; the source store is left untouched. mode=transform applies a user
state-migration function (`function`: the name of an entry point of group
``epochal.state_migrations`` an installed package registers; pa.Table -> pa.Table per key
group) and
mode=rehash changes M (`max_parallelism`); both write a "migration" commit on the job's
branch and restart from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from controlplane.applications.models import Application, Store
from controlplane.applications.stores import UnknownStoreError, store_get, store_repository
from controlplane.errors import Conflict, InvalidRequest, OperationFailed
from controlplane.jobs.models import Job
from controlplane.jobs.store import application_repository, job_repository
from controlplane.operations.framework import OperationSpec, Phase, PhaseContext, Target
from controlplane.operations.kinds.common import (
    float_param,
    int_param,
    job_is_running,
    phase_await_running,
    phase_relaunch,
    phase_stop,
    reject_unknown,
    str_param,
)
from controlplane.operations.params import MIGRATE_MODES, default_of
from runners import entry_points
from snapshots_store import Repository, StoreError

MODES = MIGRATE_MODES


class MigrateSpec(OperationSpec):
    kind = "migrate"
    summary = "copy the lineage to another store, or transform state into a migration commit"

    def clean(self, params: Mapping[str, Any], target: Target) -> dict[str, Any]:
        reject_unknown(params, self.kind)
        job = target.job
        assert job is not None
        mode = params.get("mode")
        if mode not in MODES:
            raise InvalidRequest(f"mode must be one of {MODES}", fields={"mode": [repr(mode)]})
        cleaned: dict[str, Any] = {"mode": mode}
        if mode == "copy":
            name = str_param(params, "store", required=True)
            assert name is not None
            try:
                store = store_get(name=name)
            except UnknownStoreError as exc:
                raise InvalidRequest(str(exc), fields={"store": [str(exc)]}) from None
            url = store.url
            if url == job.application.effective_store_url:
                raise InvalidRequest(
                    f"store {name!r} is the store the application already uses",
                    fields={"store": ["same as the current store"]},
                    code="no_change",
                )
            try:
                Repository.open(url, job.application.store_namespace)
            except StoreError as exc:
                said = str(exc).replace(url, store.shown_url)  # never a secret in an answer
                raise InvalidRequest(said, fields={"store": [said]}) from None
            others = [
                other.name
                for other in Job.objects.filter(application=job.application).exclude(pk=job.pk)
                if job_is_running(other)
            ]
            if others:
                raise Conflict(
                    f"the whole lineage of {job.application.name} moves with the copy, and "
                    f"jobs {others} still run on the current store: stop them first",
                    code="other_jobs_running",
                )
            cleaned["store"] = store.name
        elif mode == "transform":
            name = str_param(params, "function", required=True)
            unusable = entry_points.lookup_error(entry_points.STATE_MIGRATIONS, name)
            if unusable:
                raise InvalidRequest(unusable, fields={"function": [unusable]})
            cleaned["function"] = name
        else:
            m = int_param(params, "max_parallelism")
            if m is None:
                raise InvalidRequest(
                    "max_parallelism is required for mode=rehash",
                    fields={"max_parallelism": ["required"]},
                )
            if m < job.parallelism:
                raise InvalidRequest(
                    f"max_parallelism {m} is below the job's parallelism {job.parallelism}; "
                    "rescale down first",
                    fields={"max_parallelism": [f"must be >= {job.parallelism}"]},
                )
            cleaned["max_parallelism"] = m
        repo = job_repository(job)
        if mode != "copy" and repo.read_ref(f"heads/{job.branch}") is None:
            raise InvalidRequest(
                f"branch {job.branch!r} has no commits: no state to migrate", code="empty_branch"
            )
        for name in ("stop_deadline_s", "start_timeout_s"):
            if name in params:
                cleaned[name] = float_param(params, name, default_of(self.kind, name))
        return cleaned

    def phases(self, params: Mapping[str, Any]) -> list[Phase]:
        if params["mode"] == "copy":
            return [
                Phase("check_store", _check_store, cancellable=True),
                Phase("stop", phase_stop, cancellable=True),
                Phase("copy_objects", _copy),
                Phase("switch_store", _switch),
                Phase("restart", phase_relaunch),
                Phase("await_running", phase_await_running),
            ]
        return [
            Phase("stop", phase_stop, cancellable=True),
            Phase("migrate_state", _migrate_state),
            Phase("restart", phase_relaunch),
            Phase("await_running", phase_await_running),
        ]


def _check_store(ctx: PhaseContext) -> None:
    """Before anything stops or moves: the target store's credentials are where it says (the
    environment variables it names, in this worker's environment)."""
    store = _store(ctx)
    store_repository(store, ctx.job.application.store_namespace)
    where = f"from ${store.credentials_env}_AWS_*" if store.credentials_env else "none named"
    ctx.progress(1.0, f"store {store.name}: credentials {where}")


def _copy(ctx: PhaseContext) -> None:
    from snapshots_store.replicate import replicate

    job = ctx.job
    application = job.application
    if ctx.data.get("switched"):
        return
    src = application_repository(application)
    dst = store_repository(_store(ctx), application.store_namespace)

    def progress(done: int, total: int) -> None:
        ctx.progress(done / max(1, total), f"{done}/{total} objects")

    report = replicate(src, dst, progress=progress)
    ctx.operation.result = {**ctx.operation.result, "copy": report.to_dict()}
    ctx.operation.save(update_fields=["result", "updated_at"])
    ctx.progress(1.0, f"copied {report.objects_copied} objects ({report.bytes_copied} bytes)")


def _switch(ctx: PhaseContext) -> None:
    job = ctx.job
    store = _store(ctx)
    previous = ctx.remember(
        "previous_store",
        lambda: job.application.store.name if job.application.store else "(STORE_URL)",
    )
    Application.objects.filter(pk=job.application_id).update(store=store)
    ctx.remember("switched", lambda: True)
    ctx.operation.result = {**ctx.operation.result, "store": store.name, "previous_store": previous}
    ctx.operation.save(update_fields=["result", "updated_at"])
    ctx.progress(1.0, f"application now uses store {store.name}")


def _store(ctx: PhaseContext) -> Store:
    try:
        return store_get(name=ctx.params["store"])
    except UnknownStoreError as exc:
        raise OperationFailed(str(exc), code="unknown_store") from None


def _migrate_state(ctx: PhaseContext) -> None:
    from runners.engine import state_ops

    job = ctx.job
    repo = job_repository(job)
    head = repo.read_ref(f"heads/{job.branch}")
    assert head is not None
    base = ctx.remember("migration_base", lambda: head.target)
    if head.target != base:
        manifest = repo.read_manifest(head.target)
        if manifest.kind == "migration" and manifest.operation_id == str(ctx.operation.pk):
            ctx.progress(1.0, f"migration commit {head.target[:12]} already made")
            return
        raise Conflict(f"branch {job.branch} moved during the migration", code="branch_moved")
    op_id = str(ctx.operation.pk)
    reason = ctx.operation.reason or f"migrate ({ctx.params['mode']})"
    try:
        if ctx.params["mode"] == "rehash":
            sid = state_ops.rehash(
                repo,
                base,
                int(ctx.params["max_parallelism"]),
                branch=job.branch,
                operation_id=op_id,
                reason=reason,
            )
        else:
            fn = state_ops.load_migration(ctx.params["function"])
            sid = state_ops.transform_state(
                repo, base, fn, branch=job.branch, operation_id=op_id, reason=reason
            )
    except (state_ops.StateOperationError, ValueError, LookupError, TypeError, ImportError) as exc:
        raise OperationFailed(f"state migration failed: {exc}", code="migration_failed") from None
    ctx.operation.result = {**ctx.operation.result, "snapshot": sid}
    ctx.operation.save(update_fields=["result", "updated_at"])
    ctx.progress(1.0, f"migration commit {sid[:12]}")
