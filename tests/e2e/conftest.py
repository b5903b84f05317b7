"""Fixtures of the end-to-end tests: PostgreSQL, Redis, a control plane in subprocesses."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require_service
from tests.e2e.harness import ControlPlane

#: the Redis database the e2e brokers use (flushed per test): one per checkout running tests
E2E_REDIS_DB = int(os.environ.get("EPOCHAL_E2E_REDIS_DB", "5"))


@pytest.fixture
def control_plane(tmp_path: Path, transactional_db: Any, redis_url: str) -> Iterator[ControlPlane]:
    from django.db import connection

    require_service(
        "PostgreSQL",
        connection.vendor == "postgresql",
        "end-to-end tests need PostgreSQL: run `bin/services up` (see the README)",
    )
    import redis

    base = redis_url.rsplit("/", 1)[0]
    url = f"{base}/{E2E_REDIS_DB}"
    redis.Redis.from_url(url).flushdb()  # no messages left over from an earlier run
    plane = ControlPlane(tmp_path, url)
    try:
        yield plane
    finally:
        plane.stop_workers()
        plane.manage("jobs", check=False)
        _stop_runs(plane)


def _stop_runs(plane: ControlPlane) -> None:
    """Kill every job run the test left behind (their process groups)."""
    import os
    import signal

    from runners.local import group_members

    runs = plane.tmp / "var" / "runs"
    if not runs.exists():
        return
    for pid_file in runs.glob("*/pid"):
        try:
            import json

            pid = json.loads(pid_file.read_text())["pid"]
            os.killpg(pid, signal.SIGKILL)
        except (OSError, ValueError, KeyError):
            continue
        for _ in range(50):
            if not group_members(pid):
                break
            import time

            time.sleep(0.1)
