"""bench.engine's recovery part: a driver SIGKILLed mid-epoch, restarted by the control plane.

A whole control plane runs in child processes on the embedded defaults (SQLite, the filesystem
broker, the local launcher, the default beat intervals): ``manage.py migrate`` and
``register``, a Celery worker with beat (the reconciler), ``manage.py start``. The version's
resources set ``standby`` (default): the local launcher keeps a warm standby driver, and the
job is paused after its first commit until the standby is warm (so it never competes with a
measured epoch). Once the job has committed three more epochs and a third of the next epoch
has passed, the run's process group (driver, JVM, Python workers) is SIGKILLed; nothing else
is done. The reconciler notices the dead run and requests a start operation, which launches a
new run from the branch head — adopting the standby. Without ``standby`` there is no pause and
the restart starts a driver cold. The job is ``bench-recovery`` (`bench.engine.recovery_job`,
an ``epochal.jobs`` entry point registered by ``bench/entry_points/`` for the processes this
part starts only: it is not offered to users).

Timed from the kill: ``relaunch`` (until the new run's directory exists: detection, the
restart request, the start operation up to the launcher), ``session`` (until the new driver
prints ``started``: interpreter, imports, JVM; an adopted standby has them), ``first_epoch``
(until its first commit: state restore and the interrupted epoch again). ``recovery_ratio`` =
recovery ÷ (the first run's own launch-to-``started`` time, a cold start, + twice the median of
the epochs before the kill), all measured in the same run.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from bench.datagen import EpochSet
from bench.timing import log

REPO_ROOT = Path(__file__).resolve().parent.parent
BENCH_ENTRY_POINTS = REPO_ROOT / "bench" / "entry_points"
APPLICATION = "bench"
JOB = "bench-main"
KILL_AFTER_COMMITS = 3
T = TypeVar("T")


def events(log_path: Path) -> list[dict[str, Any]]:
    """The JSON event lines a run printed so far (its output.log)."""
    found = []
    with contextlib.suppress(OSError):
        for line in log_path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    found.append(json.loads(line))
    return found


def _wait(what: str, condition: Callable[[], T | None], timeout: float = 600) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    raise RuntimeError(f"recovery: timed out after {timeout:g} s waiting for {what}")


class Plane:
    """The control plane's processes over one var directory."""

    def __init__(self, var: Path) -> None:
        self.var = var
        self.store_url = f"file://{var / 'store'}"
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("EPOCHAL_", "DJANGO_"))},
            "DJANGO_SETTINGS_MODULE": "controlplane.settings",
            "DJANGO_DEBUG": "true",
            "DATABASE_URL": f"sqlite:///{var / 'epochal.sqlite3'}",
            "CELERY_BROKER_URL": "filesystem://",
            "EPOCHAL_VAR_DIR": str(var),
            "STORE_URL": self.store_url,
            "EPOCHAL_STORE_ROOTS": str(var),
            "RUNNER": "local",
            # the code, and the metadata registering bench-recovery (not installed for users)
            "PYTHONPATH": os.pathsep.join((str(REPO_ROOT), str(BENCH_ENTRY_POINTS))),
            "PYTHONUNBUFFERED": "1",
        }
        for key in ("CELERY_RESULT_BACKEND", "CACHE_URL", "REDIS_URL"):
            self.env.pop(key, None)
        self.worker: subprocess.Popen[bytes] | None = None

    def manage(self, *args: str) -> str:
        proc = subprocess.run(
            [sys.executable, str(REPO_ROOT / "manage.py"), *args],
            env=self.env,
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args)}: {proc.stdout}{proc.stderr}")
        return proc.stdout

    def start_worker(self) -> None:
        log_file = open(self.var / "worker.log", "ab")  # noqa: SIM115 (the child keeps it)
        self.worker = subprocess.Popen(
            [
                sys.executable, "-m", "celery", "-A", "controlplane", "worker", "-B",
                "--pool=solo", "--loglevel=INFO", "-n", f"bench-{os.getpid()}@%h",
                "-s", str(self.var / "celerybeat-schedule"),
            ],
            env=self.env,
            cwd=REPO_ROOT,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip

    def runs(self) -> list[Path]:
        """Run directories the launcher created, oldest first."""
        root = self.var / "runs"
        if not root.exists():
            return []
        made = [d for d in root.iterdir() if (d / "spec.json").exists()]
        return sorted(made, key=lambda d: (d / "spec.json").stat().st_mtime)

    def standby_ready(self) -> dict[str, Any] | None:
        """The ready standby's report (session and warm-up seconds), None while there is none."""
        for ready in (self.var / "runs" / ".standby").glob("*/ready.json"):
            with contextlib.suppress(OSError, ValueError):
                report: dict[str, Any] = json.loads(ready.read_text())
                return report
        return None

    def close(self) -> None:
        """Stop the worker (no reconciler may restart what follows), then SIGKILL every run's
        and standby's process group (nothing may outlive the part)."""
        if self.worker is not None and self.worker.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.worker.pid, signal.SIGTERM)
            try:
                self.worker.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.worker.pid, signal.SIGKILL)
                self.worker.wait(timeout=20)
        for run in [*self.runs(), *(self.var / "runs").glob(".standby/*")]:
            with contextlib.suppress(OSError, ValueError, KeyError, ProcessLookupError):
                os.killpg(json.loads((run / "pid").read_text())["pid"], signal.SIGKILL)


def _set_paused(repo: Any, paused: bool) -> None:
    for _ in range(20):  # the running job writes no control document; the CAS rarely loses
        doc, version = repo.read_control("main")
        with contextlib.suppress(Exception):
            repo.write_control("main", {**doc, "paused": paused}, version)
            return
    raise RuntimeError("recovery: could not write the control document")


def measure_recovery(work: Path, data: EpochSet, *, standby: bool = True) -> dict[str, Any]:
    """Run the control plane, kill the job's driver mid-epoch, time its restart.

    With `standby` the job's version sets ``resources.standby``: the local launcher keeps a
    warm standby driver (runners/local_standby.py). It starts once the run has committed its
    first epoch; the job is paused meanwhile, so the steady epochs are measured (and the kill
    lands) with the standby idle and ready, and it never competes with the measured ones."""
    from snapshots_store import Repository

    var = (work / "recovery-plane").resolve()
    var.mkdir(parents=True, exist_ok=True)
    plane = Plane(var)
    resources: dict[str, Any] = {"driver_memory_mb": 4096, "standby": standby}
    try:
        t0 = time.perf_counter()
        plane.manage("migrate", "--noinput", "-v", "0")
        plane.manage(
            "register", APPLICATION, "--job", "bench-recovery", "--job-name", JOB,
            "--job-args", json.dumps({"directory": str(data.directory)}),
            "--config", json.dumps({"resources": resources}),
        )  # fmt: skip
        plane.start_worker()
        log(f"recovery: control plane up in {time.perf_counter() - t0:.1f} s")
        repo = Repository.open(plane.store_url, APPLICATION)

        def head_epoch() -> int:
            head = repo.read_ref("heads/main")
            return 0 if head is None else repo.read_manifest(head.target).epoch

        starter = subprocess.Popen(  # `manage.py start` returns once the run has started
            [sys.executable, str(REPO_ROOT / "manage.py"), "start", JOB],
            env=plane.env, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        first = _wait("the first run", lambda: next(iter(plane.runs()), None))
        t_first = time.perf_counter()
        first_log = first / "output.log"
        _wait("the first run's started event", lambda: _started(first_log))
        session_s = time.perf_counter() - t_first
        starter.wait(timeout=600)
        after = 0
        standby_ready: dict[str, Any] | None = None
        if standby:
            _wait("the first commit", lambda: head_epoch() >= 1)
            _set_paused(repo, True)
            standby_ready = _wait("the standby", plane.standby_ready, 300)
            after = head_epoch()
            _set_paused(repo, False)
        kill_after = after + KILL_AFTER_COMMITS
        _wait(f"{KILL_AFTER_COMMITS} commits", lambda: head_epoch() >= kill_after)

        def epoch_started() -> bool:
            found = events(first_log)
            starts = sum(e.get("event") == "epoch_start" for e in found)
            return starts > sum(e.get("event") == "committed" for e in found)

        _wait("the next epoch to start", epoch_started)
        committed = [e for e in events(first_log) if e.get("event") == "committed"]
        steady = [e for e in committed if int(e["epoch"]) > max(after, 1)]
        epoch_s = statistics.median(float(e["duration_s"]) for e in steady)
        time.sleep(epoch_s / 3)
        pid = json.loads((first / "pid").read_text())["pid"]
        at_kill = head_epoch()
        os.killpg(pid, signal.SIGKILL)  # the driver dies (OOM, node lost …)
        t_kill = time.perf_counter()
        mid_epoch = at_kill == kill_after
        second = _wait("the restart's run", lambda: next(iter(plane.runs()[1:]), None))
        t_launch = time.perf_counter()
        second_log = second / "output.log"
        _wait("the restart's started event", lambda: _started(second_log))
        t_started = time.perf_counter()
        _wait("the first commit after the restart", lambda: head_epoch() > at_kill, 900)
        t_commit = time.perf_counter()
        restarted = next(e for e in events(second_log) if e.get("event") == "started")
        head = repo.read_ref("heads/main")
        stats = {} if head is None else repo.read_manifest(head.target).stats
    finally:
        plane.close()
    recovery_s = t_commit - t_kill
    baseline = session_s + 2 * epoch_s
    first_started = next(e for e in events(first_log) if e.get("event") == "started")
    return {
        "recovery_s": round(recovery_s, 3),
        "recovery_session_start_s": round(session_s, 3),
        "recovery_epoch_s": round(epoch_s, 3),
        "recovery_kill_mid_epoch": mid_epoch,
        "recovery_ratio": round(recovery_s / baseline, 3) if baseline > 0 else None,
        # the job's resources.standby, and whether the restart took the standby over
        "recovery_standby": standby,
        "recovery_standby_adopted": bool(restarted.get("standby")),
        "recovery_breakdown_s": {
            # kill -> the new run's directory: detection, restart request, start operation
            "relaunch": round(t_launch - t_kill, 3),
            # -> the new driver's `started`: interpreter, imports, JVM, SparkSession (a
            # standby has them already: loading the job and the store only)
            "session": round(t_started - t_launch, 3),
            # -> its first commit: state restore and the interrupted epoch run again
            "first_epoch": round(t_commit - t_started, 3),
        },
        # the restarted run's first commit, from its manifest: the restore stage (and the
        # bytes it read from the store, 0 when the machine's state cache had every key
        # group), the epoch's Spark job, the driver's whole epoch before the commit
        "recovery_first_epoch_detail": {
            k: stats[k]
            for k in ("restore_s", "restore_bytes", "tasks_wall_s", "process_s")
            if k in stats
        },
        # inside the driver processes: loading the job and store, the SparkSession
        "recovery_startup_s": {
            "first": {k: first_started.get(k) for k in ("load_s", "session_s")},
            "restart": {k: restarted.get(k) for k in ("load_s", "session_s")},
        },
        "recovery_standby_warm_s": standby_ready,
    }


def _started(log_path: Path) -> bool:
    return any(e.get("event") == "started" for e in events(log_path))
