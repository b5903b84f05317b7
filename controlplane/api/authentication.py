"""`Authorization: Token <secret>` against the hashed API tokens (controlplane.accounts).

A revoked or expired token, or one of a deactivated user, is refused and audited under its
user; an unknown token is refused and counted (controlplane.api.rejections), not audited row
by row, so nobody can flood the audit log by guessing."""

from __future__ import annotations

from typing import Any

from rest_framework import exceptions
from rest_framework.authentication import TokenAuthentication
from rest_framework.request import Request

from controlplane.accounts.tokens import token_authenticate
from controlplane.audit.services import audit_request


class ApiTokenAuthentication(TokenAuthentication):
    keyword = "Token"

    def authenticate(self, request: Request) -> tuple[Any, Any] | None:
        self._request = request
        return super().authenticate(request)

    def authenticate_credentials(self, key: str) -> tuple[Any, Any]:
        user, token = token_authenticate(key)
        if user is not None:
            return user, token
        request = getattr(self, "_request", None)
        if token is not None:
            reason = token.state if token.state != "active" else "user inactive"
            audit_request(
                user=None,
                action="token.refused",
                target=getattr(request, "path", ""),
                status_code=401,
                outcome="unauthenticated",
                source="api",
                detail={"user": token.user.get_username(), "token": token.prefix, "why": reason},
            )
            raise exceptions.AuthenticationFailed(f"token {token.prefix}… is {reason}")
        raise exceptions.AuthenticationFailed("invalid token")
