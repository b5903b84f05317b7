"""What admins registered and operators pick from: code (entry points of installed packages)
and places (stores, sinks)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from controlplane.api.base import ApiView
from controlplane.applications.sinks import sink_list
from controlplane.applications.stores import store_list
from runners import entry_points


class EntryPointSerializer(serializers.Serializer):
    name = serializers.CharField(help_text="What versions and operations name.")
    value = serializers.CharField(help_text="module:attr it points at (read-only).")
    distribution = serializers.CharField(help_text="The installed package declaring it.")
    version = serializers.CharField(help_text="That package's version.")


class EntryPointListView(ApiView):
    @extend_schema(
        tags=["applications"],
        summary="Jobs (epochal.jobs) and state migrations (epochal.state_migrations) installed",
        responses={
            200: inline_serializer(
                "EntryPoints",
                {
                    "jobs": EntryPointSerializer(many=True),
                    "state_migrations": EntryPointSerializer(many=True),
                },
            )
        },
    )
    def get(self, request: Request) -> Response:
        return Response(
            {
                "jobs": [e.to_dict() for e in entry_points.registered(entry_points.JOBS)],
                "state_migrations": [
                    e.to_dict() for e in entry_points.registered(entry_points.STATE_MIGRATIONS)
                ],
            }
        )


class StoreListView(ApiView):
    @extend_schema(
        tags=["applications"],
        summary="Registered stores (the only places migrate may name); admins register them",
        responses={
            200: inline_serializer(
                "Stores",
                {
                    "results": inline_serializer(
                        "Store",
                        {
                            "name": serializers.CharField(),
                            "url": serializers.CharField(
                                help_text="Never with credentials: they come from "
                                "credentials_env or credentials_secret."
                            ),
                            "credentials_env": serializers.CharField(
                                help_text="Environment variable prefix (never the secret)."
                            ),
                            "credentials_secret": serializers.CharField(
                                help_text="Kubernetes secret name (never the secret)."
                            ),
                            "description": serializers.CharField(),
                            "applications": serializers.ListField(child=serializers.CharField()),
                        },
                        many=True,
                    )
                },
            )
        },
    )
    def get(self, request: Request) -> Response:
        return Response(
            {
                "results": [
                    {
                        "name": s.name,
                        "url": s.shown_url,
                        "credentials_env": s.credentials_env,
                        "credentials_secret": s.credentials_secret,
                        "description": s.description,
                        "applications": [a.name for a in s.applications.order_by("name")],
                    }
                    for s in store_list()
                ]
            }
        )


class SinkListView(ApiView):
    @extend_schema(
        tags=["applications"],
        summary="Registered sinks (the only destinations a version may name); admins register them",
        responses={
            200: inline_serializer(
                "Sinks",
                {
                    "results": inline_serializer(
                        "Sink",
                        {
                            "name": serializers.CharField(help_text="What versions name."),
                            "kind": serializers.CharField(help_text="delta, postgres, kafka, …"),
                            "config": serializers.DictField(
                                help_text="The destination's settings (never credentials)."
                            ),
                            "credentials_env": serializers.CharField(
                                help_text="Environment variable name (never the secret)."
                            ),
                            "credentials_secret": serializers.CharField(
                                help_text="Kubernetes Secret holding that variable (its name)."
                            ),
                            "description": serializers.CharField(),
                        },
                        many=True,
                    )
                },
            )
        },
    )
    def get(self, request: Request) -> Response:
        return Response(
            {
                "results": [
                    {
                        "name": s.name,
                        "kind": s.kind,
                        "config": s.config,
                        "credentials_env": s.credentials_env,
                        "credentials_secret": s.credentials_secret,
                        "description": s.description,
                    }
                    for s in sink_list()
                ]
            }
        )
