"""`manage.py createuser` and `manage.py token` give a working API login."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.http import HttpRequest
from rest_framework.test import APIClient

from controlplane.accounts.roles import user_role
from controlplane.accounts.selectors import user_get


def _call(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue().strip()


def test_createuser_and_token_give_an_api_login_with_the_role(db: None) -> None:
    assert _call("createuser", "ops", "--role", "operator") == "created ops (operator)"
    assert user_role(user_get(username="ops")) == "operator"
    token = _call("token", "ops")
    second = _call("token", "ops")  # each call issues a new token; the secret is shown once
    assert second != token
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert client.get("/api/jobs/").status_code == 200
    assert client.get("/api/users/").status_code == 403

    rotated = _call("token", "ops", "--rotate")  # revokes every earlier token of the user
    assert rotated not in (token, second)
    assert client.get("/api/jobs/").status_code == 401
    client.credentials(HTTP_AUTHORIZATION=f"Token {second}")
    assert client.get("/api/jobs/").status_code == 401
    client.credentials(HTTP_AUTHORIZATION=f"Token {rotated}")
    assert client.get("/api/jobs/").status_code == 200


def test_createuser_with_password_allows_a_session_login(db: None) -> None:
    _call("createuser", "ann", "--role", "admin", "--password", "a long enough secret")
    client = APIClient()
    # A sign-in goes through the lockout (django-axes), which needs the request.
    assert client.login(request=HttpRequest(), username="ann", password="a long enough secret")
    assert client.get("/api/users/").status_code == 200


def test_commands_refuse_duplicates_bad_roles_and_unknown_users(db: None) -> None:
    _call("createuser", "ops", "--role", "viewer")
    with pytest.raises(CommandError, match="exists already"):
        _call("createuser", "ops", "--role", "viewer")
    with pytest.raises(CommandError, match="invalid choice"):
        _call("createuser", "x", "--role", "king")
    with pytest.raises(CommandError, match="no user named 'ghost'"):
        _call("token", "ghost")
