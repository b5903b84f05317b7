"""Job webs over REST: state at any epoch, the cross-job epoch mapping, the web.

- ``GET /api/applications/{name}/state/`` — the state of a key (``key``, repeat it for a
  key of several columns; ``key_type=int`` for integer keys), a key group page
  (``key_group``, ``limit``, ``cursor``) or a key range (``key_from`` / ``key_to``) at
  ``snapshot=REV``, or at ``branch`` (default main) ``epoch=N`` (head without epoch), or
  "as of" another job's epoch (``as_of_application``, ``as_of_epoch``, ``as_of_branch``,
  ``as_of_source``). An epoch not committed yet waits up to ``timeout`` seconds (max 30)
  and then answers 202 ``{"status": "pending"}``.
- ``GET /api/applications/{name}/mapping/?branch=B`` — downstream epoch -> upstream epochs
  and snapshot ids, oldest first, as the manifests record them.
- ``GET /api/web/`` — the job web: jobs, branch-output edges, alignment state, lag, alarm.
"""

from __future__ import annotations

import math
from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from controlplane.api.base import ApiView
from controlplane.api.schema import REF, REVISION, error
from controlplane.applications.selectors import application_get
from controlplane.errors import InvalidRequest, Unprocessable
from controlplane.jobs.store import application_repository
from controlplane.operations.webs import web_graph
from controlplane.refnames import checked_branch
from runners.engine.branch_source import epoch_mapping
from runners.engine.query import (
    StateAnswer,
    StateQueryError,
    epoch_in_history,
    state_as_of,
    state_at,
    state_at_epoch,
)

TAGS = ["webs"]
MAX_TIMEOUT_S = 30.0


def _int(request: Request, name: str, *, low: int = 0) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise InvalidRequest(f"{name} must be an integer", fields={name: ["an integer"]}) from None
    if value < low:
        raise InvalidRequest(f"{name} must be >= {low}", fields={name: [f">= {low}"]})
    return value


def _key_value(raw: str, key_type: str) -> Any:
    if key_type == "str":
        return raw
    try:
        return int(raw)
    except ValueError:
        raise StateQueryError(f"key {raw!r} is not an integer (key_type=int)") from None


def _query(request: Request) -> dict[str, Any]:
    params = request.query_params
    key_type = params.get("key_type", "str")
    if key_type not in ("str", "int"):
        raise InvalidRequest("key_type must be str or int", fields={"key_type": ["str or int"]})
    query: dict[str, Any] = {}
    keys = [_key_value(k, key_type) for k in params.getlist("key")]
    if keys:
        query["key"] = keys[0] if len(keys) == 1 else tuple(keys)
    key_group = _int(request, "key_group")
    if key_group is not None:
        query["key_group"] = key_group
    for name in ("key_from", "key_to"):
        if params.get(name):
            query[name] = _key_value(params[name], key_type)
    limit = _int(request, "limit", low=1)
    if limit is not None:
        query["limit"] = limit
    if params.get("cursor"):
        query["cursor"] = params["cursor"]
    return query


def _timeout(request: Request) -> float:
    raw = request.query_params.get("timeout", "0")
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not math.isfinite(value) or not 0 <= value <= MAX_TIMEOUT_S:
        raise InvalidRequest(
            f"timeout must be seconds from 0 to {MAX_TIMEOUT_S:g}",
            fields={"timeout": [f"a number from 0 to {MAX_TIMEOUT_S:g}"]},
        )
    return value


def _answer(answer: StateAnswer) -> Response:
    return Response(answer.to_dict(), status=202 if answer.status == "pending" else 200)


class StateView(ApiView):
    @extend_schema(
        tags=TAGS,
        summary="State of a key, key group page or key range at a snapshot or epoch",
        parameters=[
            OpenApiParameter("key", str, description="Key value (repeat for several columns)."),
            OpenApiParameter("key_type", str, enum=["str", "int"], description="Default str."),
            OpenApiParameter(
                "key_group",
                {"type": "integer", "minimum": 0},  # type: ignore[arg-type]
                description="A key group: a page of its keys.",
            ),
            OpenApiParameter("key_from", str, description="Range start (inclusive)."),
            OpenApiParameter("key_to", str, description="Range end (exclusive)."),
            OpenApiParameter("limit", {"type": "integer", "minimum": 1}),  # type: ignore[arg-type]
            OpenApiParameter("cursor", str),
            OpenApiParameter(
                "snapshot",
                REVISION,
                description="Any revision (id, branch, tag); with epoch: that epoch of its "
                "history.",
            ),
            OpenApiParameter("branch", REF, description="Branch (default main)."),
            OpenApiParameter(
                "epoch",
                {"type": "integer", "minimum": 1},  # type: ignore[arg-type]
                description="A committed epoch of the branch (or of the snapshot's history).",
            ),
            OpenApiParameter(
                "timeout",
                {"type": "number", "minimum": 0, "maximum": MAX_TIMEOUT_S},  # type: ignore[arg-type]
                description=f"Seconds to wait for the epoch, 0..{MAX_TIMEOUT_S:g} (default 0).",
            ),
            OpenApiParameter(
                "as_of_application",
                str,
                description="The caller's application (the other as_of_* need it: 422).",
            ),
            OpenApiParameter("as_of_branch", REF),
            OpenApiParameter(
                "as_of_epoch",
                {"type": "integer", "minimum": 1},  # type: ignore[arg-type]
                description="The caller's epoch (default: its branch head's).",
            ),
            OpenApiParameter("as_of_source", str, description="Its source name (upstream)."),
        ],
        responses={
            200: dict,
            202: dict,
            400: error("Bad query."),
            404: error("Unknown application or revision."),
            422: error(
                "Cannot be answered as asked: an epoch the history does not have, a key "
                "group beyond M, a key of another type, an unknown cursor, as_of_* without "
                "as_of_application."
            ),
        },
    )
    def get(self, request: Request, name: str) -> Response:
        application = application_get(name=name)
        repo = application_repository(application)
        params = request.query_params
        branch = checked_branch(params.get("branch") or "main")
        caller_branch = checked_branch(params.get("as_of_branch") or "main", field="as_of_branch")
        timeout = _timeout(request)
        epoch = _int(request, "epoch", low=1)
        caller_epoch = _int(request, "as_of_epoch", low=1)
        try:
            query = _query(request)
            if params.get("as_of_application"):
                caller = application_repository(application_get(name=params["as_of_application"]))
                if caller_epoch is None:
                    caller_epoch = _head_epoch(caller, caller_branch)
                    if caller_epoch is None:
                        return _answer(
                            StateAnswer(
                                status="pending",
                                branch=branch,
                                detail=f"the caller's branch {caller_branch!r} has no commits yet",
                            )
                        )
                return _answer(
                    state_as_of(
                        repo,
                        branch,
                        caller=caller,
                        caller_branch=caller_branch,
                        caller_epoch=caller_epoch,
                        caller_source=params.get("as_of_source") or "upstream",
                        timeout=timeout,
                        **query,
                    )
                )
            given = [n for n in ("as_of_epoch", "as_of_branch", "as_of_source") if params.get(n)]
            if given:
                raise StateQueryError(
                    f"{', '.join(given)} describe the caller of a cross-job query: give "
                    "as_of_application too (the application whose epoch it is)"
                )
            if params.get("snapshot"):
                if epoch is not None:
                    sid = epoch_in_history(repo, params["snapshot"], epoch)
                    return _answer(state_at(repo, sid, **query))
                return _answer(state_at(repo, params["snapshot"], **query))
            if epoch is not None:
                return _answer(state_at_epoch(repo, branch, epoch, timeout=timeout, **query))
            return _answer(state_at(repo, branch, branch=branch, **query))
        except StateQueryError as exc:
            # Well-formed, but what it names cannot be answered (an epoch the history does not
            # have, a key group beyond M, a key of another type, a cursor this API did not give)
            raise Unprocessable(
                str(exc), code="invalid_state_query", fields={"query": [str(exc)]}
            ) from None


def _head_epoch(repo: Any, branch: str) -> int | None:
    head = repo.read_ref(f"heads/{branch}")
    return None if head is None else int(repo.read_manifest(head.target).epoch)


class MappingView(ApiView):
    @extend_schema(
        tags=TAGS,
        summary="Downstream epoch -> upstream epochs and snapshots read (branch outputs)",
        parameters=[OpenApiParameter("branch", REF, description="Branch (default main).")],
        responses={200: dict, 400: error("Bad branch name."), 404: error("Unknown application.")},
    )
    def get(self, request: Request, name: str) -> Response:
        branch = checked_branch(request.query_params.get("branch", "main"))
        application = application_get(name=name)
        entries = epoch_mapping(application_repository(application), branch)
        return Response({"branch": branch, "results": [e.to_dict() for e in entries]})


class WebView(ApiView):
    @extend_schema(
        tags=TAGS,
        summary="The job web: jobs, branch-output edges, alignment state, lag and lag alarm",
        responses={200: dict},
    )
    def get(self, request: Request) -> Response:
        return Response(web_graph())


__all__ = ["MappingView", "StateView", "WebView"]
