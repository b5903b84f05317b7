"""Writes for applications."""

from __future__ import annotations

from controlplane.applications.models import Application


def application_create(
    *, name: str, store_namespace: str | None = None, max_parallelism: int = 128
) -> Application:
    """Create an application (its store namespace defaults to its name)."""
    application = Application(
        name=name, store_namespace=store_namespace or name, max_parallelism=max_parallelism
    )
    application.full_clean()
    application.save()
    return application
