"""Fixtures for the lineage-index tests."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from controlplane.applications.models import Application
from controlplane.applications.services import application_create
from snapshots_store import Repository


@pytest.fixture
def application(db: None) -> Application:
    return application_create(name=f"app-{uuid.uuid4().hex[:8]}")


@pytest.fixture
def repo(tmp_path: Path, application: Application) -> Repository:
    return Repository.open(f"file://{tmp_path / 'store'}", application.store_namespace)
