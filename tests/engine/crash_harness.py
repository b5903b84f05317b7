"""Crash harness: run the job entry point as a subprocess, SIGKILL it at named points of the
commit protocol (EPOCHAL_CRASH_AT) or at random moments, restart it, and report what it did."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from tests.engine.jobs import DATA_ENV

ROOT = Path(__file__).resolve().parents[2]
JOB = "tests.engine.jobs:crash_job"


@dataclass
class Run:
    returncode: int
    events: list[dict[str, object]] = field(default_factory=list)

    @property
    def killed(self) -> bool:
        return self.returncode in (-signal.SIGKILL, 137)

    @property
    def committed(self) -> list[int]:
        return [int(e["epoch"]) for e in self.events if e.get("event") == "committed"]  # type: ignore[call-overload]


def run_job(
    *,
    store: str,
    namespace: str,
    data: str,
    parallelism: int = 2,
    crash_at: str | None = None,
    kill_after_epoch_start: tuple[int, float] | None = None,
    timeout: float = 240,
    job: str = JOB,
    extra_env: dict[str, str] | None = None,
) -> Run:
    """One job process; `kill_after_epoch_start=(n, delay)` SIGKILLs its process group `delay`
    seconds after it announces the start of its n-th epoch."""
    env = {**os.environ, DATA_ENV: data, "PYTHONPATH": str(ROOT), "SPARK_LOCAL_IP": "127.0.0.1",
           **(extra_env or {})}  # fmt: skip
    env.pop("EPOCHAL_CRASH_AT", None)
    if crash_at:
        env["EPOCHAL_CRASH_AT"] = crash_at
    cmd = [
        sys.executable, "-m", "runners.engine.main", "--job", job, "--store", store,
        "--namespace", namespace, "--branch", "main", "--parallelism", str(parallelism),
        "--master", f"local[{min(parallelism, 2)}]",
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        start_new_session=True,
    )  # fmt: skip

    def kill_group() -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)

    watchdog = threading.Timer(timeout, kill_group)
    watchdog.start()
    events: list[dict[str, object]] = []
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            events.append(event)
            if (
                kill_after_epoch_start is not None
                and event.get("event") == "epoch_start"
                and event.get("n") == kill_after_epoch_start[0]
            ):
                threading.Timer(kill_after_epoch_start[1], kill_group).start()
        returncode = proc.wait()
    finally:
        watchdog.cancel()
        kill_group()  # the JVM and Python workers of a killed driver go too
    return Run(returncode, events)


def random_kills(count: int, seed: int) -> list[tuple[int, float]]:
    rng = random.Random(seed)
    return [(rng.randint(1, 2), round(rng.uniform(0.0, 1.5), 3)) for _ in range(count)]
