"""Sign-ins (dashboard and admin): audited, throttled and locked out.

django-axes counts failures per username and client address in the shared cache
(`CACHE_URL`) and locks that pair out after `EPOCHAL_LOGIN_FAILURE_LIMIT` failures for
`EPOCHAL_LOGIN_LOCKOUT_MINUTES` (429). Every successful sign-in and every failed one naming an
existing user is an audit row (`login` with outcome `ok` / `failed` / `locked-out`); failures
naming nobody, and attempts while locked out, are counted (controlplane/audit/rejections.py),
so nobody can flood the audit log by guessing."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.signals import user_logged_in, user_login_failed

from controlplane.audit.rejections import LOGIN_LOCKED_OUT, LOGIN_UNKNOWN_USER, count_rejection
from controlplane.audit.services import audit_request
from controlplane.proxies import client_address


def _path(request: Any) -> str:
    return str(getattr(request, "path", "") or "")


def on_logged_in(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    audit_request(
        user=user,
        action="login",
        target=_path(request),
        status_code=None,
        outcome="ok",
        source="web",
        detail={"address": client_address(request)},
    )


def on_login_failed(
    sender: Any, credentials: dict[str, Any], request: Any = None, **kwargs: Any
) -> None:
    username = str(credentials.get("username") or "")
    # django-axes handled this failure before us (it is installed before this app): it sets
    # axes_failures_since_start (else None) when it counted the failure, and axes_locked_out
    # when the pair is locked — by this failure (audited once), or earlier (a knock on a
    # locked door, which axes does not count again).
    locked = bool(getattr(request, "axes_locked_out", False))
    if locked and getattr(request, "axes_failures_since_start", None) is None:
        count_rejection(LOGIN_LOCKED_OUT, request)
        return
    outcome = "locked-out" if locked else "failed"
    user = get_user_model().objects.filter(username=username).first() if username else None
    if user is None:
        count_rejection(LOGIN_UNKNOWN_USER, request)
        return
    audit_request(
        user=None,
        action="login",
        target=_path(request),
        outcome=outcome,
        source="web",
        detail={"user": username, "address": client_address(request)},
    )


def connect() -> None:
    user_logged_in.connect(on_logged_in, dispatch_uid="epochal.login.ok")
    user_login_failed.connect(on_login_failed, dispatch_uid="epochal.login.failed")
