"""The lineage page: a window of the commit graph across branches, and one snapshot in detail
(manifest, diff with its parent, the state of a key)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.core.cache import cache
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse

from controlplane.applications.models import Application
from controlplane.applications.selectors import application_get
from controlplane.errors import EpochalError, InvalidRequest, NotFound
from controlplane.jobs.selectors import job_list
from controlplane.lineage.errors import InvalidCursorError, UnknownRevisionError
from controlplane.lineage.models import Snapshot
from controlplane.lineage.selectors import (
    SnapshotSummary,
    branch_list,
    lineage_graph_page,
    refs_at,
    snapshot_children,
    snapshot_events,
    snapshot_get,
    snapshot_is_ancestor,
    snapshot_kind_counts,
    snapshot_log,
    snapshots_with_id_prefix,
    tag_count,
)
from controlplane.lineage.sink_status import sink_statuses, snapshot_sinks
from controlplane.lineage.state_reads import key_state_at
from controlplane.lineage.store_reads import snapshot_diff, snapshot_manifest_extras
from controlplane.operations.selectors import operation_find
from snapshots_store import StoreError
from web import graph
from web.access import viewer_required
from web.event_time import event_time_context
from web.views.base import domain_errors, is_htmx, page

PAGE_SIZES = (50, 100, 200, 500)
DEFAULT_PAGE = 100
EVENTS = 15
DIFF_ROWS = 40
KIND_COUNTS_TTL_S = 10  # counting a large lineage's commits by kind is the page's dearest query


def _refs_for(application: Application, ids: list[str]) -> dict[str, list[str]]:
    return refs_at(application=application, ids=ids)


def _resolve_at(application: Application, at: str) -> Snapshot | None:
    """A snapshot named by a full id, a unique id prefix (at least 6 hex), a branch or a tag."""
    at = at.strip()
    if not at:
        return None
    try:
        return snapshot_get(application=application, rev=at)
    except UnknownRevisionError:
        pass
    if len(at) >= 6 and all(c in "0123456789abcdef" for c in at):
        found = snapshots_with_id_prefix(application=application, prefix=at)
        if len(found) == 1:
            return found[0]
        if found:
            raise InvalidRequest(f"{at!r} is the start of several snapshot ids; type more of it")
    raise InvalidRequest(
        f"no snapshot, branch or tag {at!r} in {application.name}; paste a snapshot id (or its "
        "first 6+ characters), a branch or a tag name"
    )


def _window(
    application: Application, *, branch: str, cursor: str | None, limit: int
) -> tuple[list[SnapshotSummary], dict[str, list[str]], str | None]:
    if branch:
        log = snapshot_log(
            application=application, rev=f"heads/{branch}", limit=limit, cursor=cursor
        )
        ids = [s.snapshot_id for s in log.snapshots]
        return log.snapshots, _refs_for(application, ids), log.next_cursor
    page_ = lineage_graph_page(application=application, limit=limit, cursor=cursor)
    return page_.snapshots, page_.refs, page_.next_cursor


@viewer_required
@domain_errors
def lineage(request: HttpRequest, app: str) -> HttpResponse:
    application = application_get(name=app)
    branch = request.GET.get("branch", "").strip()
    cursor = request.GET.get("cursor") or None
    fold = request.GET.get("fold") == "1"
    problems: list[str] = []
    try:
        limit = int(request.GET.get("size", DEFAULT_PAGE))
    except ValueError:
        limit = DEFAULT_PAGE
    if limit not in PAGE_SIZES:
        limit = DEFAULT_PAGE
    branches = branch_list(application=application)
    if branch and branch not in {b.name for b in branches}:
        problems.append(f"{application.name} has no branch {branch!r}; showing every branch")
        branch = ""
    selected: Snapshot | None = None
    at = request.GET.get("at", "")
    if at:
        try:
            selected = _resolve_at(application, at)
        except InvalidRequest as exc:
            problems.append(exc.message)
        if selected is not None and cursor is None:
            # open the window a few rows above the selected snapshot
            above = f"{selected.generation + 3}:{'f' * 64}"
            cursor = above if branch else str(selected.pk + 4)
    try:
        snapshots, refs, next_cursor = _window(
            application, branch=branch, cursor=cursor, limit=limit
        )
    except (InvalidCursorError, UnknownRevisionError) as exc:
        problems.append(f"{exc}")
        cursor = None
        snapshots, refs, next_cursor = _window(application, branch=branch, cursor=None, limit=limit)
    drawing = graph.layout(snapshots, refs, fold=fold)
    # each sink's status per row: against the branch shown, else each row's own branch
    statuses = sink_statuses(
        application=application,
        snapshot_ids=[s.snapshot_id for s in snapshots],
        branch=branch or None,
    )
    kinds = cache.get_or_set(
        f"web:lineage-kinds:{application.pk}:{application.created_at.timestamp()}",
        lambda: snapshot_kind_counts(application=application),
        KIND_COUNTS_TTL_S,
    )
    events = snapshot_events(application=application, limit=EVENTS)
    context: dict[str, Any] = {
        "application": application,
        "layout": drawing,
        "svg": graph.svg(drawing),
        "rows": graph.rows_html(
            drawing,
            snapshot_url=reverse("web:snapshot", args=[application.name, "-"])[:-2],
            query=urlencode({k: v for k, v in (("branch", branch), ("size", limit)) if v}),
            unfold=urlencode(
                {k: v for k, v in (("branch", branch), ("size", limit), ("cursor", cursor)) if v}
            ),
            selected=selected.snapshot_id if selected else "",
            sinks=statuses.by_snapshot,
        ),
        "sink_names": statuses.names,
        "marks": graph.MARKS,
        "branch": branch,
        "branches": branches,
        "tags_count": tag_count(application=application),
        "kinds": kinds,
        "total": sum(kinds.values()),
        "events": events,
        "cursor": cursor,
        "next_cursor": next_cursor,
        "size": limit,
        "sizes": PAGE_SIZES,
        "fold": fold,
        "problems": problems,
        "selected": selected.snapshot_id if selected else "",
        "at": at,
    }
    if selected is not None:
        context.update(_snapshot_context(request, application, selected))
    return page(request, "web/lineage.html", context)


def _snapshot_context(
    request: HttpRequest, application: Application, snapshot: Snapshot
) -> dict[str, Any]:
    extras = snapshot_manifest_extras(application=application, snapshot_id=snapshot.snapshot_id)
    diff, diff_error = None, ""
    if snapshot.parent_ids:
        try:
            diff = snapshot_diff(application=application, snapshot=snapshot)
        except (StoreError, EpochalError) as exc:
            diff_error = f"the diff needs both manifests from the store: {exc}"
    children = snapshot_children(snapshot)
    operation = None
    if snapshot.operation_id:
        operation = operation_find(operation_id=snapshot.operation_id)
    rollback_jobs, savepoint_jobs = [], []
    for job in job_list(application=application.name):
        head = f"heads/{job.branch}"
        try:
            on_branch = snapshot_is_ancestor(
                application=application, ancestor=snapshot.snapshot_id, descendant=head
            )
            is_head = snapshot_get(application=application, rev=head).pk == snapshot.pk
        except UnknownRevisionError:
            continue
        if on_branch:
            savepoint_jobs.append(job)
            if not is_head:
                rollback_jobs.append(job)
    diff_changes = []
    if diff is not None:
        diff_changes = [("added", c) for c in diff.added] + [("changed", c) for c in diff.changed]
        diff_changes += [("removed", c) for c in diff.removed]
    return {
        "snapshot": snapshot,
        "extras": extras,
        "diff": diff,
        "diff_error": diff_error,
        "diff_changes": diff_changes[:DIFF_ROWS],
        "diff_more": max(0, len(diff_changes) - DIFF_ROWS),
        "children": children,
        "snapshot_refs": _refs_for(application, [snapshot.snapshot_id]).get(
            snapshot.snapshot_id, []
        ),
        "snapshot_operation": operation,
        "sink_statuses": [
            (name, status, *graph.SINK_LABELS.get(status, ("?", status, status)))
            for name, status in snapshot_sinks(application=application, snapshot=snapshot).items()
        ],
        "rollback_jobs": rollback_jobs,
        "savepoint_jobs": savepoint_jobs,
        "key_columns": (extras or {}).get("extra", {}).get("key") or [],
        "tasks": _task_rows((extras or {}).get("extra", {}).get("tasks")),
        **event_time_context(application, snapshot.snapshot_id if extras else None),
    }


def _task_rows(tasks: Any) -> list[dict[str, Any]]:
    """The epoch's tasks (manifest `extra.tasks`, written by the engine) with each one's busy
    time as a share of the busiest's: a task far above the others is the skew to look at."""
    if not isinstance(tasks, list):
        return []
    rows = [t for t in tasks if isinstance(t, dict)]
    busiest = max((float(t.get("busy_s") or 0) for t in rows), default=0.0)
    total = sum(int(t.get("records_in") or 0) for t in rows) or 1
    return [
        {
            **t,
            "busy_share": float(t.get("busy_s") or 0) / busiest if busiest else 0.0,
            "records_share": int(t.get("records_in") or 0) / total,
        }
        for t in rows
    ]


@viewer_required
@domain_errors
def snapshot_detail(request: HttpRequest, app: str, snapshot_id: str) -> HttpResponse:
    application = application_get(name=app)
    snapshot = snapshot_get(application=application, rev=snapshot_id)
    if not is_htmx(request):
        url = reverse("web:lineage", args=[application.name])
        return redirect(f"{url}?at={snapshot.snapshot_id}")
    context = {"application": application, **_snapshot_context(request, application, snapshot)}
    return page(request, "web/partials/snapshot.html", context)


@viewer_required
@domain_errors
def key_lookup(request: HttpRequest, app: str, snapshot_id: str) -> HttpResponse:
    application = application_get(name=app)
    snapshot = snapshot_get(application=application, rev=snapshot_id)
    key = request.GET.get("key", "")
    context: dict[str, Any] = {"application": application, "snapshot": snapshot, "key": key}
    try:
        context["state"] = key_state_at(
            application=application, snapshot_id=snapshot.snapshot_id, key=key
        )
    except (InvalidRequest, NotFound) as exc:
        context["lookup_error"] = exc.message
    status = 400 if "lookup_error" in context and not is_htmx(request) else 200
    if not is_htmx(request):
        return page(request, "web/key_lookup.html", context, status=status)
    return page(request, "web/partials/key_state.html", context)
