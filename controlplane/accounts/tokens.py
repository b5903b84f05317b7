"""Issuing, rotating and revoking API tokens; every change is audited.

A token's secret is returned once, by `token_create` / `token_rotate`; afterwards only its
prefix identifies it. `token_authenticate` is what the API's authentication calls."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.db.models import CharField, OuterRef, Value
from django.db.models.functions import Cast, Concat, Greatest
from django.utils import timezone

from controlplane.accounts.models import (
    SECRET_PREFIX,
    SHOWN_PREFIX_LENGTH,
    ApiToken,
    token_digest,
)
from controlplane.accounts.roles import remember_role, role_subquery
from controlplane.accounts.token_cache import TOKENS
from controlplane.audit.services import audit_request
from controlplane.changes.selectors import revision_subquery
from controlplane.errors import Conflict, InvalidRequest

MAX_EXPIRY_DAYS = 3650
LAST_USED_RESOLUTION = timedelta(seconds=60)
"""`last_used_at` is written at most once a minute per token (not on every request)."""


@dataclass(frozen=True)
class Issued:
    token: ApiToken
    secret: str
    """Shown to the caller once; only its digest is stored."""


def _new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def _expiry(expires_in_days: int | None) -> Any:
    if expires_in_days is None:
        return None
    if isinstance(expires_in_days, bool) or not 1 <= expires_in_days <= MAX_EXPIRY_DAYS:
        raise InvalidRequest(
            f"expires_in_days must be from 1 to {MAX_EXPIRY_DAYS}",
            fields={"expires_in_days": [f"an integer from 1 to {MAX_EXPIRY_DAYS}, or null"]},
        )
    return timezone.now() + timedelta(days=expires_in_days)


def _audit(actor: Any, action: str, token: ApiToken, source: str, **detail: Any) -> None:
    audit_request(
        user=actor,
        action=action,
        target=f"token {token.prefix}",
        outcome="ok",
        source=source,
        detail={"user": token.user.get_username(), "token": token.prefix, **detail},
    )


def token_create(
    *,
    user: Any,
    name: str = "",
    expires_in_days: int | None = None,
    actor: Any = None,
    source: str = "api",
    rotated_from: ApiToken | None = None,
) -> Issued:
    secret = _new_secret()
    token = ApiToken.objects.create(
        user=user,
        name=name,
        prefix=secret[:SHOWN_PREFIX_LENGTH],
        digest=token_digest(secret),
        expires_at=_expiry(expires_in_days),
        rotated_from=rotated_from,
    )
    _audit(
        actor or user,
        "token.create" if rotated_from is None else "token.rotate",
        token,
        source,
        name=name,
        expires_at=None if token.expires_at is None else token.expires_at.isoformat(),
        **({"rotated_from": rotated_from.prefix} if rotated_from is not None else {}),
    )
    return Issued(token, secret)


def token_revoke(*, token: ApiToken, actor: Any = None, source: str = "api") -> ApiToken:
    with transaction.atomic():
        token = ApiToken.objects.select_for_update().select_related("user").get(pk=token.pk)
        if token.revoked_at is not None:
            raise Conflict(f"token {token.prefix}… is revoked already", code="token_revoked")
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
    _audit(actor or token.user, "token.revoke", token, source)
    return token


def token_rotate(*, token: ApiToken, actor: Any = None, source: str = "api") -> Issued:
    """Revoke `token` and issue its successor (same user, name and lifetime)."""
    lifetime = None
    if token.expires_at is not None:
        days = (token.expires_at - token.created_at).days
        lifetime = min(max(days, 1), MAX_EXPIRY_DAYS)
    with transaction.atomic():
        old = token_revoke(token=token, actor=actor, source=source)
        return token_create(
            user=old.user,
            name=old.name,
            expires_in_days=lifetime,
            actor=actor,
            source=source,
            rotated_from=old,
        )


def token_authenticate(secret: str) -> tuple[Any, ApiToken | None]:
    """(user, token) for a usable `secret`; (None, token) for a revoked or expired one, or
    one of an inactive user; (None, None) for an unknown one.

    A token used in the last minute comes from this process's cache, checked against its
    revision (one plain statement, `token_cache`); otherwise one query loads token, user, role
    and that revision together."""
    digest = token_digest(secret)
    cached = TOKENS.get(digest)
    if cached is not None:
        user, token = cached
        _touch(token, digest)
        return user, token
    keys = [Concat(Value(p), Cast(OuterRef(f), CharField())) for p, f in _KEY_PARTS]
    token = (
        ApiToken.objects.select_related("user")
        .annotate(
            user_role=role_subquery(OuterRef("user_id")),  # no second query for the role
            credentials_revision=Greatest(*(revision_subquery(k) for k in keys)),
        )
        .filter(digest=digest)
        .first()
    )
    if token is None:
        return None, None
    remember_role(token.user, token.user_role)  # type: ignore[attr-defined]
    if token.state != "active" or not token.user.is_active:
        return None, token
    TOKENS.put(digest, token.user, token, int(token.credentials_revision))  # type: ignore[attr-defined]
    _touch(token, digest)
    return token.user, token


_KEY_PARTS = (("token:", "id"), ("user:", "user_id"))


def _touch(token: ApiToken, digest: str) -> None:
    """Record the use, at most once a minute per token."""
    now = timezone.now()
    if token.last_used_at is None or now - token.last_used_at >= LAST_USED_RESOLUTION:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
        TOKENS.touched(digest, now)
