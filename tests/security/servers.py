"""Real servers and commands for the security tests: `manage.py` and gunicorn as subprocesses,
configured only by the environment they are given (nothing inherited from the test run)."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import requests

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def clean_env(var_dir: Path, **overrides: str) -> dict[str, str]:
    """A production process's environment: no DJANGO_*, no EPOCHAL_* from the test run."""
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "SPARK_LOCAL_IP")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env.update(
        DJANGO_SETTINGS_MODULE="controlplane.settings",
        EPOCHAL_VAR_DIR=str(var_dir),
        DATABASE_URL=f"sqlite:///{var_dir / 'db.sqlite3'}",
    )
    env.update(overrides)
    return env


def new_secret_key() -> str:
    return secrets.token_urlsafe(50)


def manage(env: Mapping[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=PROJECT_ROOT,
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def gunicorn(env: Mapping[str, str], *, workers: int = 1) -> Iterator[str]:
    """`gunicorn controlplane.wsgi` as the Helm chart runs it; yields its base URL."""
    port = _free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "controlplane.wsgi",
            f"--bind=127.0.0.1:{port}",
            f"--workers={workers}",
        ],
        cwd=PROJECT_ROOT,
        env=dict(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None:
                raise AssertionError(f"gunicorn exited:\n{process.stdout.read()}")  # type: ignore[union-attr]
            try:
                # The first request loads Django in the worker: slow on a busy machine.
                requests.get(f"{url}/healthz", timeout=30, allow_redirects=False)
                break
            except (requests.ConnectionError, requests.Timeout):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
