"""Rollback checks integrity first: a damaged target is refused before anything is recorded,
naming the snapshot and the object and offering the newest intact snapshot (``to:
"newest-intact"`` picks it); damage found by the operation itself, after the request, fails it
before the branch moves."""

from __future__ import annotations

import pytest

from controlplane.errors import InvalidRequest
from controlplane.jobs.models import Job
from controlplane.jobs.store import job_repository
from controlplane.operations.executor import execute
from controlplane.operations.models import Operation
from snapshots_store import Repository
from snapshots_store.objects import object_key
from tests.operations.test_requests import commit_epochs, job, request

__all__ = ["job"]
pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True)]


def _flip_state(repo: Repository, snapshot_id: str) -> str:
    """Flip a byte of the one chunk of `snapshot_id`'s state; its id."""
    ((chunk,),) = repo.read_manifest(snapshot_id).key_groups.values()
    blob = repo.backend.get(object_key(chunk))
    assert blob is not None
    data = bytearray(blob.data)
    data[-1] ^= 0x20
    repo.backend.put(object_key(chunk), bytes(data))
    return chunk


def test_a_damaged_target_is_refused_and_the_newest_intact_one_offered(job: Job) -> None:
    ids = commit_epochs(job, 4)
    repo = job_repository(job)
    damaged = [_flip_state(repo, ids[3]), _flip_state(repo, ids[2])]
    with pytest.raises(InvalidRequest) as refused:
        request(job, "rollback", to=ids[2])
    error = refused.value
    assert error.code == "damaged_snapshot" and error.http_status == 422
    assert ids[2] in error.message and damaged[1] in error.message, error.message
    assert error.detail["newest_intact"] == ids[1]
    assert error.detail["problems"][0]["object_id"] == damaged[1]
    assert Operation.objects.count() == 0  # nothing recorded
    op = request(job, "rollback", to="newest-intact")
    assert op.params["to"] == ids[1]
    assert execute(op.pk) == "succeeded"
    head = repo.read_ref("heads/main")
    assert head is not None and repo.read_manifest(head.target).parents == (ids[1],)


def test_damage_after_the_request_fails_the_operation_before_the_branch_moves(job: Job) -> None:
    ids = commit_epochs(job, 3)
    repo = job_repository(job)
    op = request(job, "rollback", to=ids[0])
    chunk = _flip_state(repo, ids[0])
    assert execute(op.pk) == "failed"
    op.refresh_from_db()
    assert op.error_code == "damaged_snapshot"
    assert chunk in op.error_message and ids[0] in op.error_message
    head = repo.read_ref("heads/main")
    assert head is not None and head.target == ids[-1]
