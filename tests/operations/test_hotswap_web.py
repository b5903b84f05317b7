"""A hot-swap that finishes in a web of three jobs — old O, new N (a fork of O), and a
downstream D reading O's branch output — on real Spark: at S the new job becomes the only
writer, O stops at the boundary after S and is retired, D is re-pointed to N's branch and
reads every upstream epoch exactly once (O's up to S, N's after). Each case crashes one kind
of process in one phase of the swap: every job process (O, N, D each run as
`python -m runners.engine.main --follow`; all of them are SIGKILLed when the phase starts, and
new processes resume from the store), or the coordinating worker (SIGKILLed right after the
phase acted, before its success was recorded; another worker resumes the operation)."""

from __future__ import annotations

import contextlib
import json
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
from runners.engine.branch_source import epoch_mapping
from runners.engine.hotswap import RETIRED, SwapSide, swap_output
from runners.engine.state_ops import new_branch_commit
from runners.local import group_members
from snapshots_store import Repository
from tests.conftest import FAST_START_SUBMIT_ARGS, SUBPROCESS_PYTHONPATH, registered_store
from tests.e2e.harness import ROOT, database_url
from tests.engine.jobs import aggregate_job, branch_totals_job, write_epochs

pytestmark = [pytest.mark.spark, pytest.mark.django_db(transaction=True)]

PHASES = ["prepare", "await_prepared", "commit", "repoint", "await_swapped", "retire"]


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
    EpochRunner(spark, branch_totals_job(store), repo=down_repo, parallelism=2).run(max_epochs=1)
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
        "down": EpochRunner(spark, branch_totals_job(store), repo=web["down"], branch="main"),
    }


class JobProcesses:
    """O, N and D as engine processes (`python -m runners.engine.main --follow`), each in its
    own process group; `kill` SIGKILLs every one of them and waits until they are gone."""

    def __init__(self, web: dict[str, Any], tmp: Path) -> None:
        self.web, self.tmp = web, tmp
        self.running: dict[str, subprocess.Popen[bytes]] = {}
        self.logs: list[Path] = []

    def arguments(self, role: str) -> list[str]:
        store, data = self.web["store"], self.web["data"]
        job, args, namespace, branch = {
            "old": ("aggregate-job", {"directory": data}, "up", "main"),
            "new": ("aggregate-job", {"directory": data}, "up", "v2"),
            "down": ("branch-totals-job", {"store": store}, "down", "main"),
        }[role]
        return [
            "--job", job, "--job-args", json.dumps(args), "--store", store,
            "--namespace", namespace, "--branch", branch, "--parallelism", "2",
            "--max-parallelism", "32", "--follow", "--poll-interval", "0.2",
        ]  # fmt: skip

    def start(self, role: str) -> None:
        log = self.tmp / f"{role}-{len(self.logs)}.log"
        self.logs.append(log)
        env = {
            **os.environ,
            "PYTHONPATH": SUBPROCESS_PYTHONPATH,
            "SPARK_MASTER": "local[2]",
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_SUBMIT_ARGS": FAST_START_SUBMIT_ARGS,
        }
        with open(log, "wb") as out:
            self.running[role] = subprocess.Popen(
                [sys.executable, "-m", "runners.engine.main", *self.arguments(role)],
                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip

    def kill(self) -> None:
        for process in self.running.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        for process in self.running.values():
            process.wait(timeout=30)
            deadline = time.monotonic() + 30
            while group_members(process.pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not group_members(process.pid), "a job's process group outlived its SIGKILL"
            assert process.returncode == -signal.SIGKILL or process.returncode == 0
        self.running.clear()

    def stopped_reason(self, role: str) -> str | None:
        """The reason of the last `stopped` event of `role`'s newest process, if it exited."""
        process = self.running.get(role)
        if process is None or process.poll() is None:
            return None
        log = [p for p in self.logs if p.name.startswith(f"{role}-")][-1]
        for line in reversed(log.read_text(errors="replace").splitlines()):
            if line.startswith("{") and '"stopped"' in line:
                return str(json.loads(line)["reason"])
        raise AssertionError(f"{role} exited {process.returncode} without a stop:\n{self.log()}")

    def log(self) -> str:
        return "\n".join(f"== {p.name}\n{p.read_text(errors='replace')[-1500:]}" for p in self.logs)

    def stop(self) -> None:
        with contextlib.suppress(AssertionError):
            self.kill()


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
    web: dict[str, Any], crash_in: str, process: str, tmp_path: Path
) -> None:
    """`jobs`: every job process (O, N, D) is SIGKILLed in the phase and new ones resume;
    `worker`: the coordinator is SIGKILLed in it."""
    old_job = Job.objects.get(name="up-main")
    op = operation_request(
        kind="hotswap",
        application=old_job.application,
        job=old_job,
        params={"new_job": "up-v2", "lead_epochs": 3, "timeout_s": 240},
        dispatch=False,
    ).operation
    stop = threading.Event()
    crashed: list[int] = []
    reasons: dict[str, str] = {}
    processes = JobProcesses(web, tmp_path) if process == "jobs" else None

    def started(name: str) -> bool:
        phases = Operation.objects.filter(pk=op.pk).values_list("phases", flat=True)[0]
        return any(p["name"] == name and p["state"] != "pending" for p in phases)

    def prepared() -> bool:
        return "swap" in web["up"].read_control("v2")[0]

    def in_process_jobs() -> None:
        live = runners(web)
        try:
            while not stop.is_set():
                for role, runner in live.items():
                    if role == "new" and not prepared():
                        continue  # the new job starts once the swap is prepared
                    if runner.run_epoch() is None and runner.stopped_reason:
                        reasons[role] = runner.stopped_reason
                time.sleep(0.05)
        finally:
            connection.close()

    def job_processes() -> None:
        assert processes is not None
        try:
            processes.start("old")
            processes.start("down")
            while not stop.is_set():
                if not crashed and started(crash_in):
                    # every job process dies in this phase (a phase that acts at once: right
                    # after it acted); new ones resume from their branch heads
                    processes.kill()
                    crashed.append(1)
                    processes.start("old")
                    processes.start("down")
                if "new" not in processes.running and prepared():
                    processes.start("new")  # the new job starts once the swap is prepared
                reason = processes.stopped_reason("old")
                if reason is not None:
                    reasons["old"] = reason
                time.sleep(0.1)
        finally:
            connection.close()

    worker = threading.Thread(target=job_processes if processes else in_process_jobs)
    worker.start()
    try:
        if process == "worker":
            crashed.append(1)
            outcome = coordinate_with_a_crash(op, crash_in)
        else:
            outcome = execute(op.pk)
        deadline = time.monotonic() + 180
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
        if processes is not None:  # the old job's process exits by itself once retired
            deadline = time.monotonic() + 60
            while "old" not in reasons and time.monotonic() < deadline:
                time.sleep(0.2)
    finally:
        stop.set()
        worker.join(timeout=180)
        if processes is not None:
            job_log = processes.log()
            processes.stop()
    if processes is not None:
        assert "old" in reasons, job_log
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
