"""The control loop never waits behind an operation.

The demo's two Celery workers (`controlplane.operations.workers`, the same split as the Helm
chart's two Deployments) run as real processes on the filesystem broker. A savepoint that
waits 60 s for an epoch holds the `operations` worker; meanwhile a job of another application
commits, and the lineage index has the commit within a few seconds — the reconciler on the
`control` queue indexes it while the operation still waits. On one worker running one task at
a time (the demo's old `--pool=solo`) the index waited for the operation to end.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import pytest

from controlplane.applications.models import Application, ApplicationVersion
from controlplane.jobs.models import Job
from controlplane.jobs.services import job_create
from controlplane.lineage.models import Snapshot
from controlplane.operations.models import Operation
from controlplane.operations.services import operation_request
from controlplane.operations.workers import QUEUES, start_workers
from tests.conftest import SUBPROCESS_PYTHONPATH, registered_store, require_service
from tests.e2e.harness import database_url
from tests.operations.test_requests import commit_epochs

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

OPERATION_S = 60.0
INDEX_WITHIN_S = 8.0


def a_job(tmp_path: Path, name: str) -> Job:
    (tmp_path / name).mkdir()
    app = Application.objects.create(
        name=name,
        store_namespace=name,
        max_parallelism=8,
        store=registered_store(f"file://{tmp_path / 'store'}"),
    )
    version = ApplicationVersion.objects.create(
        application=app,
        number=1,
        job="clickstream",
        config={"job_args": {"directory": str(tmp_path / name)}},
    )
    return job_create(name=f"{name}-main", application=app, version=version, parallelism=2)


def wait(what: str, check: object, timeout: float, logs: list[Path]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.2)
    tails = "\n".join(f"== {p}\n{p.read_text(errors='replace')[-3000:]}" for p in logs)
    raise AssertionError(f"timed out waiting for {what}\n{tails}")


def test_operations_and_the_control_loop_are_routed_to_their_own_queues() -> None:
    from controlplane.celery import app

    router = app.amqp.router
    for task, queue in (
        ("epochal.run_operation", "operations"),
        ("epochal.reconcile", "control"),
        ("epochal.watch_runs", "control"),
        ("epochal.autoscale", "control"),
    ):
        routed = router.route({}, task)["queue"]
        assert (routed.name, routed.exchange.name, routed.routing_key) == (queue, queue, queue)


@pytest.mark.timeout(300)
def test_a_60_s_operation_does_not_delay_indexing_a_new_commit(tmp_path: Path) -> None:
    from django.db import connection

    require_service(
        "PostgreSQL",
        connection.vendor == "postgresql",
        "the workers share the test database: DATABASE_URL=postgres://…",
    )
    busy = a_job(tmp_path, "busy")
    other = a_job(tmp_path, "other")
    commit_epochs(busy, 1)
    Job.objects.filter(pk=busy.pk).update(state="running")  # force_epoch needs a running job
    busy.refresh_from_db()
    op = operation_request(
        kind="savepoint",
        application=busy.application,
        job=busy,
        params={"force_epoch": True, "timeout_s": OPERATION_S},
        dispatch=False,  # the reconciler dispatches it, as it does any undelivered operation
    ).operation

    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("EPOCHAL_", "CELERY_"))},
        "DJANGO_SETTINGS_MODULE": "controlplane.settings",
        "DATABASE_URL": database_url(),
        "EPOCHAL_VAR_DIR": str(tmp_path / "var"),  # the filesystem broker, as in the demo
        "EPOCHAL_STORE_ROOTS": str(tmp_path),
        "EPOCHAL_RECONCILE_INTERVAL_S": "1",
        "PYTHONPATH": SUBPROCESS_PYTHONPATH,
    }
    logs = [tmp_path / f"worker-{queue}.log" for queue in QUEUES]
    workers = start_workers(
        name="test",
        log_dir=tmp_path,
        beat_schedule=str(tmp_path / "celerybeat-schedule"),
        cwd=ROOT,
        env=env,
    )
    try:

        def waiting() -> bool:
            op.refresh_from_db()
            return op.state == "running" and op.current_phase == "await_epoch"

        wait("the savepoint to wait for an epoch", waiting, 120, logs)
        busy_since = time.monotonic()

        [sid] = commit_epochs(other, 1)
        committed = time.monotonic()
        wait(
            "the index to have the other job's commit",
            lambda: Snapshot.objects.filter(snapshot_id=sid).exists(),
            OPERATION_S,
            logs,
        )
        indexed_after = time.monotonic() - committed
        op.refresh_from_db()
        assert op.state == "running", f"the operation ended first ({op.state}): not a test"
        assert time.monotonic() - busy_since < OPERATION_S
        assert indexed_after < INDEX_WITHIN_S, (
            f"indexed {indexed_after:.1f} s after the commit, behind the operation"
        )
        # each task reached its own queue's worker only
        control_log, operations_log = (log.read_text(errors="replace") for log in logs)
        assert "epochal.run_operation[" in operations_log
        assert "epochal.run_operation[" not in control_log
        assert "epochal.reconcile[" in control_log and "epochal.reconcile[" not in operations_log
    finally:
        Operation.objects.filter(pk=op.pk).update(state="cancelled")
        for worker in workers:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(timeout=30)
