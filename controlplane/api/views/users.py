"""Users and their roles (admins only)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from controlplane.accounts import selectors, services
from controlplane.accounts.roles import ADMIN, user_role
from controlplane.api.base import ApiView
from controlplane.api.pagination import PAGE_PARAMETERS, KeysetPagination, page_of
from controlplane.api.schema import error
from controlplane.api.serializers import (
    UserCreateSerializer,
    UserSerializer,
    UserUpdateSerializer,
)

TAGS = ["users"]


class UserListView(ApiView):
    read_role = ADMIN
    write_role = ADMIN

    @extend_schema(
        tags=TAGS, parameters=PAGE_PARAMETERS, responses={200: page_of(UserSerializer, "UserPage")}
    )
    def get(self, request: Request) -> Response:
        pages = KeysetPagination(ordering="username")
        items = pages.page(selectors.user_list(), request)
        data = UserSerializer(items, many=True, context={"request": request}).data
        return Response(pages.response_data(data))

    @extend_schema(
        tags=TAGS,
        request=UserCreateSerializer,
        responses={
            201: UserSerializer,
            409: error("A user of that name exists."),
            422: error("The password is too weak (`weak_password`)."),
        },
    )
    def post(self, request: Request) -> Response:
        body = UserCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        user = services.user_create(**body.validated_data)
        self.audit_detail(user=user.username, role=body.validated_data["role"])
        data = UserSerializer(user, context={"request": request}).data
        return Response(data, status=201, headers={"Location": data["url"]})


class UserDetailView(ApiView):
    read_role = ADMIN
    write_role = ADMIN

    @extend_schema(tags=TAGS, responses={200: UserSerializer})
    def get(self, request: Request, username: str) -> Response:
        user = selectors.user_get(username=username)
        return Response(UserSerializer(user, context={"request": request}).data)

    @extend_schema(tags=TAGS, request=UserUpdateSerializer, responses={200: UserSerializer})
    def patch(self, request: Request, username: str) -> Response:
        user = selectors.user_get(username=username)
        body = UserUpdateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        before = {"role": user_role(user), "is_active": user.is_active}
        user = services.user_update(user=user, **body.validated_data)
        after = {"role": user_role(user), "is_active": user.is_active}
        self.audit_detail(
            user=user.username,
            **{k: {"old": before[k], "new": after[k]} for k in before if before[k] != after[k]},
        )
        return Response(UserSerializer(user, context={"request": request}).data)
