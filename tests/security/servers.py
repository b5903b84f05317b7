"""Real servers and commands for the security tests: `manage.py` and the web server (granian,
as the Helm chart runs it) as subprocesses, configured only by the environment they are given
(nothing inherited from the test run)."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


SERVER = "granian"
"""The web server of the Helm chart (helm/epochal/templates/web.yaml) and the image
(docker/Dockerfile); `bench.api --server` can also run gunicorn, for comparison."""


HEADER_READ_TIMEOUT_MS = 10_000
"""The chart's `web.headerReadTimeoutMs`: a connection whose request headers take longer is
dropped (granian reads headers in Rust, on no Python thread)."""


def web_command(port: int, *, workers: int = 1, threads: int = 8) -> list[str]:
    """The chart's web command on a loopback port: `workers` processes, each running the
    application on up to `threads` Python threads; a worker that dies is started again,
    and a server whose workers die at start (unsafe settings) exits."""
    return [
        sys.executable,
        "-m",
        "granian",
        "--interface=wsgi",
        "controlplane.wsgi:application",
        "--host=127.0.0.1",
        f"--port={port}",
        f"--workers={workers}",
        f"--blocking-threads={threads}",
        "--backpressure=512",
        f"--http1-header-read-timeout={HEADER_READ_TIMEOUT_MS}",
        "--respawn-failed-workers",
        "--no-ws",
    ]


@contextmanager
def web_server(env: Mapping[str, str], *, workers: int = 1, threads: int = 8) -> Iterator[str]:
    """`web_command` serving with `env`; yields its base URL. The server's output goes to a
    file (a pipe nobody reads would fill and stop it)."""
    port = free_port()
    with tempfile.TemporaryFile(mode="w+") as output:
        process = subprocess.Popen(
            web_command(port, workers=workers, threads=threads),
            cwd=PROJECT_ROOT,
            env=dict(env),
            stdout=output,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 120
            while True:
                if process.poll() is not None:
                    output.seek(0)
                    raise AssertionError(f"{SERVER} exited:\n{output.read()}")
                try:
                    # Django loads in each worker before it serves: slow on a busy machine.
                    requests.get(f"{url}/healthz", timeout=30, allow_redirects=False)
                    break
                except (requests.ConnectionError, requests.Timeout):
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            yield url
        finally:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
