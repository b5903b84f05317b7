"""Who may do what: viewer reads, operator requests operations and creates jobs, admin all.

Each view names the role its reads need (`read_role`, default viewer) and the role its
writes need (`write_role`, default admin). Anonymous requests get 401, authenticated users
below the role 403.
"""

from __future__ import annotations

from typing import Any

from rest_framework import exceptions
from rest_framework.permissions import SAFE_METHODS, BasePermission

from controlplane.accounts.roles import ADMIN, VIEWER, has_role, user_role


def required_role(request: Any, view: Any) -> str:
    if request.method in SAFE_METHODS:
        return str(getattr(view, "read_role", VIEWER))
    return str(getattr(view, "write_role", ADMIN))


class HasRole(BasePermission):
    """The request's user has the role the view requires for this method."""

    def has_permission(self, request: Any, view: Any) -> bool:
        user = request.user
        if user is None or not user.is_authenticated:
            raise exceptions.NotAuthenticated()
        role = required_role(request, view)
        if not has_role(user, role):
            have = user_role(user) or "no role"
            raise exceptions.PermissionDenied(
                f"{request.method} {request.path} needs the {role} role; "
                f"{user.get_username()} has {have}"
            )
        return True


class IsViewer(HasRole):
    """For views that are not ours (schema, docs): any method needs the viewer role."""

    def has_permission(self, request: Any, view: Any) -> bool:
        view.read_role = view.write_role = VIEWER
        return super().has_permission(request, view)


__all__ = ["ADMIN", "HasRole", "IsViewer"]
