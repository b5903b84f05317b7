"""Who may see and do what in the dashboard: every page needs the viewer role, every action
the operator role (`controlplane.accounts.roles`). Anonymous users are sent to the login page;
a signed-in user without the role gets 403."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse

from controlplane.accounts.roles import OPERATOR, VIEWER, has_role, user_role

View = Callable[..., HttpResponse]


def role_required(role: str) -> Callable[[View], View]:
    def decorate(view: View) -> View:
        @wraps(view)
        def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if not request.user.is_authenticated:
                return redirect_to_login(request.get_full_path())
            if not has_role(request.user, role):
                raise PermissionDenied(
                    f"this needs the {role} role; your role is {user_role(request.user) or 'none'}"
                    " — ask an admin"
                )
            return view(request, *args, **kwargs)

        return guarded

    return decorate


viewer_required = role_required(VIEWER)
operator_required = role_required(OPERATOR)


def can_operate(request: HttpRequest) -> bool:
    return has_role(request.user, OPERATOR)
