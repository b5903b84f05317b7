"""Fixtures of the dashboard tests: a user per role, and a real store with a small lineage whose
commits carry real key-group state chunks (so the heat map and "state of key K" read real
state), indexed into the database, with an application version and a job."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from django.test import Client

from controlplane.accounts.roles import ADMIN, OPERATOR, VIEWER
from controlplane.accounts.services import user_create
from controlplane.applications.models import Application, ApplicationVersion
from controlplane.applications.services import application_create, version_create
from controlplane.jobs.models import Job
from controlplane.jobs.services import job_create
from controlplane.lineage.services import reindex_application
from runners.engine.keygroups import key_group_of
from runners.engine.state import codec
from snapshots_store import Manifest, Repository
from tests.api.conftest import fast_password_hashing, store_url  # noqa: F401  (fixtures)

M = 8
USERS = [f"user-{i}" for i in range(12)]
PASSWORD = "pw-dashboard-1"


@dataclass
class Lineage:
    application: Application
    version: ApplicationVersion
    job: Job
    repo: Repository
    input_dir: Path
    main: list[str] = field(default_factory=list)  # snapshot ids on main, oldest first
    fork: list[str] = field(default_factory=list)


@pytest.fixture
def users(db: None) -> dict[str, Any]:
    """role -> a user with that role (usernames are the role names)."""
    return {
        role: user_create(username=role, role=role, password=PASSWORD)
        for role in (VIEWER, OPERATOR, ADMIN)
    }


@pytest.fixture
def client_for(users: dict[str, Any]) -> Callable[[str | None], Client]:
    """A test client logged in as the user of `role` (None: anonymous)."""

    def make(role: str | None) -> Client:
        client = Client()
        if role is not None:
            client.force_login(users[role])
        return client

    return make


def _state(epoch: int, branch: str) -> dict[int, pa.Table]:
    """Per key group: every user's click count after `epoch` on `branch`."""
    groups: dict[int, list[tuple[str, int]]] = {}
    for i, user in enumerate(USERS):
        clicks = (epoch + 1) * (i + 1) + (100 if branch != "main" else 0)
        groups.setdefault(key_group_of(user, M), []).append((user, clicks))
    return {
        g: pa.table({"user": [u for u, _ in rows], "clicks": [c for _, c in rows]})
        for g, rows in groups.items()
    }


def commit(
    repo: Repository,
    branch: str,
    parent: str | None,
    epoch: int,
    *,
    head: str | None = None,
    parallelism: int = 2,
    **fields: Any,
) -> str:
    """Commit epoch `epoch` on `branch` after `parent`: a base chunk per key group."""
    key_groups = {
        g: (repo.put_object("chunk", codec.encode_table(codec.with_deleted(table))),)
        for g, table in _state(epoch, branch).items()
    }
    manifest = Manifest(
        branch=branch,
        epoch=epoch,
        parents=(parent,) if parent else (),
        max_parallelism=M,
        parallelism=parallelism,
        kind=fields.pop("kind", "epoch" if parent else "initial"),
        offsets={"files": {"clicks-00000.jsonl": 100 * (epoch + 1)}},
        key_groups=key_groups,
        stats={
            "records_in": 150 + epoch,
            "output_rows": 10 + epoch,
            "dead_letters": epoch % 2,
            "bytes_written": 2048 * (epoch + 1),
            "changed_state_bytes": 512 * (epoch + 1),
            "process_s": 0.5 + 0.1 * epoch,
        },
        extra={"key": ["user"], "job": "clickstream-sessions"},
        **fields,
    )
    expected = parent if head is None else (head or None)
    return repo.commit(manifest, branch, expected_head=expected, reason=f"epoch {epoch}")


def build_lineage(tmp_path: Path, name: str = "clicks") -> Lineage:
    """Application `name` (M=8), version 1 of the example job reading `tmp_path/input`, job
    `<name>-main` on main: 6 commits (the fifth a rescale to p=3), a savepoint tag at the third,
    branch `exp` forked from the second with 2 commits."""
    input_dir = tmp_path / "input"
    input_dir.mkdir()
    (input_dir / "clicks-00000.jsonl").write_bytes(b"x" * 999 + b"\n")
    application = application_create(name=name, max_parallelism=M)
    version = version_create(
        application=application,
        job="clickstream",
        code_version="v1",
        config={"job_args": {"directory": str(input_dir)}},
    )
    job = job_create(name=f"{name}-main", application=application, version=version)
    repo = Repository.open(application.effective_store_url, application.store_namespace)
    lineage = Lineage(application, version, job, repo, input_dir)
    parent = None
    for epoch in range(6):
        rescaled = epoch == 4
        parent = commit(
            repo,
            "main",
            parent,
            epoch,
            parallelism=3 if epoch >= 4 else 2,
            **(
                {"kind": "rescale", "provenance": {"from_parallelism": "2", "to_parallelism": "3"}}
                if rescaled
                else {}
            ),
        )
        lineage.main.append(parent)
    repo.cas_ref("tags/sp-1", None, lineage.main[2], reason="savepoint")
    fork = commit(
        repo,
        "exp",
        lineage.main[1],
        2,
        head="",
        kind="fork",
        provenance={"source_snapshot": lineage.main[1], "reason": "try a new window"},
    )
    lineage.fork += [fork, commit(repo, "exp", fork, 3)]
    reindex_application(application=application, repo=repo)
    job.parallelism = 3
    job.save(update_fields=["parallelism"])
    return lineage


@pytest.fixture
def lineage(store_url: str, users: dict[str, Any], tmp_path: Path) -> Lineage:  # noqa: F811
    return build_lineage(tmp_path)


@pytest.fixture
def pages_closed(browser: Any, transactional_db: None) -> Iterator[None]:
    """The test's pages are closed before the database is flushed: a page left open keeps
    polling the live server, whose reads deadlock with the flush's TRUNCATE. `browser` is
    the requesting module's own (tests/web/browser.py `close_pages`)."""
    yield
    from tests.web.browser import close_pages

    close_pages(browser)
