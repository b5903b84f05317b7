"""A hot-swap that finishes in a web of three jobs — old O, new N (a fork of O), and a
downstream D reading O's branch output — on real Spark: at S the new job becomes the only
writer, O stops at the boundary after S and is retired, D is re-pointed to N's branch and
reads every upstream epoch exactly once (O's up to S, N's after). Each case crashes one kind
of process in one phase of the swap: every job process (the runner is dropped and a new one
resumes from the store), or the coordinating worker (SIGKILLed right after the phase acted,
before its success was recorded; another worker resumes the operation)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from controlplane.applications.models import Application, ApplicationVersion
from controlplane.jobs.models import Job, JobState
from controlplane.jobs.services import job_create
from controlplane.operations.executor import CRASH_ENV, execute
from controlplane.operations.models import Operation
from controlplane.operations.services import operation_request
from runners.engine import EpochRunner
from runners.engine import Job as EngineJob
from runners.engine import aggregations as agg
from runners.engine.branch_source import BranchOutputSource, epoch_mapping
from runners.engine.hotswap import RETIRED, SwapSide, swap_output
from runners.engine.state_ops import new_branch_commit
from snapshots_store import Repository
from tests.conftest import registered_store
from tests.e2e.harness import ROOT, database_url
from tests.engine.jobs import aggregate_job, write_epochs

pytestmark = [pytest.mark.spark, pytest.mark.django_db(transaction=True)]

PHASES = ["prepare", "await_prepared", "commit", "repoint", "await_swapped", "retire"]


def downstream_job(store: str) -> EngineJob:
    return EngineJob(
        name="totals",
        source=BranchOutputSource(store, "up", "main", schema={"key": "string", "count": "int64"}),
        key="key",
        aggregate=[agg.count(), agg.sum("count")],
    )


@pytest.fixture
def web(spark: Any, tmp_path: Path) -> dict[str, Any]:
    store = f"file://{tmp_path / 'store'}"
    data = str(tmp_path / "in")
    write_epochs(data, files=12, keys=40, records=200)
    up = Application.objects.create(
        name="up", store_namespace="up", max_parallelism=32, store=registered_store(store)
    )
    down = Application.objects.create(
        name="down", store_namespace="down", max_parallelism=32, store=registered_store(store)
    )
    jobs = {}
    for app, name, branch in (
        (up, "up-main", "main"),
        (up, "up-v2", "v2"),
        (down, "down-main", "main"),
    ):
        version = ApplicationVersion.objects.create(
            application=app, number=1 + ApplicationVersion.objects.filter(application=app).count(),
            job="clickstream", config={},
        )  # fmt: skip
        jobs[name] = job_create(name=name, application=app, version=version, branch=branch)
    up_repo, down_repo = Repository.open(store, "up"), Repository.open(store, "down")
    EpochRunner(spark, aggregate_job(data), repo=up_repo, parallelism=2).run(max_epochs=2)
    EpochRunner(spark, downstream_job(store), repo=down_repo, parallelism=2).run(max_epochs=1)
    new_branch_commit(
        up_repo, "main", "v2", kind="fork", operation_id="op-fork",
        provenance={"reason": "v2"}, code_version="2",
    )  # fmt: skip
    Job.objects.filter(name="up-main").update(state=JobState.RUNNING)
    return {"store": store, "data": data, "up": up_repo, "down": down_repo, "spark": spark}


def runners(web: dict[str, Any]) -> dict[str, EpochRunner]:
    spark, data, store = web["spark"], web["data"], web["store"]
    return {
        "old": EpochRunner(spark, aggregate_job(data), repo=web["up"], branch="main"),
        "new": EpochRunner(spark, aggregate_job(data), repo=web["up"], branch="v2"),
        "down": EpochRunner(spark, downstream_job(store), repo=web["down"], branch="main"),
    }


def coordinate_with_a_crash(op: Operation, phase: str) -> str:
    """The coordinator (a worker process) is SIGKILLed right after `phase` acted, before its
    success was recorded; once its lease expired another worker (this process) resumes."""
    env = {
        **{k: v for k, v in os.environ.items() if k != CRASH_ENV},
        "DJANGO_SETTINGS_MODULE": os.environ.get("DJANGO_SETTINGS_MODULE", "tests.settings"),
        "DATABASE_URL": database_url(),
        CRASH_ENV: f"hotswap:{phase}",
        "PYTHONPATH": str(ROOT),
    }
    code = (
        "import django; django.setup(); "
        "from controlplane.operations.executor import execute; "
        f"execute({str(op.pk)!r})"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, timeout=300
    )
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    Operation.objects.filter(pk=op.pk).update(lease_expires_at=timezone.now())
    return execute(op.pk)


@pytest.mark.parametrize("process", ["jobs", "worker"])
@pytest.mark.parametrize("crash_in", PHASES)
def test_the_swap_finishes_in_a_web_of_three_jobs_whatever_phase_a_process_crashes_in(
    web: dict[str, Any], crash_in: str, process: str
) -> None:
    """`jobs`: every job process (O, N, D) restarts in the phase; `worker`: the coordinator
    is SIGKILLed in it."""
    old_job = Job.objects.get(name="up-main")
    op = operation_request(
        kind="hotswap",
        application=old_job.application,
        job=old_job,
        params={"new_job": "up-v2", "lead_epochs": 3, "timeout_s": 240},
        dispatch=False,
    ).operation
    live = runners(web)
    stop = threading.Event()
    crashed: list[int] = []
    reasons: dict[str, str] = {}

    def started(name: str) -> bool:
        phases = Operation.objects.filter(pk=op.pk).values_list("phases", flat=True)[0]
        return any(p["name"] == name and p["state"] != "pending" for p in phases)

    def jobs() -> None:
        nonlocal live
        try:
            while not stop.is_set():
                if process == "jobs" and not crashed and started(crash_in):
                    # every job process dies in this phase (a phase that acts at once: right
                    # after it acted) and a new one resumes from its branch head
                    crashed.append(1)
                    live = runners(web)
                prepared = "swap" in web["up"].read_control("v2")[0]
                for role, runner in live.items():
                    if role == "new" and not prepared:
                        continue  # the new job starts once the swap is prepared
                    if runner.run_epoch() is None and runner.stopped_reason:
                        reasons[role] = runner.stopped_reason
                time.sleep(0.05)
        finally:
            connection.close()

    worker = threading.Thread(target=jobs)
    worker.start()
    try:
        if process == "worker":
            crashed.append(1)
            outcome = coordinate_with_a_crash(op, crash_in)
        else:
            outcome = execute(op.pk)
        deadline = time.monotonic() + 120
        # the downstream catches up with everything the new job emits
        while time.monotonic() < deadline:
            mapping = epoch_mapping(web["down"], "main")
            v2_head = web["up"].read_manifest(web["up"].resolve("heads/v2")).epoch
            if (
                mapping
                and mapping[-1].upstream_epochs
                and mapping[-1].upstream_epochs[-1] >= min(v2_head, 12)
            ):
                break
            time.sleep(0.5)
    finally:
        stop.set()
        worker.join(timeout=180)
    op.refresh_from_db()
    assert outcome == "succeeded", (op.error_code, op.error_message, op.phases)
    assert crashed, f"no crash happened in phase {crash_in}"
    s = op.result["swap_epoch"]
    assert op.result["repointed"] == ["down-main"]
    # the new job is the only writer after S; the old one stopped at S and is retired
    old_head = web["up"].read_manifest(web["up"].resolve("heads/main"))
    assert old_head.epoch == s
    assert reasons["old"].startswith(RETIRED)
    old_job.refresh_from_db()
    assert old_job.state == JobState.STOPPED and old_job.status_reason.startswith("retired: ")
    out = swap_output(SwapSide(web["store"], "up", "main"), SwapSide(web["store"], "up", "v2"))
    by_epoch = out.to_pandas().groupby("_epoch")["_job"].unique()
    assert all(list(j) == ["old" if e <= s else "new"] for e, j in by_epoch.items())
    # the downstream read every upstream epoch exactly once: O's up to S, N's after
    read: list[int] = []
    for entry in epoch_mapping(web["down"], "main"):
        read.extend(entry.upstream_epochs)
    assert read == list(range(1, read[-1] + 1)), read
    assert read[-1] > s
    branches = {}
    for _, manifest in web["down"].log("heads/main", first_parent=True):
        doc = manifest.extra.get("inputs", {}).get("upstream", {})
        for e in doc.get("epochs", []):
            branches[e] = doc["branch"]
    assert {e: b for e, b in branches.items()} == {
        e: "main" if e <= s else "v2" for e in range(1, read[-1] + 1)
    }
    # the downstream's totals equal the output of the pair, each upstream epoch once
    down_rows = sum(
        int(m.stats.get("records_in", 0))
        for _, m in web["down"].log("heads/main", first_parent=True)
    )
    assert down_rows == out.filter(out.column("_epoch").to_numpy() <= read[-1]).num_rows
