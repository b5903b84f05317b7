"""Celery over RabbitMQ: a real worker consuming from the RabbitMQ broker runs a real operation.

The control plane's broker is whatever `CELERY_BROKER_URL` names; Redis is the usual one and
the end-to-end tests use it. Here the same `epochal.run_operation` message goes through
RabbitMQ (`$RABBITMQ_URL`) to a `celery worker` subprocess configured only by environment
variables, which executes a savepoint against the job's real store and the test database.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from controlplane.jobs.models import Job
from controlplane.jobs.store import job_repository
from controlplane.operations.models import Operation
from controlplane.operations.services import RUN_OPERATION_TASK, operation_request
from tests.conftest import require_service
from tests.e2e.harness import database_url
from tests.operations.test_requests import commit_epochs
from tests.operations.test_requests import job as job  # the fixture

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]


def test_a_worker_on_rabbitmq_runs_a_savepoint(job: Job, rabbitmq_url: str, tmp_path: Path) -> None:
    from django.db import connection

    from controlplane.celery import app

    require_service(
        "PostgreSQL",
        connection.vendor == "postgresql",
        "the worker subprocess shares the test database: DATABASE_URL=postgres://…",
    )
    ids = commit_epochs(job, 3)
    op = operation_request(
        kind="savepoint",
        application=job.application,
        job=job,
        params={"name": "via-rabbitmq", "snapshot": ids[1][:12]},
        dispatch=False,
    ).operation
    queue = f"epochal-test-{uuid.uuid4().hex[:12]}"  # private: the broker may be shared
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("EPOCHAL_")},
        "DJANGO_SETTINGS_MODULE": "controlplane.settings",
        "DATABASE_URL": database_url(),
        "CELERY_BROKER_URL": rabbitmq_url,
        "EPOCHAL_VAR_DIR": str(tmp_path / "var"),
        "PYTHONPATH": str(ROOT),
    }
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "controlplane", "worker", "--pool=solo",
             "--loglevel=INFO", "-Q", queue, "-n", f"{queue}@%h"],
            env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        with app.connection_for_write(rabbitmq_url) as conn:
            app.send_task(RUN_OPERATION_TASK, args=(str(op.pk),), queue=queue, connection=conn)
        state = _wait_for_end(op, worker, timeout=90)
        assert state == "succeeded", log.read_text(errors="replace")[-4000:]
        assert job_repository(job).read_ref("tags/via-rabbitmq").target == ids[1]
        assert "epochal.run_operation" in log.read_text(errors="replace")  # the worker ran it
        assert "amqp://" in log.read_text(errors="replace")  # ... consuming from RabbitMQ
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(timeout=30)
        with app.connection_for_write(rabbitmq_url) as conn:
            conn.default_channel.queue_delete(queue)


def _wait_for_end(op: Operation, worker: subprocess.Popen[Any], *, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        op.refresh_from_db()
        if op.state not in ("pending", "running"):
            return str(op.state)
        assert worker.poll() is None, f"the worker exited with {worker.returncode}"
        time.sleep(0.3)
    raise AssertionError(f"operation {op.pk} still {op.state} after {timeout:g} s")
