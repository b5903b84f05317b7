"""An operation in flight when PostgreSQL goes away: a rollback runs in a worker thread of this
process, its database connection through a TCP proxy the test cuts or resets at a random moment
of the run (every database round trip is slowed a little, so the run lasts long enough to be
cut anywhere: in a phase, between a phase's action and its record, while the lease is taken or
the end recorded). Once the database is back the reconciler's passes (Celery eager: the
dispatched task runs here) take the operation over when its lease expires, and it resumes from
its recorded phase or fails with a reason — never half-done: succeeded, the branch has exactly
one rollback commit for it and the abandoned head is tagged; failed, the branch is where it was.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from controlplane.jobs.models import Job
from controlplane.jobs.store import job_repository
from controlplane.operations.executor import execute
from controlplane.operations.models import Operation, OperationState
from controlplane.operations.reconciler import reconcile_operations
from snapshots_store import Manifest, Repository
from tests.faults.report import injections, record
from tests.faults.tcp_proxy import TcpProxy
from tests.faults.test_database_faults import database_proxy
from tests.operations.test_requests import commit_epochs, job, request

__all__ = ["database_proxy", "job"]
pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True)]

DELAY_S = 0.01  # added to each forwarded read: a rollback's ~100 round trips take a second or two
OUTAGE_S = 0.5
LEASE_S = 1.0
RECOVER_LIMIT_S = 60.0


@pytest.fixture
def eager(settings: Any) -> Iterator[None]:
    """Short leases; a dispatched operation runs at once in this process (the worker)."""
    import controlplane.operations.tasks  # noqa: F401  (registers the task eager mode runs)
    from controlplane.celery import app

    settings.EPOCHAL_OPERATION_LEASE_S = LEASE_S
    before = app.conf.task_always_eager
    app.conf.task_always_eager = True
    try:
        yield
    finally:
        app.conf.task_always_eager = before


class Worker(threading.Thread):
    """`execute(operation)` as a Celery worker would, on a connection of its own."""

    def __init__(self, operation_id: Any) -> None:
        super().__init__(name="inflight-worker", daemon=True)
        self.operation_id = operation_id
        self.outcome = ""

    def run(self) -> None:
        try:
            self.outcome = execute(self.operation_id)
        except Exception as exc:  # the database went away under it
            self.outcome = f"raised {type(exc).__name__}"
        finally:
            connection.close()


def _commit_on(repo: Repository, head: str) -> str:
    """One more epoch on main after `head` (as the engine would commit it)."""
    base = repo.read_manifest(head)
    epoch = base.epoch + 1
    chunk = repo.put_object("chunk", f"state {epoch}".encode())
    manifest = Manifest(
        branch="main", epoch=epoch, max_parallelism=8, parallelism=2, kind="epoch",
        parents=(head,), key_groups={epoch % 8: [chunk]}, offsets={"files": {}},
        stats={"records_in": 10},
    )  # fmt: skip
    return repo.commit(manifest, "main", expected_head=head, reason=f"epoch {epoch}")


def _head(repo: Repository) -> str:
    ref = repo.read_ref("heads/main")
    assert ref is not None
    return ref.target


def _rollback_commits(repo: Repository, abandoned: str) -> int:
    """Commits on main that roll back from `abandoned` (one per rollback that happened)."""
    return sum(
        1
        for _, manifest in repo.log("heads/main", first_parent=True)
        if manifest.kind == "rollback"
        and (manifest.provenance or {}).get("abandoned_head") == abandoned
    )


def _converge(op: Operation, proxy: TcpProxy) -> None:
    """The reconciler's passes until the operation ends."""
    began = time.monotonic()
    while True:
        op.refresh_from_db()
        if op.state not in (OperationState.PENDING, OperationState.RUNNING):
            return
        assert time.monotonic() - began < RECOVER_LIMIT_S, (op.state, op.current_phase)
        reconcile_operations()
        time.sleep(0.1)


def _run_once(job: Job, repo: Repository, proxy: TcpProxy, cut_after_s: float | None) -> Any:
    """Commit an epoch, request a rollback from it and run it, cut `cut_after_s` into the run
    (None: no fault); (operation, the abandoned head, the target, whether it was in flight)."""
    target = _head(repo)
    abandoned = _commit_on(repo, target)
    op = request(job, "rollback", to=target)
    proxy.delay(DELAY_S)
    worker = Worker(op.pk)
    worker.start()
    in_flight = True
    if cut_after_s is not None:
        time.sleep(cut_after_s)
        in_flight = worker.is_alive()
        random.choice([proxy.cut, proxy.reset])()
        time.sleep(OUTAGE_S)
    worker.join(timeout=60)
    assert not worker.is_alive()
    proxy.passthrough()
    connection.close()  # this thread's connection was cut too: the next query reconnects
    return op, abandoned, target, in_flight


def test_an_operation_cut_off_from_the_database_resumes_or_fails_cleanly(
    job: Job, database_proxy: TcpProxy, eager: None
) -> None:
    commit_epochs(job, 2)
    repo = job_repository(job)
    began = time.monotonic()
    op, abandoned, target, _ = _run_once(job, repo, database_proxy, None)
    baseline_s = time.monotonic() - began
    op.refresh_from_db()
    assert op.state == OperationState.SUCCEEDED, op.error_message
    rng = random.Random(29)
    wanted = injections()
    recover_s: list[float] = []
    survived = lost = duplicated = tries = 0
    outcomes: dict[str, int] = {}
    while len(recover_s) < wanted:
        tries += 1
        assert tries <= 3 * wanted, f"only {len(recover_s)} of {tries} cuts met the run"
        op, abandoned, target, in_flight = _run_once(
            job, repo, database_proxy, rng.uniform(0.05, 0.9) * baseline_s
        )
        back = time.monotonic()
        op.refresh_from_db()
        cut_in = op.current_phase or op.state  # what the database recorded when it went away
        _converge(op, database_proxy)
        if not in_flight:
            continue  # the run had ended before the cut: not this class's fault
        recover_s.append(time.monotonic() - back)
        outcome = f"{op.state} (cut at {cut_in})"
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        rollbacks = _rollback_commits(repo, abandoned)
        tag = repo.read_ref(f"tags/rollback-{str(op.pk)[:8]}-abandoned")
        head = repo.read_manifest(_head(repo))
        if op.state == OperationState.SUCCEEDED:
            done = (rollbacks == 1 and tag is not None and tag.target == abandoned
                    and head.kind == "rollback" and head.parents == (target,))  # fmt: skip
        else:  # failed with a reason, the branch untouched
            done = bool(op.error_message) and rollbacks == 0 and _head(repo) == abandoned
        survived += done
        lost += op.state != OperationState.SUCCEEDED and not done
        duplicated += max(0, rollbacks - 1)
        assert done, (op.state, op.error_code, op.error_message, rollbacks, tag, head)
    assert database_proxy.connections > 0
    record("database_operation", injected=wanted, survived=survived, lost=lost,
           duplicated=duplicated, recover_s=recover_s)  # fmt: skip
    print(f"outcomes {outcomes}, baseline {baseline_s:.2f} s, cuts tried {tries}")


def test_the_lease_heartbeat_renews_again_once_the_database_is_back(
    job: Job, database_proxy: TcpProxy, eager: None
) -> None:
    """A phase may run for minutes without touching the database (waiting for a run, for the
    store): only the heartbeat keeps its lease. A heartbeat whose connection broke must renew on
    a new one once the database is back, or the lease expires under the running phase and the
    reconciler hands the operation to a second worker."""
    from django.utils import timezone

    from controlplane.operations.executor import _Heartbeat, acquire_lease

    ids = commit_epochs(job, 2)
    op = request(job, "rollback", to=ids[0])
    assert acquire_lease(op.pk, "worker-a")
    with _Heartbeat(op.pk, "worker-a") as heartbeat:
        time.sleep(LEASE_S / 2)
        database_proxy.reset()
        time.sleep(LEASE_S)  # renewals fail: the lease runs out meanwhile
        database_proxy.passthrough()
        connection.close()
        time.sleep(LEASE_S)  # three beats with the database back
        op.refresh_from_db()
        assert op.lease_owner == "worker-a" and not heartbeat.lost
        assert op.lease_expires_at is not None and op.lease_expires_at > timezone.now()
