"""Fixtures for the REST API tests: users of each role with tokens, a real store with a small
lineage (commits with state chunks, a savepoint tag, a fork branch) indexed into the database,
an application version and a job."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from controlplane.accounts.roles import ADMIN, OPERATOR, VIEWER
from controlplane.accounts.services import user_create, user_token
from controlplane.applications.models import Application, ApplicationVersion
from controlplane.applications.services import application_create, version_create
from controlplane.jobs.models import Job
from controlplane.jobs.services import job_create
from controlplane.lineage.services import reindex_application
from snapshots_store import Manifest, Repository

JOB_REFERENCE = "clickstream"


@dataclass
class Lineage:
    application: Application
    version: ApplicationVersion
    job: Job
    repo: Repository
    main: list[str] = field(default_factory=list)  # snapshot ids on main, oldest first
    fork: list[str] = field(default_factory=list)


@pytest.fixture(autouse=True)
def fast_password_hashing(settings: Any) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def store_url(tmp_path: Path, settings: Any) -> str:
    url = f"file://{tmp_path / 'store'}"
    settings.EPOCHAL_STORE_URL = url
    return url


@pytest.fixture
def tokens(db: None) -> dict[str, str]:
    """role -> API token of a user with that role (usernames are the role names)."""
    return {
        role: user_token(user=user_create(username=role, role=role, password="pw-" + role * 3))
        for role in (VIEWER, OPERATOR, ADMIN)
    }


@pytest.fixture
def client_for(tokens: dict[str, str]) -> Callable[[str | None], APIClient]:
    """An API client authenticated with the token of `role` (None: anonymous)."""

    def make(role: str | None) -> APIClient:
        client = APIClient()
        client.default_format = "json"
        if role is not None:
            client.credentials(HTTP_AUTHORIZATION=f"Token {tokens[role]}")
        return client

    return make


def commit(
    repo: Repository,
    branch: str,
    parent: str | None,
    epoch: int,
    *,
    head: str | None = None,
    **fields: Any,
) -> str:
    """Commit epoch `epoch` on `branch` after `parent` (the branch's head is `head`, default
    the parent), changing one key group's chunk."""
    chunk = repo.put_object("chunk", f"{branch}:{epoch}".encode())
    base = repo.read_manifest(parent) if parent else None
    key_groups = dict(base.key_groups) if base else {}
    key_groups[epoch % 4] = (chunk,)
    manifest = Manifest(
        branch=branch,
        epoch=epoch,
        parents=(parent,) if parent else (),
        max_parallelism=8,
        parallelism=2,
        kind=fields.pop("kind", "epoch" if parent else "initial"),
        offsets={"clicks": {"0": epoch * 100, "1": epoch * 50}},
        key_groups=key_groups,
        stats={"records_in": 150, "process_s": 0.1 * (epoch + 1)},
        **fields,
    )
    expected = parent if head is None else (head or None)
    return repo.commit(manifest, branch, expected_head=expected, reason=f"epoch {epoch}")


def build_lineage(name: str = "clicks") -> Lineage:
    """Application `name` (M=8), version 1, job `<name>-main` on main; 5 commits on main, a
    savepoint tag at the third, a branch `exp` forked from the second with 2 commits."""
    application = application_create(name=name, max_parallelism=8)
    version = version_create(application=application, job=JOB_REFERENCE, code_version="v1")
    job = job_create(name=f"{name}-main", application=application, version=version)
    repo = Repository.open(application.effective_store_url, application.store_namespace)
    lineage = Lineage(application, version, job, repo)
    parent = None
    for epoch in range(5):
        parent = commit(repo, "main", parent, epoch)
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
    return lineage


@pytest.fixture
def lineage(store_url: str, tokens: dict[str, str]) -> Lineage:
    return build_lineage()


def current_database_url() -> str:
    """The URL of the database this test runs on (for servers and workers it starts)."""
    from django.db import connection

    settings = connection.settings_dict
    return (
        f"postgres://{settings['USER']}:{settings['PASSWORD'] or ''}@{settings['HOST']}:"
        f"{settings['PORT'] or 5432}/{settings['NAME']}"
    )
