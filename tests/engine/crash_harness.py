"""Crash harness: run the job entry point as a subprocess, SIGKILL it at named points of the
commit protocol (EPOCHAL_CRASH_AT) or at random moments inside an epoch, or SIGKILL one of its
Python workers mid-epoch; restart it, and report what it did and whether the kill landed inside
an epoch (proved from its events and the branch head after the run)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from runners.engine.state.restore import load_key_group
from snapshots_store import Repository
from tests.conftest import FAST_START_SUBMIT_ARGS, SUBPROCESS_PYTHONPATH
from tests.engine.jobs import DATA_ENV, SLOW_ENV

ROOT = Path(__file__).resolve().parents[2]
JOB = "crash-job"


@dataclass
class Run:
    returncode: int
    events: list[dict[str, object]] = field(default_factory=list)
    base_epoch: int = 0  # the branch head's epoch when the run started
    head_epoch: int = 0  # ... and after it ended
    worker_killed: int | None = None  # pid of the Python worker SIGKILLed, if any

    @property
    def killed(self) -> bool:
        return self.returncode in (-signal.SIGKILL, 137)

    @property
    def committed(self) -> list[int]:
        return [int(e["epoch"]) for e in self.events if e.get("event") == "committed"]  # type: ignore[call-overload]

    @property
    def started_epochs(self) -> int:
        """How many epochs the run announced (`epoch_start` events)."""
        return sum(1 for e in self.events if e.get("event") == "epoch_start")

    @property
    def interrupted_epoch(self) -> int | None:
        """The epoch a kill interrupted, or None when the kill did not land inside one.

        Inside = after the run announced the epoch's start (its last event) and before the
        epoch's commit reached the branch head (the head after the run is the epoch before).
        """
        if not self.events or self.events[-1].get("event") != "epoch_start":
            return None
        epoch = self.base_epoch + self.started_epochs
        return epoch if self.head_epoch == epoch - 1 else None


def branch_state(repo: Repository, branch: str = "main") -> pd.DataFrame:
    """Every key's state at the branch head, read from the store (no cache), sorted by key."""
    manifest = repo.read_manifest(repo.resolve(branch))
    frames = [
        load_key_group(repo, chain, ("key",), use_cache=False).table.to_pandas()
        for chain in manifest.key_groups.values()
    ]
    return pd.concat(frames).sort_values("key").reset_index(drop=True)


def head_epoch(store: str, namespace: str) -> int:
    repo = Repository.open(store, namespace)
    head = repo.read_ref("heads/main")
    return 0 if head is None else repo.read_manifest(head.target).epoch


def _parents() -> dict[int, int]:
    """pid -> parent pid of every live process (Linux /proc)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat[stat.rindex(")") + 2 :].split()[1])
    return parents


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def python_workers(root: int) -> list[int]:
    """The forked PySpark Python workers under process `root` (children of the PySpark daemon,
    which runs in a process group of its own under the driver's JVM)."""
    parents = _parents()

    def descends(pid: int) -> bool:
        while pid > 1:
            pid = parents.get(pid, 0)
            if pid == root:
                return True
        return False

    return [
        pid
        for pid, parent in parents.items()
        if "pyspark.daemon" in _cmdline(pid)
        and "pyspark.daemon" in _cmdline(parent)
        and descends(pid)
    ]


def run_job(
    *,
    store: str,
    namespace: str,
    data: str,
    parallelism: int = 2,
    crash_at: str | None = None,
    kill_after_epoch_start: tuple[int, float] | None = None,
    kill_worker_after_epoch_start: tuple[int, float] | None = None,
    slow_s: float = 0.0,
    timeout: float = 240,
    job: str = JOB,
    extra_env: dict[str, str] | None = None,
    master: str | None = None,
    submit_args: str = FAST_START_SUBMIT_ARGS,
    after_epoch_start: tuple[int, float, Callable[[], object]] | None = None,
    max_epochs: int | None = None,
    after_second_epoch_start: tuple[int, float, Callable[[], object]] | None = None,
    args: list[str] | None = None,
) -> Run:
    """One job process. `kill_after_epoch_start=(n, delay)` SIGKILLs its process group `delay`
    seconds after it announces the start of its n-th epoch; `kill_worker_after_epoch_start`
    SIGKILLs one Python worker instead; `after_epoch_start=(n, delay, action)` calls `action`
    then (e.g. kills an executor of a cluster). `slow_s`: extra seconds per split read.
    `args`: further arguments of the entry point (e.g. ``--sinks``).
    `master` defaults to `local[min(parallelism, 2)]`."""
    env = {**os.environ, DATA_ENV: data, "PYTHONPATH": SUBPROCESS_PYTHONPATH,
           "SPARK_LOCAL_IP": "127.0.0.1", **(extra_env or {})}  # fmt: skip
    env["PYSPARK_SUBMIT_ARGS"] = submit_args  # short test jobs: quick JVM start
    env.pop("EPOCHAL_CRASH_AT", None)
    env[SLOW_ENV] = str(slow_s)
    if crash_at:
        env["EPOCHAL_CRASH_AT"] = crash_at
    base = head_epoch(store, namespace)
    cmd = [
        sys.executable, "-m", "runners.engine.main", "--job", job, "--store", store,
        "--namespace", namespace, "--branch", "main", "--parallelism", str(parallelism),
        "--master", master or f"local[{min(parallelism, 2)}]",
    ]  # fmt: skip
    if max_epochs is not None:
        cmd += ["--max-epochs", str(max_epochs)]
    cmd += args or []
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        start_new_session=True,
    )  # fmt: skip
    killed_worker: list[int] = []

    def kill_group() -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)

    def kill_worker() -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and proc.poll() is None:
            workers = python_workers(proc.pid)
            if workers:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(workers[0], signal.SIGKILL)
                    killed_worker.append(workers[0])
                return
            time.sleep(0.05)

    watchdog = threading.Timer(timeout, kill_group)
    watchdog.start()
    timers: list[threading.Timer] = []
    events: list[dict[str, object]] = []
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            events.append(event)
            if event.get("event") != "epoch_start":
                continue
            for spec, action in (
                (kill_after_epoch_start, kill_group),
                (kill_worker_after_epoch_start, kill_worker),
                (after_epoch_start[:2] if after_epoch_start else None, _later(after_epoch_start)),
                (
                    after_second_epoch_start[:2] if after_second_epoch_start else None,
                    _later(after_second_epoch_start),
                ),
            ):
                if spec is not None and event.get("n") == spec[0]:
                    timers.append(threading.Timer(spec[1], action))
                    timers[-1].start()
        returncode = proc.wait()
    finally:
        watchdog.cancel()
        for timer in timers:
            timer.cancel()
            with contextlib.suppress(RuntimeError):
                timer.join()
        kill_group()  # the JVM and Python workers of a killed driver go too
    return Run(
        returncode,
        events,
        base_epoch=base,
        head_epoch=head_epoch(store, namespace),
        worker_killed=killed_worker[0] if killed_worker else None,
    )


def _later(planned: tuple[int, float, Callable[[], object]] | None) -> Callable[[], None]:
    def act() -> None:
        if planned is not None:
            planned[2]()

    return act


def random_kills(count: int, seed: int) -> list[tuple[int, float]]:
    """(n, fraction): kill in the run's n-th epoch, `fraction` of the way through its reads."""
    rng = random.Random(seed)
    return [(rng.randint(1, 2), round(rng.uniform(0.05, 0.8), 3)) for _ in range(count)]
