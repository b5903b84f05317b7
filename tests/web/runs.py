"""Real local runs of a job for the dashboard's tests: the local launcher starts a small
Python program in place of the engine (it prints what the engine prints), so the pages read
the run's log, exit status and reason the way they read a Spark job's."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from controlplane.jobs import services
from controlplane.jobs.models import Job, Run
from controlplane.jobs.services import run_refresh
from runners.job_spec import JobSpec
from runners.local import LocalLauncher

CRASHING = """
import json
print(json.dumps({"event": "started", "branch": "main"}), flush=True)
print(json.dumps({"event": "epoch_start", "n": 1}), flush=True)
print(json.dumps({"event": "committed", "epoch": 7, "snapshot_id": "x"}), flush=True)
print(json.dumps({"event": "epoch_start", "n": 2}), flush=True)
print("INFO a line about nothing", flush=True)
def deep():
    raise RuntimeError("state chunk 3 of key group 5 is corrupt")
deep()
"""

TICKING = """
import json, time
print(json.dumps({"event": "started", "branch": "main"}), flush=True)
for n in range(1, 100000):
    print(f"INFO tick {n}", flush=True)
    time.sleep(0.5)
"""


def local_run(
    job: Job,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    program: str,
    run_id: str,
    finish: bool,
) -> Run:
    """Start `program` as a run of `job` through the local launcher (runs under
    `tmp_path/runs`); with `finish`, wait until it ended and its end is recorded."""
    script = tmp_path / f"{run_id}.py"
    script.write_text(program)
    launcher = services._LAUNCHERS.get("local")
    if not isinstance(launcher, LocalLauncher) or launcher.runs_dir != tmp_path / "runs":
        launcher = LocalLauncher(runs_dir=tmp_path / "runs")
        monkeypatch.setitem(services._LAUNCHERS, "local", launcher)
    monkeypatch.setattr(
        launcher, "command", lambda spec: [sys.executable, str(tmp_path / f"{spec.run_id}.py")]
    )
    spec = JobSpec(
        application=job.application.name,
        namespace=job.application.store_namespace,
        branch=job.branch,
        store_url=job.application.effective_store_url,
        job=job.version.job,
        parallelism=2,
        run_id=run_id,
    )
    handle = launcher.start(spec)
    run = Run.objects.create(
        job=job, run_id=run_id, runner="local", parallelism=2, spec=spec.to_dict(),
        handle=handle.to_dict(), phase="running",
    )  # fmt: skip
    if finish:
        deadline = time.monotonic() + 30
        while run.phase == "running" and time.monotonic() < deadline:
            time.sleep(0.2)
            run = run_refresh(run)
    return run
