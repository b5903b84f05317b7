"""Fixtures for launcher tests: a file store and job specs whose job is tests.runners.sample_job."""

from __future__ import annotations

from pathlib import Path

import pytest

from runners.job_spec import JobSpec


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"file://{tmp_path / 'store'}"


@pytest.fixture
def make_spec(store_url: str):  # type: ignore[no-untyped-def]
    def make(behaviour: str = "epochs", **changes: object) -> JobSpec:
        values: dict[str, object] = {
            "application": "Orders App",
            "namespace": "orders",
            "branch": "main",
            "store_url": store_url,
            "job": f"sample-{behaviour}",
            "parallelism": 2,
        }
        values.update(changes)
        return JobSpec(**values)  # type: ignore[arg-type]

    return make
