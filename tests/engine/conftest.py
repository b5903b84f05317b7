"""Fixtures of the engine tests: small Parquet epochs and fresh repositories."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from snapshots_store import Repository
from tests.engine.jobs import write_epochs
from tests.engine.windows_data import Layout, write_event_files

_counter = itertools.count()


@pytest.fixture(scope="session")
def epochs_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """6 epochs x 2,000 records over 400 keys (shared, read-only)."""
    directory = tmp_path_factory.mktemp("epochs") / "in"
    write_epochs(str(directory), files=6, keys=400, records=2000)
    return str(directory)


@pytest.fixture(scope="session")
def event_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The event-time epochs of tests/engine/windows_data.py (out of order, some late; shared,
    read-only)."""
    directory = tmp_path_factory.mktemp("events") / "in"
    write_event_files(str(directory), Layout(), row_group_size=100)
    return str(directory)


@pytest.fixture
def repo(tmp_path: Path) -> Repository:
    return Repository.open(f"file://{tmp_path}/store", f"app{next(_counter)}")


@pytest.fixture
def sink_tables() -> Iterator[list[str]]:
    """PostgreSQL tables a sink test creates (append their names): dropped after it, with
    their sink marks."""
    from tests.engine.destination_checks import drop_table

    made: list[str] = []
    yield made
    for table in made:
        drop_table(table)
