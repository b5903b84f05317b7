"""Writes for users: create one with a role, change a role, issue an API token."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from controlplane.accounts.roles import ROLES, assign_role
from controlplane.errors import Conflict, InvalidRequest, Unprocessable


def _check_role(role: str) -> None:
    if role not in ROLES:
        raise InvalidRequest(
            f"role must be one of {list(ROLES)}, not {role!r}",
            fields={"role": [f"one of {list(ROLES)}"]},
        )


def user_create(*, username: str, role: str, password: str | None = None, email: str = "") -> Any:
    """A new active user with `role`; without a password the user can only use API tokens."""
    _check_role(role)
    model = get_user_model()
    user = model(username=username, email=email)
    if password:
        try:
            validate_password(password, user)
        except ValidationError as exc:
            raise Unprocessable(
                "the password is too weak: " + " ".join(exc.messages),
                code="weak_password",
                fields={"password": list(exc.messages)},
            ) from None
        user.set_password(password)
    else:
        user.set_unusable_password()
    try:
        with transaction.atomic():
            user.save()
            assign_role(user, role)
    except IntegrityError:
        raise Conflict(f"a user named {username!r} exists already", code="user_exists") from None
    return user


def user_update(*, user: Any, role: str | None = None, is_active: bool | None = None) -> Any:
    """Change a user's role and/or whether they may sign in."""
    with transaction.atomic():
        if role is not None:
            _check_role(role)
            assign_role(user, role)
        if is_active is not None and is_active != user.is_active:
            user.is_active = is_active
            user.save(update_fields=["is_active"])
    return user


def user_token(*, user: Any, rotate: bool = False, actor: Any = None, source: str = "cli") -> str:
    """A new API token's secret for `user` (shown once); `rotate` first revokes the others."""
    from controlplane.accounts.models import ApiToken
    from controlplane.accounts.tokens import token_create, token_revoke

    if rotate:
        for token in ApiToken.objects.filter(user=user, revoked_at__isnull=True):
            token_revoke(token=token, actor=actor, source=source)
    return token_create(user=user, actor=actor, source=source).secret
