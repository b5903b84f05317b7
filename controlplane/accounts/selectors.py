"""Reads for users."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import OuterRef, QuerySet

from controlplane.accounts.roles import remember_role, role_subquery
from controlplane.errors import NotFound


class _WithRoles(QuerySet[Any]):
    """Users whose role came with them (`user_role` asks no more)."""

    def _fetch_all(self) -> None:
        super()._fetch_all()
        for user in self._result_cache or ():
            if hasattr(user, "loaded_role"):
                remember_role(user, user.loaded_role)


def user_list() -> QuerySet[Any]:
    """Every user by name, each with its role (one query per page, not one per user)."""
    users = get_user_model().objects.annotate(loaded_role=role_subquery(OuterRef("pk")))
    return _WithRoles(model=users.model, query=users.query).order_by("username")


def user_get(*, username: str) -> Any:
    user = user_list().filter(username=username).first()
    if user is None:
        raise NotFound(
            f"no user named {username!r}; list users with GET /api/users/", code="user_not_found"
        )
    return user
