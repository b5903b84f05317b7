"""The Celery workers of a control plane on one machine (the demo's; the Helm chart runs the
same split as two Deployments): one per queue, so the control loop never waits behind an
operation.

* `control`: the beat and its tasks — the reconciler, the run watch, lineage indexing, the
  autoscaler, gc. Two threads: a long indexing pass does not hold up the run watch.
* `operations`: `epochal.run_operation`. Threads, since an operation spends most of its time
  waiting (for a run to start, an epoch to commit); four operations of different jobs at once.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final

QUEUES: Final = ("control", "operations")


def worker_command(queue: str, *, name: str, beat_schedule: str | None = None) -> list[str]:
    """The command line of the worker for `queue` (`beat_schedule`: the beat's file, for the
    control worker, which runs the beat in the same process)."""
    if queue not in QUEUES:
        raise ValueError(f"unknown queue {queue!r}; one of {QUEUES}")
    command = [sys.executable, "-m", "celery", "-A", "controlplane", "worker", "-Q", queue]
    command += ["--loglevel=INFO", "-n", f"{name}-{queue}@%h", "--pool=threads"]
    if queue == "control":
        command += ["--concurrency=2"]
        if beat_schedule is not None:
            command += ["-B", "-s", beat_schedule]
    else:
        command += ["--concurrency=4"]
    return command


def start_workers(
    *,
    name: str,
    log_dir: Path,
    beat_schedule: str,
    cwd: Path,
    env: Mapping[str, str] | None = None,
    preexec_fn: Callable[[], None] | None = None,
    ready_timeout_s: float = 90.0,
) -> list[subprocess.Popen[bytes]]:
    """Start the worker of each queue, each in its own session, logging to
    `log_dir/worker-QUEUE.log` (appended), one after the other: the filesystem broker's
    first worker creates its exchange files, which a second one starting at the same
    instant may read half-written."""
    workers: list[subprocess.Popen[bytes]] = []
    for queue in QUEUES:
        log_path = log_dir / f"worker-{queue}.log"
        start = log_path.stat().st_size if log_path.exists() else 0
        with open(log_path, "ab") as log:
            worker = subprocess.Popen(
                worker_command(queue, name=name, beat_schedule=beat_schedule),
                cwd=cwd,
                env=None if env is None else dict(env),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=preexec_fn,
            )
        workers.append(worker)
        deadline = time.monotonic() + ready_timeout_s
        while time.monotonic() < deadline and worker.poll() is None:
            with open(log_path, "rb") as log:
                log.seek(start)
                if b" ready." in log.read():
                    break
            time.sleep(0.2)
    return workers
