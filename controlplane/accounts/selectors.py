"""Reads for users."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import QuerySet

from controlplane.errors import NotFound


def user_list() -> QuerySet[Any]:
    return get_user_model().objects.prefetch_related("groups").order_by("username")


def user_get(*, username: str) -> Any:
    user = user_list().filter(username=username).first()
    if user is None:
        raise NotFound(
            f"no user named {username!r}; list users with GET /api/users/", code="user_not_found"
        )
    return user
