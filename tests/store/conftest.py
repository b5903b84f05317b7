"""Fixtures of the store suite: real repositories on a temp directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from snapshots_store import Repository


@pytest.fixture
def local_root(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def store_url(local_root: Path) -> str:
    return local_root.as_uri()


@pytest.fixture
def repo(store_url: str) -> Repository:
    return Repository.open(store_url, "app")
