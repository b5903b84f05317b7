"""bench.engine's recovery part: a driver SIGKILLed mid-epoch, restarted by the control plane,
three ways, each against a cold start measured in the same run and each checked against a
failure-free run.

Per mode, a whole control plane runs in child processes on the embedded defaults (SQLite, the
filesystem broker, the local launcher, the default beat intervals, a state cache directory of
its own): ``manage.py migrate`` and ``register``, a Celery worker with beat (the reconciler),
``manage.py start``. The job is ``bench-recovery`` (`bench.engine.recovery_job`, an
``epochal.jobs`` entry point registered by ``bench/entry_points/`` for the processes this part
starts only: it is not offered to users) over the part's epoch files.

- ``warm``: the version's resources set ``standby``: the local launcher keeps a warm standby
  driver, and the job is paused after its first commit until the standby is warm (so it never
  competes with a measured epoch). The restart adopts the standby. A process crash on a
  surviving host: the machine's state cache is still there.
- ``cold``: no standby, no pause; the restart starts a driver cold. Same host, cache kept.
- ``node_lost``: as ``cold``, and between the kill and the restart the machine's state cache is
  wiped and the page cache dropped (what a lost node leaves): the restarted run's restore stage
  reads the state from the store (``restore_bytes``).

Once the job has committed three more epochs and a third of the next epoch has passed, the
run's process group (driver, JVM, Python workers) is SIGKILLed. That the kill landed inside an
epoch is then proved from the engine's own records, not from timing: once the group is dead,
the run's event log shows an ``epoch_start`` with no ``committed`` after it, the branch head
is the last epoch the log says was committed, and the restarted run's first commit is the
next epoch (the interrupted one, done again). The reconciler notices the dead run and requests
a start operation, which launches a new run from the branch head.

Timed from the kill: ``relaunch`` (until the new run's directory exists: detection, the
restart request, the start operation up to the launcher), ``session`` (until the new driver
prints ``started``), ``first_epoch`` (until its first commit: state restore and the
interrupted epoch again). ``recovery_ratio[mode]`` = that mode's recovery ÷ (its first run's
own launch-to-``started`` time, a cold start measured in the same plane, + twice the median of
the epochs before the kill). Once the restarted run has read every epoch, the branch's output
(every epoch's rows) must equal a failure-free run's, epoch by epoch (checksums).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from bench.datagen import EpochSet
from bench.timing import log

REPO_ROOT = Path(__file__).resolve().parent.parent
#: the metadata registering bench-recovery for the processes this part starts (not for users)
BENCH_ENTRY_POINTS = REPO_ROOT / "bench" / "entry_points"
APPLICATION = "bench"
JOB = "bench-main"
KILL_AFTER_COMMITS = 3
MODES = ("warm", "cold", "node_lost")
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
            # the machine's state cache, this plane's own (node_lost wipes it)
            "EPOCHAL_STATE_CACHE_DIR": str(var / "state-cache"),
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


def measure_recovery(
    work: Path,
    data: EpochSet,
    expected: list[Any],
    *,
    modes: tuple[str, ...] = MODES,
) -> dict[str, Any]:
    """Each mode in `modes` in a control plane of its own (module docstring); `expected` are
    a failure-free run's per-epoch checksums. Returns the report's ``recovery_*`` figures,
    with ``recovery_problems`` (the kill not proved mid-epoch, an output that differs, a
    warm restart that did not adopt the standby, a lost node's restart that read nothing)."""
    per_mode: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    for mode in modes:
        figures = measure_mode(work / f"recovery-{mode}", data, mode, expected)
        problems.extend(f"recovery {mode}: {p}" for p in figures.pop("problems"))
        per_mode[mode] = figures
        log(f"recovery {mode}: {json.dumps(figures)}")
    return {
        "recovery_modes": list(modes),
        "recovery_s": {m: f["recovery_s"] for m, f in per_mode.items()},
        "recovery_ratio": {m: f["recovery_ratio"] for m, f in per_mode.items()},
        "recovery_cold_start_s": {m: f["cold_start_s"] for m, f in per_mode.items()},
        "recovery_kill_mid_epoch": {m: f["kill_mid_epoch"] for m, f in per_mode.items()},
        "recovery_output_matches": {m: f["output_matches"] for m, f in per_mode.items()},
        "recovery_restore_bytes": {
            m: f["first_epoch_detail"].get("restore_bytes") for m, f in per_mode.items()
        },
        "recovery": per_mode,
        "recovery_problems": problems,
    }


def measure_mode(work: Path, data: EpochSet, mode: str, expected: list[Any]) -> dict[str, Any]:
    """One control plane: start the job, kill its driver mid-epoch, time the restart, let the
    job read every epoch and compare its output with `expected`."""
    from bench import checksum as ck
    from bench import disk
    from bench.engine import engine_checksums
    from runners.engine import read_output
    from runners.processes import group_members
    from snapshots_store import Repository

    if mode not in MODES:
        raise ValueError(f"recovery mode {mode!r}: one of {MODES}")
    standby = mode == "warm"
    var = work.resolve()
    var.mkdir(parents=True, exist_ok=True)
    plane = Plane(var)
    resources: dict[str, Any] = {"driver_memory_mb": 4096, "standby": standby}
    problems: list[str] = []
    wipe: dict[str, Any] = {}
    try:
        t0 = time.perf_counter()
        plane.manage("migrate", "--noinput", "-v", "0")
        plane.manage(
            "register", APPLICATION, "--job", "bench-recovery", "--job-name", JOB,
            "--job-args", json.dumps({"directory": str(data.directory)}),
            "--config", json.dumps({"resources": resources}),
        )  # fmt: skip
        plane.start_worker()
        log(f"recovery {mode}: control plane up in {time.perf_counter() - t0:.1f} s")
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
        time.sleep(epoch_s / 3)  # aim inside the epoch; whether it landed there is proved below
        pid = json.loads((first / "pid").read_text())["pid"]
        os.killpg(pid, signal.SIGKILL)  # the driver dies (OOM, node lost …)
        t_kill = time.perf_counter()
        _wait("the run's process group to die", lambda: not group_members(pid), 30)
        head_at_kill = head_epoch()  # nothing of the killed run can move it any more
        logged = events(first_log)
        logged_commits = [int(e["epoch"]) for e in logged if e.get("event") == "committed"]
        starts = sum(e.get("event") == "epoch_start" for e in logged)
        wiper: threading.Thread | None = None
        if mode == "node_lost":  # the machine is gone: its state cache and page cache too

            def wipe_node() -> None:
                # beside the restart (the reconciler does not wait for it), so that the
                # breakdown below observes the new run as it comes; `sync` and dropping the
                # page cache take seconds when the machine has dirty pages
                cache = Path(plane.env["EPOCHAL_STATE_CACHE_DIR"])
                wipe["state_cache_bytes"] = _tree_bytes(cache)
                shutil.rmtree(cache, ignore_errors=True)
                wipe["state_cache_wiped_at_s"] = round(time.perf_counter() - t_kill, 3)
                if any(_started(run / "output.log") for run in plane.runs()[1:]):
                    problems.append("the restarted driver started before the state cache was wiped")
                store_files = [f for f in (var / "store").rglob("*") if f.is_file()]
                wipe["page_cache_drop"] = disk.drop_page_cache(store_files)
                wipe["page_cache_dropped_at_s"] = round(time.perf_counter() - t_kill, 3)

            wiper = threading.Thread(target=wipe_node, name="node-lost-wipe")
            wiper.start()
        second = _wait("the restart's run", lambda: next(iter(plane.runs()[1:]), None))
        t_launch = time.perf_counter()
        second_log = second / "output.log"
        _wait("the restart's started event", lambda: _started(second_log))
        t_started = time.perf_counter()
        if wiper is not None:
            wiper.join()
        _wait("the first commit after the restart", lambda: head_epoch() > head_at_kill, 900)
        t_commit = time.perf_counter()
        first_commit = _wait(
            "the restart's committed event",
            lambda: next((e for e in events(second_log) if e.get("event") == "committed"), None),
            60,
        )
        restarted = next(e for e in events(second_log) if e.get("event") == "started")
        stats = repo.read_manifest(str(first_commit["snapshot_id"])).stats
        # the proof: an epoch had started and not committed when the group died, and the
        # restarted run's first commit is that epoch
        interrupted = head_at_kill + 1
        mid_epoch = (
            starts > len(logged_commits)
            and bool(logged_commits)
            and logged_commits[-1] == head_at_kill
            and int(first_commit["epoch"]) == interrupted
        )
        if not mid_epoch:
            problems.append(
                f"the kill was not proved inside an epoch: {starts} epoch starts, commits "
                f"{logged_commits[-3:]}, head {head_at_kill} after the kill, the restart's "
                f"first commit {first_commit['epoch']}"
            )
        _wait("the job to read every epoch", lambda: head_epoch() >= data.epochs, 900)
        ended = _exit_status(second)  # the job follows its source: it runs on, or ended well
        if ended is not None and ended.get("returncode") != 0:
            problems.append(f"the restarted run ended with {ended}")
        got = engine_checksums(read_output(repo, "main"), data.epochs)
        mismatches = ck.compare(f"recovery {mode}", got, expected, "the failure-free run")
        problems.extend(mismatches)
        adopted = bool(restarted.get("standby"))
        if standby and not adopted:
            problems.append("the restart did not adopt the warm standby")
        if mode == "node_lost" and not stats.get("restore_bytes"):
            problems.append("the restart after the lost node restored nothing from the store")
    finally:
        plane.close()
    recovery_s = t_commit - t_kill
    baseline = session_s + 2 * epoch_s
    first_started = next(e for e in events(first_log) if e.get("event") == "started")
    return {
        "recovery_s": round(recovery_s, 3),
        "recovery_ratio": round(recovery_s / baseline, 3) if baseline > 0 else None,
        # the first run's launch -> `started`: a cold start in this plane, the baseline's
        "cold_start_s": round(session_s, 3),
        "epoch_s": round(epoch_s, 3),
        "kill_mid_epoch": mid_epoch,
        "interrupted_epoch": interrupted,
        "head_at_kill": head_at_kill,
        "output_matches": not mismatches,
        "epochs": data.epochs,
        # the job's resources.standby, and whether the restart took the standby over
        "standby": standby,
        "standby_adopted": adopted,
        "breakdown_s": {
            # kill -> the new run's directory: detection, restart request, start operation
            "relaunch": round(t_launch - t_kill, 3),
            # -> the new driver's `started`: interpreter, imports, JVM, SparkSession (a
            # standby has them already: loading the job and the store only)
            "session": round(t_started - t_launch, 3),
            # -> its first commit: state restore and the interrupted epoch run again
            "first_epoch": round(t_commit - t_started, 3),
        },
        # the restarted run's first commit, from its manifest: the restore stage and the
        # stored bytes it read from the store (0 when the machine's state cache had every
        # key group), the epoch's Spark job, the driver's whole epoch before the commit
        "first_epoch_detail": {
            k: stats[k]
            for k in ("restore_s", "restore_bytes", "restore_span_s", "tasks_wall_s", "process_s")
            if k in stats
        },
        # inside the driver processes: loading the job and store, the SparkSession
        "startup_s": {
            "first": {k: first_started.get(k) for k in ("load_s", "session_s")},
            "restart": {k: restarted.get(k) for k in ("load_s", "session_s")},
        },
        "standby_warm_s": standby_ready,
        "node_lost_wipe": wipe or None,
        "problems": problems,
    }


def _tree_bytes(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file()) if root.exists() else 0


def _exit_status(run: Path) -> dict[str, Any] | None:
    with contextlib.suppress(OSError, ValueError):
        status: dict[str, Any] = json.loads((run / "exit.json").read_text())
        return status
    return None


def _started(log_path: Path) -> bool:
    return any(e.get("event") == "started" for e in events(log_path))
