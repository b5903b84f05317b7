"""Reads for applications."""

from __future__ import annotations

from controlplane.applications.errors import UnknownApplicationError
from controlplane.applications.models import Application


def application_get(*, name: str) -> Application:
    """The application called `name`; UnknownApplicationError otherwise."""
    try:
        return Application.objects.get(name=name)
    except Application.DoesNotExist:
        raise UnknownApplicationError(name) from None


def application_list() -> list[Application]:
    return list(Application.objects.order_by("name"))
