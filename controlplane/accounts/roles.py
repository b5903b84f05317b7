"""Roles: viewer (read), operator (operations), admin (everything, users).

A role is a Django group of the same name; a superuser is an admin. A user's role is the
highest of their groups. Every endpoint and every dashboard action checks `has_role`.
"""

from __future__ import annotations

from typing import Any, Final

VIEWER: Final = "viewer"
OPERATOR: Final = "operator"
ADMIN: Final = "admin"
ROLES: Final = (VIEWER, OPERATOR, ADMIN)
_RANK: Final = {VIEWER: 1, OPERATOR: 2, ADMIN: 3}


def user_role(user: Any) -> str | None:
    """The highest role of `user`, or None (anonymous, or a user without a role)."""
    if user is None or not getattr(user, "is_authenticated", False) or not user.is_active:
        return None
    if user.is_superuser:
        return ADMIN
    cached = getattr(user, "_epochal_role", False)
    if cached is not False:
        return cached  # type: ignore[no-any-return]
    names = set(user.groups.values_list("name", flat=True))
    role = max((r for r in ROLES if r in names), key=_RANK.__getitem__, default=None)
    user._epochal_role = role
    return role


def has_role(user: Any, role: str) -> bool:
    """Whether `user` has `role` or a higher one."""
    have = user_role(user)
    return have is not None and _RANK[have] >= _RANK[role]


def assign_role(user: Any, role: str) -> None:
    """Make `role` the user's only role (creating its group when missing)."""
    from django.contrib.auth.models import Group

    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    user.groups.remove(*Group.objects.filter(name__in=ROLES))
    group, _ = Group.objects.get_or_create(name=role)
    user.groups.add(group)
    if hasattr(user, "_epochal_role"):
        del user._epochal_role


def role_subquery(user: Any) -> Any:
    """An SQL expression for the highest role of the user `user` (an `OuterRef` to a user id):
    lets a query that loads users load their roles too (`remember_role`), one query for all."""
    from django.contrib.auth.models import Group
    from django.db.models import Case, IntegerField, Subquery, Value, When

    rank = Case(*(When(name=r, then=Value(_RANK[r])) for r in ROLES), output_field=IntegerField())
    groups = Group.objects.filter(user=user, name__in=ROLES).annotate(rank=rank)
    return Subquery(groups.order_by("-rank").values("name")[:1])


def remember_role(user: Any, role: str | None) -> None:
    """Record the role a query loaded with `role_subquery`, so `user_role` asks no more."""
    user._epochal_role = role
