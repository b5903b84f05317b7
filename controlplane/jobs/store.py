"""The store behind a job or an application: one `Repository` per (store URL, namespace)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from snapshots_store import Repository

if TYPE_CHECKING:
    from controlplane.applications.models import Application
    from controlplane.jobs.models import Job


def application_repository(application: Application, store_url: str | None = None) -> Repository:
    """The application's repository: in its registered store (with that store's credentials,
    from the environment variables it names), else in `store_url` or the deployment's."""
    from controlplane.applications.stores import store_repository

    if store_url is None and application.store is not None:
        return store_repository(application.store, application.store_namespace)
    return Repository.open(
        store_url or application.effective_store_url, application.store_namespace
    )


def job_repository(job: Job) -> Repository:
    return application_repository(job.application)


def branch_head(job: Job) -> str | None:
    """The snapshot id the job's branch points at (None before the first commit)."""
    ref = job_repository(job).read_ref(f"heads/{job.branch}")
    return None if ref is None else ref.target
