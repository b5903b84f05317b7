"""What the code-and-places attack tests share: a real Celery worker on the test database (so
an accepted attack would run), a canary file, a socket listener that records every connection,
a fingerprint of a store's files, and checks of the audit log."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.conftest import SUBPROCESS_PYTHONPATH

ROOT = Path(__file__).resolve().parents[2]


def call(
    base: str, token: str, method: str, path: str, body: dict[str, Any] | None = None
) -> requests.Response:
    return requests.request(
        method,
        f"{base}{path}",
        json=body,
        headers={"Authorization": f"Token {token}", "Connection": "close"},
        timeout=120,
    )


@dataclass
class Listener:
    """A TCP listener an attacker would point an endpoint at; records every connection."""

    sock: socket.socket
    connections: list[tuple[str, int]] = field(default_factory=list)

    @property
    def url(self) -> str:
        host, port = self.sock.getsockname()[:2]
        return f"http://{host}:{port}"

    def serve(self) -> None:
        while True:
            try:
                conn, address = self.sock.accept()
            except OSError:
                return
            self.connections.append(address)
            conn.close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    found = Listener(sock)
    thread = threading.Thread(target=found.serve, daemon=True)
    thread.start()
    yield found
    sock.close()
    thread.join(timeout=5)


def store_files(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under `root` with its size and mtime: equal before and after = untouched."""
    if not root.exists():
        return {}
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def refusals(path: str, status: int, field_name: str) -> list[Any]:
    """Audit entries of refused requests to `path` with `status` that name `field_name`."""
    from controlplane.audit.models import AuditEntry

    def names(fields: list[str]) -> bool:
        return any(f == field_name or f.startswith(f"{field_name}.") for f in fields)

    entries = AuditEntry.objects.filter(target=path, status_code=status)
    return [e for e in entries if names(e.detail.get("fields", []))]


def database_url() -> str:
    from django.db import connection

    s = connection.settings_dict
    user = s.get("USER") or "root"
    host = s.get("HOST") or "127.0.0.1"
    port = s.get("PORT") or 5432
    return f"postgres://{user}@{host}:{port}/{s['NAME']}"


@dataclass
class Worker:
    """A Celery worker process serving the live server's operations."""

    process: subprocess.Popen[bytes]
    log: Path

    def wait_for(self, operation_id: str, timeout: float = 120) -> Any:
        """The operation once the worker has ended it (an accepted operation really runs)."""
        from controlplane.operations.models import TERMINAL_STATES, Operation

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            op = Operation.objects.get(pk=operation_id)
            if op.state in TERMINAL_STATES:
                return op
            if self.process.poll() is not None:
                raise AssertionError(f"the worker exited:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.3)
        raise AssertionError(
            f"operation {operation_id} not ended in {timeout} s:\n{self.log.read_text()[-3000:]}"
        )


@pytest.fixture
def worker_env() -> dict[str, str | None]:
    """Changes to the worker's environment (None: unset); a test module overrides it."""
    return {}


@pytest.fixture
def worker(
    postgresql_db: None,
    redis_url: str,
    store_url: str,
    tmp_path: Path,
    live_server: Any,
    worker_env: dict[str, str | None],
) -> Iterator[Worker]:
    """A real Celery worker on the test database and the test run's broker."""
    broker = os.environ.get("CELERY_BROKER_URL", "")
    if not broker.startswith("redis://"):
        broker = redis_url
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("EPOCHAL_")},
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": database_url(),
        "CELERY_BROKER_URL": broker,
        "CELERY_TASK_ALWAYS_EAGER": "false",
        "EPOCHAL_VAR_DIR": str(tmp_path / "worker-var"),
        "STORE_URL": store_url,
        "RUNNER": "local",
        "PYTHONPATH": SUBPROCESS_PYTHONPATH,
        "PYTHONUNBUFFERED": "1",
    }
    for name, value in worker_env.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "controlplane", "worker", "--pool=solo",
             "--loglevel=INFO", "-n", f"security-{os.getpid()}@%h"],
            env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        yield Worker(process, log)
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
