"""The executor's retry and back-off path, with the real executor, database and store.

A phase that raises something unexpected (here: the store's filesystem refusing to create a
directory, as a full or read-only volume would) is retried after a back-off of 2^attempts
seconds (at most 60) while `EPOCHAL_OPERATION_MAX_ATTEMPTS` allows; then the operation fails
naming the phase and the last error. A domain error fails at once. A terminal state is written
once: neither a late worker nor a cancel changes it.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from controlplane.audit.models import AuditEntry
from controlplane.errors import Conflict
from controlplane.jobs.models import Job
from controlplane.jobs.store import job_repository
from controlplane.operations.executor import execute, retry_backoff_s
from controlplane.operations.models import Operation, OperationState
from controlplane.operations.services import operation_cancel
from controlplane.operations.transitions import PhaseState, operation_finish
from tests.operations.test_requests import commit_epochs, job, request

__all__ = ["job"]

pytestmark = pytest.mark.django_db(transaction=True)


def _block_tags(tmp_path: Path) -> Path:
    """A file where the store's tags directory goes: creating a tag raises an OSError."""
    blocker = tmp_path / "store" / "clicks" / "refs" / "tags"
    blocker.write_text("not a directory")
    return blocker


def _expire_backoff(op: Operation) -> None:
    """What the passing of the back-off does (the lease's end moves into the past)."""
    Operation.objects.filter(pk=op.pk).update(
        lease_expires_at=timezone.now() - dt.timedelta(seconds=1)
    )


def _retrying(op: Operation) -> list[dict[str, Any]]:
    events = AuditEntry.objects.filter(operation_id=op.pk, outcome="retrying").order_by("id")
    return [e.detail for e in events]


def test_a_phase_that_raises_is_retried_with_back_off_then_fails(
    job: Job, tmp_path: Path, settings: Any
) -> None:
    settings.EPOCHAL_OPERATION_MAX_ATTEMPTS = 3
    commit_epochs(job, 1)
    _block_tags(tmp_path)
    op = request(job, "savepoint", name="sp")

    before = timezone.now()
    assert execute(op.pk, owner="w1") == "retrying"
    op.refresh_from_db()
    assert op.state == OperationState.RUNNING and op.lease_owner == ""
    assert op.attempts == 1 and op.current_phase == "tag"
    wait = (op.lease_expires_at - before).total_seconds()
    assert retry_backoff_s(1) == 2.0 and 1.5 < wait < 3.0
    assert [p["state"] for p in op.phases] == [PhaseState.SUCCEEDED, PhaseState.RUNNING]
    # While the back-off lasts, no worker takes it (the reconciler hands it out afterwards).
    assert execute(op.pk, owner="w2") == OperationState.RUNNING
    assert Operation.objects.get(pk=op.pk).attempts == 1

    _expire_backoff(op)
    assert execute(op.pk, owner="w2") == "retrying"
    _expire_backoff(op)
    assert execute(op.pk, owner="w3") == OperationState.FAILED
    op.refresh_from_db()
    assert op.attempts == 3 and op.error_code == "internal_error"
    assert op.error_message.startswith("phase tag failed 3 times; last error: ")
    assert "request the operation again" in op.error_message
    assert [p["state"] for p in op.phases] == [PhaseState.SUCCEEDED, PhaseState.FAILED]
    assert [d["retry_in_s"] for d in _retrying(op)] == [2.0, 4.0]
    assert [d["attempt"] for d in _retrying(op)] == [1, 2]
    assert retry_backoff_s(6) == 60.0 and retry_backoff_s(30) == 60.0

    # Ended once: a late writer and a cancel change nothing.
    assert not operation_finish(op, OperationState.SUCCEEDED)
    assert Operation.objects.get(pk=op.pk).state == OperationState.FAILED
    with pytest.raises(Conflict):
        operation_cancel(operation=op)
    ended = AuditEntry.objects.filter(operation_id=op.pk, outcome=OperationState.FAILED)
    assert ended.count() == 1


def test_a_phase_that_recovers_on_retry_succeeds(job: Job, tmp_path: Path, settings: Any) -> None:
    settings.EPOCHAL_OPERATION_MAX_ATTEMPTS = 3
    ids = commit_epochs(job, 1)
    blocker = _block_tags(tmp_path)
    op = request(job, "savepoint", name="sp")
    assert execute(op.pk, owner="w1") == "retrying"
    blocker.unlink()  # the volume recovers
    _expire_backoff(op)
    assert execute(op.pk, owner="w2") == OperationState.SUCCEEDED
    op.refresh_from_db()
    assert op.attempts == 2 and op.error_code == "" and op.progress == 1.0
    assert [p["state"] for p in op.phases] == [PhaseState.SUCCEEDED, PhaseState.SUCCEEDED]
    assert job_repository(job).read_ref("tags/sp").target == ids[0]
    outcomes = list(
        AuditEntry.objects.filter(operation_id=op.pk)
        .order_by("id")
        .values_list("outcome", flat=True)
    )
    assert outcomes.count("retrying") == 1 and outcomes.count("resumed") == 1
    assert outcomes[-1] == OperationState.SUCCEEDED
