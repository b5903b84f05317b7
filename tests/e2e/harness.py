"""A whole control plane in subprocesses for end-to-end tests.

The test process owns the (PostgreSQL) test database; Celery workers (with embedded beat, i.e.
the reconciler) and `manage.py` commands run as subprocesses configured only by environment
variables — exactly like a deployment — against the same database, a private Redis database
as broker, a store and a runs directory under the test's tmp dir. Jobs are real PySpark
runs of the example clickstream job launched by the local launcher.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa

from runners.local import group_members
from snapshots_store import Manifest, Repository
from tests.conftest import SUBPROCESS_PYTHONPATH

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "clicks"
T = TypeVar("T")


def wait_for(condition: Callable[[], T | None], *, timeout: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.3)


def database_url() -> str:
    from django.db import connection

    s = connection.settings_dict
    user = s.get("USER") or "root"
    host = s.get("HOST") or "127.0.0.1"
    port = s.get("PORT") or 5432
    return f"postgres://{user}@{host}:{port}/{s['NAME']}"


class ControlPlane:
    def __init__(self, tmp: Path, redis_url: str, *, lease_s: float = 4.0) -> None:
        self.tmp = tmp
        self.store_url = f"file://{tmp / 'store'}"
        self.input_dir = tmp / "input"
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("EPOCHAL_")},
            "DJANGO_SETTINGS_MODULE": "controlplane.settings",
            "DATABASE_URL": database_url(),
            "CELERY_BROKER_URL": redis_url,
            "EPOCHAL_VAR_DIR": str(tmp / "var"),
            "STORE_URL": self.store_url,
            "EPOCHAL_STORE_ROOTS": str(tmp),
            "RUNNER": "local",
            "EPOCHAL_OPERATION_LEASE_S": str(lease_s),
            "EPOCHAL_RECONCILE_INTERVAL_S": "1",
            "PYTHONPATH": SUBPROCESS_PYTHONPATH,
            "PYTHONUNBUFFERED": "1",
        }
        self.workers: list[subprocess.Popen[bytes]] = []
        self._logs = 0

    # -- processes ----------------------------------------------------------------------------

    def manage(self, *args: str, timeout: float = 600, check: bool = True) -> str:
        return self._command(
            [sys.executable, str(ROOT / "manage.py")],
            args,
            self.env,
            ROOT,
            timeout=timeout,
            check=check,
        )

    def epochal(self, *args: str, timeout: float = 600, check: bool = True) -> str:
        """`.venv/bin/epochal ARGS` as a user runs it: from another directory, no PYTHONPATH."""
        env = {
            k: v for k, v in self.env.items() if k not in ("PYTHONPATH", "DJANGO_SETTINGS_MODULE")
        }
        return self._command(
            [str(ROOT / ".venv" / "bin" / "epochal")],
            args,
            env,
            self.tmp,
            timeout=timeout,
            check=check,
        )

    @staticmethod
    def _command(
        command: list[str],
        args: tuple[str, ...],
        env: dict[str, str],
        cwd: Path,
        *,
        timeout: float,
        check: bool,
    ) -> str:
        proc = subprocess.run(
            [*command, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
        )
        out = proc.stdout + proc.stderr
        if check and proc.returncode != 0:
            name = Path(command[-1]).name
            raise AssertionError(f"{name} {' '.join(args)} exited {proc.returncode}:\n{out}")
        return out

    def start_worker(self, *, crash_at: str | None = None) -> subprocess.Popen[bytes]:
        env = dict(self.env)
        if crash_at:
            env["EPOCHAL_OPERATION_CRASH_AT"] = crash_at
        self._logs += 1
        log = open(self.tmp / f"worker-{self._logs}.log", "wb")  # noqa: SIM115
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "controlplane",
                "worker",
                "-B",
                "--pool=solo",
                "--loglevel=INFO",
                "-n",
                f"e2e-{self._logs}@%h",
                "-s",
                str(self.tmp / f"beat-{self._logs}"),
            ],
            env=env,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.workers.append(worker)
        return worker

    def kill_worker(self, worker: subprocess.Popen[bytes]) -> None:
        """SIGKILL the worker and everything in its process group (its beat)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(timeout=30)
        wait_for(lambda: not group_members(worker.pid), timeout=30, what="worker group to die")

    def stop_workers(self) -> None:
        for worker in self.workers:
            if worker.poll() is None:
                try:
                    os.killpg(worker.pid, signal.SIGTERM)
                    worker.wait(timeout=20)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    self.kill_worker(worker)
        self.workers.clear()

    def worker_log(self) -> str:
        return "\n".join(
            p.read_text(errors="replace")[-4000:] for p in sorted(self.tmp.glob("worker-*.log"))
        )

    # -- the job ------------------------------------------------------------------------------

    def add_input(self, files: int, clicks: int = 600) -> None:
        from runners.jobs import clickstream

        clickstream.generate(str(self.input_dir), files=files, clicks=clicks, users=60)

    def input_records(self) -> int:
        return (
            sum(sum(1 for _ in p.open()) for p in self.input_dir.iterdir() if p.suffix == ".jsonl")
            if self.input_dir.exists()
            else 0
        )

    def register(self, job: str = "clicks-main", parallelism: int = 2) -> None:
        self.manage(
            "register",
            NAMESPACE,
            "--job",
            "clickstream",
            "--job-args",
            json.dumps({"directory": str(self.input_dir)}),
            "--job-name",
            job,
            "--parallelism",
            str(parallelism),
        )

    def repo(self, store_url: str | None = None) -> Repository:
        return Repository.open(store_url or self.store_url, NAMESPACE)

    def head(self, branch: str = "main", store_url: str | None = None) -> tuple[str, Manifest]:
        repo = self.repo(store_url)
        ref = repo.read_ref(f"heads/{branch}")
        assert ref is not None, f"branch {branch} has no head"
        return ref.target, repo.read_manifest(ref.target)

    def wait_caught_up(
        self, branch: str = "main", *, store_url: str | None = None, timeout: float = 240
    ) -> str:
        """Wait until the branch has consumed every input record; its head id."""
        total = self.input_records()

        def done() -> str | None:
            repo = self.repo(store_url)
            ref = repo.read_ref(f"heads/{branch}")
            if ref is None:
                return None
            return ref.target if _consumed(repo, branch) >= total else None

        return wait_for(done, timeout=timeout, what=f"{branch} to consume {total} records")


def _consumed(repo: Repository, branch: str) -> int:
    """Records on the branch's first-parent chain (epoch stats), i.e. input consumed."""
    total = 0
    for _sid, manifest in repo.log(f"heads/{branch}", first_parent=True):
        total += int(manifest.stats.get("records_in", 0)) + int(
            manifest.stats.get("dead_letters", 0)
        )
    return total


def output_rows(table: pa.Table) -> list[tuple[Any, ...]]:
    """Rows without the epoch column, sorted: epoch boundaries do not change the results."""
    names = [n for n in table.column_names if n != "_epoch"]
    return sorted(tuple(row[n] for n in names) for row in table.select(names).to_pylist())
