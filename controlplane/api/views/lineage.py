"""Branches, tags, snapshots (log, one, diff) and the lineage graph of an application."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TypeVar

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from controlplane.api.base import ApiView
from controlplane.api.conditional import conditional_read, etag_for, watch_seconds
from controlplane.api.pagination import (
    PAGE_PARAMETERS,
    page_limit,
    page_of,
    page_response_data,
    sequence_page,
)
from controlplane.api.prerendered import accepts_prerendered, prerendered_json
from controlplane.api.schema import REF, REVISION, error
from controlplane.api.serializers import (
    BranchSerializer,
    GraphEdgeSerializer,
    SnapshotDetailSerializer,
    SnapshotDiffSerializer,
    SnapshotSummarySerializer,
    TagSerializer,
    snapshot_summaries,
    snapshot_summaries_json,
    snapshot_url_prefix,
)
from controlplane.applications.models import Application
from controlplane.applications.selectors import application_forget, application_get, application_ref
from controlplane.changes.keys import lineage_key
from controlplane.changes.selectors import revision
from controlplane.errors import InvalidRequest
from controlplane.lineage import selectors, store_reads
from controlplane.lineage.errors import UnknownRevisionError
from controlplane.lineage.sink_status import STATUSES as SINK_STATUSES
from controlplane.lineage.sink_status import sink_statuses, snapshot_sinks
from controlplane.refnames import checked_ref, checked_revision

_T = TypeVar("_T")


def _indexed(name: str, read: Callable[[Application], _T]) -> _T:
    """`read` the index of application `name` (known by id only, see `application_ref`);
    when it finds nothing, check once more with the application read afresh."""
    try:
        return read(application_ref(name=name))
    except UnknownRevisionError:
        application_forget(name)
        return read(application_get(name=name))


TAGS = ["lineage"]


def _sinks_field() -> serializers.DictField:
    return serializers.DictField(
        child=serializers.DictField(child=serializers.ChoiceField(choices=SINK_STATUSES)),
        required=False,
        help_text="Only with `sinks=true`: snapshot id -> each sink's status for the page's "
        "snapshots, as `sinks` of GET …/snapshots/{id}/ (judged against the snapshot's own "
        "branch; snapshots without a sink are left out)",
    )


_SINKS_PARAMETER = OpenApiParameter(
    "sinks",
    OpenApiTypes.BOOL,
    description="Add `sinks`: each snapshot's sinks' statuses (docs/sinks.md), read in a fixed "
    "number of statements for the page (one, and one per branch judged, at most 12).",
)


def _flag(request: Request, name: str) -> bool:
    raw = request.query_params.get(name, "false").lower()
    if raw not in ("true", "false", "1", "0"):
        raise InvalidRequest(f"{name} must be true or false", fields={name: ["true or false"]})
    return raw in ("true", "1")


class BranchListView(ApiView):
    @extend_schema(
        tags=TAGS,
        parameters=PAGE_PARAMETERS,
        responses={200: page_of(BranchSerializer, "BranchPage")},
    )
    def get(self, request: Request, name: str) -> Response:
        application = application_ref(name=name)
        items, cursor = sequence_page(request, selectors.branch_list(application=application))
        data = BranchSerializer(items, many=True).data
        return Response(page_response_data(request, data, cursor))


class TagListView(ApiView):
    @extend_schema(
        tags=TAGS,
        parameters=PAGE_PARAMETERS,
        responses={200: page_of(TagSerializer, "TagPage")},
    )
    def get(self, request: Request, name: str) -> Response:
        application = application_ref(name=name)
        items, cursor = sequence_page(request, selectors.tag_list(application=application))
        return Response(page_response_data(request, TagSerializer(items, many=True).data, cursor))


class SnapshotLogView(ApiView):
    @extend_schema(
        tags=TAGS,
        summary="History (log) of a branch, tag or snapshot, newest first",
        parameters=[
            OpenApiParameter(
                "rev",
                REF,
                description="Branch name, `heads/x`, `tags/y` or a 64-hex id (default `main`).",
            ),
            OpenApiParameter(
                "first_parent",
                OpenApiTypes.BOOL,
                description="Follow only first parents (the branch's own line).",
            ),
            _SINKS_PARAMETER,
            *PAGE_PARAMETERS,
        ],
        responses={
            200: inline_serializer(
                "SnapshotPage",
                {
                    "next": serializers.URLField(allow_null=True),
                    "previous": serializers.URLField(allow_null=True),
                    "results": SnapshotSummarySerializer(many=True),
                    "sinks": _sinks_field(),
                },
            ),
            404: error("Unknown application or revision."),
        },
    )
    def get(self, request: Request, name: str) -> Response:
        rev = checked_ref(request.query_params.get("rev"), field="rev") or "main"
        first_parent = _flag(request, "first_parent")
        with_sinks = _flag(request, "sinks")
        limit = page_limit(request)
        cursor = request.query_params.get("cursor") or None
        key = lineage_key(application_ref(name=name).pk)

        def begin() -> tuple[selectors.LogStart, str]:
            start = _indexed(
                name,
                lambda application: selectors.snapshot_log_start(
                    application=application, rev=rev, first_parent=first_parent
                ),
            )
            # The page is fixed by where the log starts (histories never change) and the
            # query; its sinks' statuses change with any commit of the application.
            moved = revision(key) if with_sinks else ""
            parts = (start.version, first_parent, limit, cursor or "", moved)
            return start, etag_for(request, "log", *parts)

        watch = watch_seconds(request) > 0 and "If-None-Match" in request.headers
        seen = revision(key) if watch else 0  # before the log: no commit falls in between
        return conditional_read(
            request,
            key=key,
            seen=seen,  # a commit somewhere in the application: did this log move?
            first=begin(),
            look=begin,
            build=lambda start: _log_page(request, name, start, limit, cursor, with_sinks),
        )


def _page_sinks(application: Application, ids: list[str]) -> dict[str, dict[str, str]]:
    """Snapshot id -> its sinks' statuses (`sink_statuses`, each judged against its own
    branch, as `GET …/snapshots/{id}/` does), in the page's order; snapshots without any are
    left out. A fixed number of statements for the page, never one per row."""
    statuses = sink_statuses(application=application, snapshot_ids=ids)
    return {sid: statuses.of(sid) for sid in ids if statuses.of(sid)}


def _sinks_json(sinks: dict[str, dict[str, str]]) -> str:
    return json.dumps(sinks, ensure_ascii=False, separators=(",", ":"))


def _log_page(
    request: Request,
    name: str,
    start: selectors.LogStart,
    limit: int,
    cursor: str | None,
    with_sinks: bool,
) -> Response:
    prefix = snapshot_url_prefix(request, name)
    if accepts_prerendered(request):
        text = selectors.snapshot_log_page_json(start, limit=limit, cursor=cursor)
        if text is not None:  # PostgreSQL built the summaries' JSON
            links = page_response_data(request, [], text.next_cursor)
            raw = {"results": snapshot_summaries_json(text.rows, prefix)}
            if with_sinks:
                ids = [sid for sid, _ in text.rows]
                raw["sinks"] = _sinks_json(_page_sinks(application_ref(name=name), ids))
            return prerendered_json({"next": links["next"], "previous": links["previous"]}, raw)
    page = selectors.snapshot_log_page(start, limit=limit, cursor=cursor)
    data = page_response_data(request, snapshot_summaries(page.snapshots, prefix), page.next_cursor)
    if with_sinks:
        ids = [s.snapshot_id for s in page.snapshots]
        data["sinks"] = _page_sinks(application_ref(name=name), ids)
    return Response(data)


class SnapshotDetailView(ApiView):
    @extend_schema(tags=TAGS, responses={200: SnapshotDetailSerializer})
    def get(self, request: Request, name: str, snapshot_id: str) -> Response:
        snapshot = _indexed(
            name,
            lambda application: selectors.snapshot_get(
                application=application, rev=snapshot_id, with_application=True
            ),
        )
        application = snapshot.application
        extras = store_reads.snapshot_manifest_extras(
            application=application, snapshot_id=snapshot.snapshot_id
        )
        ctx = {
            "request": request,
            "application": application.name,
            "manifest": extras,
            "sinks": snapshot_sinks(application=application, snapshot=snapshot),
        }
        return Response(SnapshotDetailSerializer(snapshot, context=ctx).data)


class SnapshotDiffView(ApiView):
    @extend_schema(
        tags=TAGS,
        summary="What changed from the first parent (or `against`) to this snapshot",
        parameters=[
            OpenApiParameter(
                "against",
                REVISION,
                description="Any revision (id or prefix, branch, tags/x, with ~n or ^n); "
                "default: the first parent.",
            )
        ],
        responses={200: SnapshotDiffSerializer, 502: error("The store could not be read.")},
    )
    def get(self, request: Request, name: str, snapshot_id: str) -> Response:
        application = application_get(name=name)
        snapshot = selectors.snapshot_get(application=application, rev=snapshot_id)
        diff = store_reads.snapshot_diff(
            application=application,
            snapshot=snapshot,
            against=checked_revision(request.query_params.get("against"), field="against"),
        )
        return Response(SnapshotDiffSerializer(diff.to_dict()).data)


class LineageGraphView(ApiView):
    @extend_schema(
        tags=TAGS,
        summary="A page of the lineage graph: recently indexed snapshots, edges and refs",
        parameters=[_SINKS_PARAMETER, *PAGE_PARAMETERS],
        responses={
            200: inline_serializer(
                "LineageGraphPage",
                {
                    "next": serializers.URLField(allow_null=True),
                    "previous": serializers.URLField(allow_null=True),
                    "results": SnapshotSummarySerializer(many=True),
                    "edges": GraphEdgeSerializer(many=True),
                    "refs": serializers.DictField(
                        child=serializers.ListField(child=serializers.CharField()),
                        help_text="snapshot id -> heads/… and tags/… pointing at it",
                    ),
                    "sinks": _sinks_field(),
                },
            )
        },
    )
    def get(self, request: Request, name: str) -> Response:
        application = application_ref(name=name)
        limit = page_limit(request, default=200)
        cursor = request.query_params.get("cursor") or None
        with_sinks = _flag(request, "sinks")
        key = lineage_key(application.pk)
        seen = revision(key)

        def look() -> tuple[None, str]:
            return None, etag_for(request, "lineage", application.pk, revision(key), with_sinks)

        return conditional_read(
            request,
            key=key,
            seen=seen,
            first=(None, etag_for(request, "lineage", application.pk, seen, with_sinks)),
            look=look,
            build=lambda _: _graph_page(request, application, limit, cursor, with_sinks),
        )


def _graph_page(
    request: Request, application: Application, limit: int, cursor: str | None, with_sinks: bool
) -> Response:
    prefix = snapshot_url_prefix(request, application.name)
    if accepts_prerendered(request):
        text = selectors.lineage_graph_page_json(
            application=application, url_prefix=prefix, limit=limit, cursor=cursor
        )
        if text is not None:  # PostgreSQL built the rows' JSON
            links = page_response_data(request, [], text.next_cursor)
            raw = {
                "results": f"[{text.results}]",
                "edges": f"[{text.edges}]",
                "refs": f"{{{text.refs}}}",
            }
            if with_sinks:
                raw["sinks"] = _sinks_json(_page_sinks(application, list(text.ids)))
            return prerendered_json({"next": links["next"], "previous": links["previous"]}, raw)
    page = selectors.lineage_graph_page(application=application, limit=limit, cursor=cursor)
    data = page_response_data(request, snapshot_summaries(page.snapshots, prefix), page.next_cursor)
    data["edges"] = [
        {"child": e.child, "parent": e.parent, "position": e.position} for e in page.edges
    ]
    data["refs"] = page.refs
    if with_sinks:
        data["sinks"] = _page_sinks(application, [s.snapshot_id for s in page.snapshots])
    return Response(data)
