"""Applications and their versions."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from controlplane.accounts.roles import ADMIN
from controlplane.api.base import ApiView
from controlplane.api.pagination import PAGE_PARAMETERS, KeysetPagination, page_of
from controlplane.api.schema import error
from controlplane.api.serializers import (
    ApplicationCreateSerializer,
    ApplicationSerializer,
    VersionCreateSerializer,
    VersionSerializer,
)
from controlplane.applications import selectors, services


class ApplicationListView(ApiView):
    write_role = ADMIN

    @extend_schema(
        tags=["applications"],
        parameters=PAGE_PARAMETERS,
        responses={200: page_of(ApplicationSerializer, "ApplicationPage")},
    )
    def get(self, request: Request) -> Response:
        pages = KeysetPagination(ordering="name")
        items = pages.page(selectors.application_queryset(), request)
        ctx = {"request": request}
        return Response(
            pages.response_data(ApplicationSerializer(items, many=True, context=ctx).data)
        )

    @extend_schema(
        tags=["applications"],
        request=ApplicationCreateSerializer,
        responses={201: ApplicationSerializer, 409: error("An application of that name exists.")},
    )
    def post(self, request: Request) -> Response:
        body = ApplicationCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        application = services.application_create(**body.validated_data)
        data = ApplicationSerializer(application, context={"request": request}).data
        return Response(data, status=201, headers={"Location": data["url"]})


class ApplicationDetailView(ApiView):
    @extend_schema(tags=["applications"], responses={200: ApplicationSerializer})
    def get(self, request: Request, name: str) -> Response:
        application = selectors.application_get(name=name)
        return Response(ApplicationSerializer(application, context={"request": request}).data)


class VersionListView(ApiView):
    write_role = ADMIN

    @extend_schema(
        tags=["applications"],
        parameters=PAGE_PARAMETERS,
        responses={200: page_of(VersionSerializer, "VersionPage")},
    )
    def get(self, request: Request, name: str) -> Response:
        application = selectors.application_get(name=name)
        pages = KeysetPagination(ordering="number")
        items = pages.page(selectors.version_list(application=application), request)
        data = VersionSerializer(items, many=True, context={"request": request}).data
        return Response(pages.response_data(data))

    @extend_schema(
        tags=["applications"],
        request=VersionCreateSerializer,
        responses={201: VersionSerializer},
    )
    def post(self, request: Request, name: str) -> Response:
        application = selectors.application_get(name=name)
        body = VersionCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        version = services.version_create(
            application=application, created_by=request.user, **body.validated_data
        )
        data = VersionSerializer(version, context={"request": request}).data
        return Response(data, status=201, headers={"Location": data["url"]})


class VersionDetailView(ApiView):
    @extend_schema(tags=["applications"], responses={200: VersionSerializer})
    def get(self, request: Request, name: str, number: int) -> Response:
        application = selectors.application_get(name=name)
        version = selectors.version_get(application=application, number=number)
        return Response(VersionSerializer(version, context={"request": request}).data)
