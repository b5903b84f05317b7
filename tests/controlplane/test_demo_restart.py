"""Job states an operator can trust across the demo's own shutdowns.

A user runs the demo, forks the main job into a job of their own, and stops the demo: with
Ctrl-C (SIGINT), with `kill` (SIGTERM), and with `kill -9` (SIGKILL). After the first two every
run was stopped at an epoch boundary by the control plane's shutdown — said in those words, not
"no more input" — and both jobs still want to run, so the next start of the demo brings both
back. SIGKILL leaves nobody to stop anything: the runs go on unwatched, `epochal jobs` says so
(`unknown (control plane was down)`, not `running`), and the next start finds them running.
A run stopped by a signal from outside the control plane is started again by the reconciler.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.demo_process import JOB, Demo, alive, children, epochal, jobs

pytestmark = [pytest.mark.spark]

FORK = "clickstream-exp"
SHUTDOWN = "stopped by shutdown of the control plane"
#: the demo's and the CLI's: a run unwatched for this long is `unknown` (30 s by default)
ENV = {"EPOCHAL_UNWATCHED_AFTER_S": "6"}


def start(var_dir: Path) -> Demo:
    demo = Demo(var_dir, "--input-batches", "1", "--records", "300", "--feed-every", "3", env=ENV)
    demo.wait_serving(timeout=600)
    return demo


def wait_for(what: str, check: Callable[[], object], *, timeout: float = 300) -> object:
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(1)
    raise AssertionError(f"timed out waiting for {what}; last seen: {last!r}")


def live_run_ids(var_dir: Path) -> dict[str, str]:
    """Each job's live run in the demo's database (job name -> run id)."""
    db = sqlite3.connect(var_dir / "epochal.sqlite3")
    try:
        rows = db.execute(
            "SELECT j.name, r.run_id FROM jobs_run r JOIN jobs_job j ON j.id = r.job_id "
            "WHERE r.phase IN ('pending', 'running')"
        ).fetchall()
    finally:
        db.close()
    return dict(rows)


def both_running(var_dir: Path) -> dict[str, dict[str, object]] | None:
    shown = jobs(var_dir, ENV)
    ok = all(shown.get(name, {}).get("state") == "running" for name in (JOB, FORK))
    return shown if ok else None


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def group_alive(pgid: int) -> bool:
    from runners.processes import group_members

    return bool(group_members(pgid))


@pytest.mark.timeout(2400)
def test_jobs_come_back_after_sigint_sigterm_and_sigkill_of_the_demo(tmp_path: Path) -> None:
    var_dir = tmp_path / "var"
    demo = start(var_dir)
    try:
        # the demo's version writes the Delta sink: the fork writes none (--sinks '')
        epochal(var_dir, "fork", "--job", JOB, "--snapshot", "main", "--branch", "exp",
                "--job-name", FORK, "--sinks", "", "--start", env=ENV)  # fmt: skip
        wait_for("both jobs running", lambda: both_running(var_dir))

        for signum in (signal.SIGINT, signal.SIGTERM):
            runs_before = live_run_ids(var_dir)
            assert set(runs_before) == {JOB, FORK}, runs_before
            demo.signal(signum)
            left = demo.processes()
            assert left == [], f"alive after {signum.name}: {left}\n{demo.output}"
            assert "stopped 2 run(s) at an epoch boundary" in demo.output, demo.output
            shown = jobs(var_dir, ENV)
            for name in (JOB, FORK):
                assert shown[name]["state"] == "stopped", shown[name]
                assert shown[name]["status_reason"] == SHUTDOWN, shown[name]
                assert shown[name]["desired_state"] == "running", shown[name]

            demo = start(var_dir)
            wait_for(f"both jobs running again after {signum.name}", lambda: both_running(var_dir))
            runs_after = live_run_ids(var_dir)
            assert set(runs_after) == {JOB, FORK}
            assert not set(runs_after.values()) & set(runs_before.values()), "not new runs"

        # SIGKILL: nobody stops the runs; the workers die with the demo (parent-death signal)
        runs_before = live_run_ids(var_dir)
        run_groups = [int(p) for p in demo.run_pids()]
        workers = [p for p in children(demo.proc.pid) if b"celery" in cmdline(p)]
        assert len(workers) >= 2, workers  # the control worker (and its beat), operations
        demo.signal(signal.SIGKILL)

        def workers_gone() -> bool:
            return not [p for p in workers if alive(p) and b"celery" in cmdline(p)]

        wait_for("the workers to exit after the demo was killed", workers_gone, timeout=120)
        assert any(group_alive(g) for g in run_groups), "the runs should go on unwatched"
        time.sleep(float(ENV["EPOCHAL_UNWATCHED_AFTER_S"]) + 1)
        shown = jobs(var_dir, ENV)
        for name in (JOB, FORK):
            assert shown[name]["state"] == "unknown", shown[name]
            assert shown[name]["recorded_state"] == "running", shown[name]
        table = epochal(var_dir, "jobs", env=ENV)
        assert table.count("unknown (control plane was down)") == 2, table

        demo = start(var_dir)
        assert f"job {JOB} is already running" in demo.output, demo.output
        wait_for("both jobs watched and running again", lambda: both_running(var_dir))
        assert live_run_ids(var_dir) == runs_before  # the same runs, found running

        # a stop nobody in the control plane asked for: SIGTERM to the fork's run
        fork_run = runs_before[FORK]
        pid_file = var_dir / "runs" / fork_run / "pid"
        os.killpg(int(json.loads(pid_file.read_text())["pid"]), signal.SIGTERM)

        def fork_restarted() -> bool:
            runs = live_run_ids(var_dir)
            return FORK in runs and runs[FORK] != fork_run

        wait_for("the reconciler to start the fork again", fork_restarted, timeout=300)
        ops = epochal(var_dir, "operation", "--job", FORK, "--json", env=ENV)
        assert "stopped by SIGTERM from outside the control plane" in ops, ops
    finally:
        demo.kill_everything()
