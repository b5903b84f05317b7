"""Requesting, validating, executing and cancelling operations without a Spark job.

Operations that need no running job (savepoint of a commit, rescale / rollback of a stopped
job, fork without start) execute inline here through the real executor, against a real
store in a temp directory; the ones that launch Spark are covered in tests/e2e.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from controlplane.applications.models import Application, ApplicationVersion
from controlplane.errors import Conflict, InvalidRequest
from controlplane.jobs.models import Job
from controlplane.jobs.services import job_create
from controlplane.jobs.store import job_repository
from controlplane.operations.executor import acquire_lease, execute
from controlplane.operations.models import Operation
from controlplane.operations.reconciler import reconcile_operations
from controlplane.operations.services import operation_cancel, operation_request
from snapshots_store import Manifest
from tests.conftest import registered_store

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def job(tmp_path: Path) -> Job:
    (tmp_path / "input").mkdir()
    app = Application.objects.create(
        name="clicks",
        store_namespace="clicks",
        max_parallelism=8,
        store=registered_store(f"file://{tmp_path / 'store'}"),
    )
    version = ApplicationVersion.objects.create(
        application=app,
        number=1,
        job="clickstream",
        config={"job_args": {"directory": str(tmp_path / "input")}},
    )
    return job_create(name="clicks-main", application=app, version=version, parallelism=2)


def commit_epochs(job: Job, n: int, offsets: dict[str, int] | None = None) -> list[str]:
    repo = job_repository(job)
    ids: list[str] = []
    head = None
    for epoch in range(1, n + 1):
        chunk = repo.put_object("chunk", f"state {epoch}".encode())
        manifest = Manifest(
            branch="main",
            epoch=epoch,
            max_parallelism=8,
            parallelism=2,
            kind="epoch",
            parents=() if head is None else (head,),
            key_groups={epoch % 8: [chunk]},
            offsets={"files": offsets or {}},
            stats={"records_in": 10},
        )
        head = repo.commit(manifest, "main", expected_head=head, reason=f"epoch {epoch}")
        ids.append(head)
    return ids


def request(job: Job, kind: str, **params: Any) -> Operation:
    return operation_request(
        kind=kind, application=job.application, job=job, params=params, dispatch=False
    ).operation


def test_bad_parameters_are_refused_with_the_field_named(job: Job) -> None:
    commit_epochs(job, 2)
    cases = [
        ("rescale", {"parallelism": 9}, "parallelism_above_max", "parallelism"),
        ("rescale", {"parallelism": 2}, "no_change", "parallelism"),
        ("rescale", {"parallelism": 3, "mode": "live"}, "job_not_running", "mode"),
        ("rescale", {"parallelism": "3"}, "invalid", "parallelism"),
        ("rescale", {"parallelism": 3, "colour": "red"}, "invalid", "colour"),
        ("rollback", {"to": "nonexistent"}, "unknown_snapshot", "to"),
        ("rollback", {}, "invalid", "to"),
        ("savepoint", {"name": "../x"}, "invalid", "name"),
        ("migrate", {"mode": "teleport"}, "invalid", "mode"),
        ("migrate", {"mode": "rehash", "max_parallelism": 1}, "invalid", "max_parallelism"),
    ]
    for kind, params, code, field in cases:
        with pytest.raises(InvalidRequest) as caught:
            request(job, kind, **params)
        assert caught.value.code == code, (kind, params, caught.value.to_dict())
        assert field in caught.value.fields, (kind, params, caught.value.to_dict())
    with pytest.raises(InvalidRequest, match="unknown operation kind"):
        request(job, "explode")
    assert Operation.objects.count() == 0  # nothing recorded for a refused request


def test_rollback_must_target_an_earlier_snapshot_of_the_branch(job: Job) -> None:
    ids = commit_epochs(job, 3)
    repo = job_repository(job)
    other = repo.commit(
        repo.read_manifest(ids[0]).with_changes(branch="side", parents=(ids[0],), epoch=9),
        "side",
        expected_head=None,
        reason="side",
    )
    with pytest.raises(InvalidRequest) as caught:
        request(job, "rollback", to=other)
    assert caught.value.code == "not_an_ancestor"
    with pytest.raises(InvalidRequest) as caught:
        request(job, "rollback", to=ids[-1])
    assert caught.value.code == "no_change"


def test_one_active_operation_per_job_and_idempotency_keys(job: Job) -> None:
    commit_epochs(job, 1)
    first = request(job, "rescale", parallelism=3)
    with pytest.raises(Conflict) as caught:
        request(job, "savepoint")
    assert caught.value.code == "operation_in_progress"
    assert caught.value.detail["operation"] == str(first.pk)
    assert str(first.pk) in caught.value.message
    Operation.objects.filter(pk=first.pk).update(state="succeeded")
    keyed = operation_request(
        kind="savepoint", application=job.application, job=job, idempotency_key="k2", dispatch=False
    )
    repeat = operation_request(
        kind="savepoint", application=job.application, job=job, idempotency_key="k2", dispatch=False
    )
    assert keyed.created and not repeat.created and repeat.operation.pk == keyed.operation.pk


def test_cancel_pending_and_refuse_cancelling_an_ended_operation(job: Job) -> None:
    commit_epochs(job, 1)
    op = request(job, "savepoint")
    cancelled = operation_cancel(operation=op)
    assert cancelled.state == "cancelled"
    assert execute(op.pk) == "cancelled"  # a late worker does nothing
    with pytest.raises(Conflict) as caught:
        operation_cancel(operation=cancelled)
    assert caught.value.code == "operation_ended"


def test_savepoint_tags_and_a_second_execution_is_a_no_op(job: Job) -> None:
    ids = commit_epochs(job, 3)
    op = request(job, "savepoint", name="before-upgrade", snapshot=ids[1][:12])
    assert execute(op.pk) == "succeeded"
    op.refresh_from_db()
    assert [p["state"] for p in op.phases] == ["succeeded", "succeeded"]
    assert job_repository(job).read_ref("tags/before-upgrade").target == ids[1]
    assert execute(op.pk) == "succeeded"
    clash = request(job, "savepoint", name="before-upgrade")
    assert execute(clash.pk) == "failed"
    clash.refresh_from_db()
    assert clash.error_code == "tag_exists" and "choose another name" in clash.error_message


def test_restart_rescale_of_a_stopped_job_commits_metadata_only(job: Job) -> None:
    ids = commit_epochs(job, 2)
    op = request(job, "rescale", parallelism=5)
    assert op.params["mode"] == "restart"
    assert execute(op.pk) == "succeeded"
    repo = job_repository(job)
    head = repo.read_ref("heads/main").target
    manifest = repo.read_manifest(head)
    parent = repo.read_manifest(ids[-1])
    assert manifest.kind == "rescale" and manifest.parallelism == 5
    assert manifest.key_groups == parent.key_groups and manifest.outputs == ()
    assert manifest.provenance["from_parallelism"] == "2"
    job.refresh_from_db()
    assert job.parallelism == 5 and job.runs.count() == 0  # it was stopped: stays stopped
    assert repo.read_control("main")[0]["parallelism"] == 5


def test_rollback_of_a_stopped_job_tags_the_abandoned_head(job: Job) -> None:
    ids = commit_epochs(job, 4)
    op = request(job, "rollback", to=ids[1])
    assert execute(op.pk) == "succeeded"
    op.refresh_from_db()
    repo = job_repository(job)
    head = repo.read_ref("heads/main").target
    assert head == op.result["snapshot"]
    assert repo.read_manifest(head).parents == (ids[1],)
    assert repo.read_ref(f"tags/{op.result['abandoned_tag']}").target == ids[-1]
    from controlplane.lineage.models import Snapshot

    indexed = Snapshot.objects.get(snapshot_id=head)
    assert indexed.kind == "rollback" and indexed.provenance["abandoned_head"] == ids[-1]


def test_rollback_is_refused_when_the_source_lost_the_offsets(job: Job, tmp_path: Path) -> None:
    ids = commit_epochs(job, 3, offsets={"clicks-00000.jsonl": 500})
    op = request(job, "rollback", to=ids[0])
    assert execute(op.pk) == "failed"
    op.refresh_from_db()
    assert op.error_code == "offsets_not_retained"
    assert (
        "clicks-00000.jsonl" in op.error_message and "Choose a later snapshot" in op.error_message
    )
    assert job_repository(job).read_ref("heads/main").target == ids[-1]  # untouched


def test_fork_creates_version_branch_and_job_with_provenance(job: Job) -> None:
    ids = commit_epochs(job, 3)
    op = operation_request(
        kind="fork",
        application=job.application,
        job=job,
        dispatch=False,
        params={"snapshot": ids[1], "branch": "v2", "code_version": "2"},
        reason="try v2",
    ).operation
    assert op.job is None  # a fork does not lock its source job
    assert execute(op.pk) == "succeeded"
    op.refresh_from_db()
    forked = Job.objects.get(name=op.result["job"])
    assert forked.branch == "v2" and forked.version.source_snapshot_id == ids[1]
    assert forked.version.code_version == "2" and forked.version.reason == "try v2"
    manifest = job_repository(forked).read_manifest(op.result["snapshot"])
    assert manifest.kind == "fork" and manifest.parents == (ids[1],)
    assert manifest.provenance["source_snapshot"] == ids[1]
    with pytest.raises(Conflict):
        operation_request(
            kind="fork",
            application=job.application,
            dispatch=False,
            params={"snapshot": ids[0], "branch": "v2"},
        )


def test_expired_leases_are_taken_over(job: Job) -> None:
    commit_epochs(job, 1)
    op = request(job, "savepoint")
    assert acquire_lease(op.pk, "worker-a")
    assert not acquire_lease(op.pk, "worker-b")
    Operation.objects.filter(pk=op.pk).update(
        state="running", lease_expires_at=timezone.now() - dt.timedelta(seconds=1)
    )
    assert reconcile_operations() == 1
    op.refresh_from_db()
    assert op.lease_owner == "queued"
    assert reconcile_operations() == 0  # not again while queued
    assert execute(op.pk, owner="worker-b") == "succeeded"


def test_scheduled_gc_removes_old_unreachable_objects_only(job: Job, tmp_path: Path) -> None:
    import os
    import time

    from controlplane.operations.reconciler import collect_garbage_all
    from snapshots_store.objects import object_key

    ids = commit_epochs(job, 2)
    repo = job_repository(job)
    orphan = repo.put_object("chunk", b"written by a crashed epoch")
    young = repo.put_object("chunk", b"written by an epoch still running")
    old = time.time() - 3 * 86400
    os.utime(tmp_path / "store" / "clicks" / object_key(orphan), (old, old))
    report = collect_garbage_all()
    assert report["objects_removed"] == 1
    assert not repo.has_object(orphan) and repo.has_object(young)
    assert [sid for sid, _ in repo.log("main")] == list(reversed(ids))
