"""API tokens: everyone manages their own; admins manage anyone's.

The secret is in the answer to a create or a rotate only (`token`); afterwards `prefix`
identifies a token. Revoking keeps the record (who, when) for the audit trail."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from controlplane.accounts import selectors as accounts
from controlplane.accounts import tokens
from controlplane.accounts.models import ApiToken
from controlplane.accounts.roles import ADMIN, VIEWER, has_role
from controlplane.api.base import ApiView
from controlplane.api.pagination import PAGE_PARAMETERS, KeysetPagination, page_of
from controlplane.api.schema import error
from controlplane.api.serializers import (
    IssuedTokenSerializer,
    TokenCreateSerializer,
    TokenSerializer,
)
from controlplane.errors import Forbidden, NotFound

TAGS = ["tokens"]


def _owner(request: Request, username: str | None) -> Any:
    """The user whose tokens the request is about: oneself, or anyone for an admin."""
    if not username or username == request.user.get_username():
        return request.user
    if not has_role(request.user, ADMIN):
        raise Forbidden("only admins manage other users' tokens", fields={"user": ["not yours"]})
    return accounts.user_get(username=username)


def _token(request: Request, token_id: int) -> ApiToken:
    token = ApiToken.objects.select_related("user").filter(pk=token_id).first()
    mine = token is not None and token.user_id == request.user.pk
    if token is None or not (mine or has_role(request.user, ADMIN)):
        raise NotFound(
            f"no token {token_id} of yours; list them with GET /api/tokens/", code="token_not_found"
        )
    return token


class TokenListView(ApiView):
    read_role = VIEWER
    write_role = VIEWER

    @extend_schema(
        tags=TAGS,
        parameters=[
            OpenApiParameter("user", str, description="Admins: another user's tokens."),
            *PAGE_PARAMETERS,
        ],
        responses={
            200: page_of(TokenSerializer, "TokenPage"),
            404: error("No user of that name (admins)."),
        },
    )
    def get(self, request: Request) -> Response:
        owner = _owner(request, request.query_params.get("user"))
        pages = KeysetPagination(ordering=("-created_at", "-id"))
        items = pages.page(ApiToken.objects.filter(user=owner).select_related("user"), request)
        return Response(pages.response_data(TokenSerializer(items, many=True).data))

    @extend_schema(
        tags=TAGS,
        request=TokenCreateSerializer,
        responses={201: IssuedTokenSerializer, 404: error("No user of that name (admins).")},
        summary="Issue a token (its secret is in this answer only)",
    )
    def post(self, request: Request) -> Response:
        body = TokenCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        owner = _owner(request, body.validated_data.get("user"))
        issued = tokens.token_create(
            user=owner,
            name=body.validated_data["name"],
            expires_in_days=body.validated_data.get("expires_in_days"),
            actor=request.user,
        )
        self.audit_detail(user=owner.get_username(), token=issued.token.prefix)
        return Response(_issued(issued), status=201)


def _issued(issued: tokens.Issued) -> dict[str, Any]:
    return {**TokenSerializer(issued.token).data, "token": issued.secret}


class TokenDetailView(ApiView):
    read_role = VIEWER
    write_role = VIEWER

    @extend_schema(tags=TAGS, responses={200: TokenSerializer})
    def get(self, request: Request, token_id: int) -> Response:
        return Response(TokenSerializer(_token(request, token_id)).data)

    @extend_schema(
        tags=TAGS,
        summary="Revoke a token (it stops working at once; the record stays)",
        responses={200: TokenSerializer, 409: error("The token is revoked already.")},
    )
    def delete(self, request: Request, token_id: int) -> Response:
        token = tokens.token_revoke(token=_token(request, token_id), actor=request.user)
        self.audit_detail(user=token.user.get_username(), token=token.prefix)
        return Response(TokenSerializer(token).data)


class TokenRotateView(ApiView):
    read_role = VIEWER
    write_role = VIEWER

    @extend_schema(
        tags=TAGS,
        summary="Revoke a token and issue its successor (secret in this answer only)",
        request=None,
        responses={201: IssuedTokenSerializer, 409: error("The token is revoked already.")},
    )
    def post(self, request: Request, token_id: int) -> Response:
        issued = tokens.token_rotate(token=_token(request, token_id), actor=request.user)
        self.audit_detail(user=issued.token.user.get_username(), token=issued.token.prefix)
        return Response(_issued(issued), status=201)
