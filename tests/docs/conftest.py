"""A demo control plane for the doc examples, prepared once per test session.

`manage.py demo` on the embedded default under a temporary directory (the README's first
command, with two small input batches), serving on a free port: the Celery worker with the
reconciler, the example job `clickstream-main` running on Spark, the REST API and the
dashboard. The examples see it through the variables a reader's shell would have after the
demo: `E` (the server) and the demo's `DATABASE_URL`, `STORE_URL`, `EPOCHAL_VAR_DIR`."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.demo_process import Demo


@dataclass
class DocsPlane:
    demo: Demo
    env: dict[str, str]
    tmp: Path


@pytest.fixture(scope="session")
def docs_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DocsPlane]:
    tmp = tmp_path_factory.mktemp("docs")
    demo = Demo(tmp / "var", "--input-batches", "2", "--records", "300", "--feed-every", "0")
    try:
        demo.wait_serving()
        yield DocsPlane(demo, {**demo.env, "E": demo.url}, tmp)
    finally:
        try:
            if demo.proc.poll() is None:
                demo.signal(signal.SIGTERM)  # stops the job and the worker (test_demo_signals)
        finally:
            demo.kill_everything()
