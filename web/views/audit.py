"""The audit log: who asked for what, when, and how it ended; filtered, newest first."""

from __future__ import annotations

from datetime import UTC, datetime, time

from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from controlplane.audit.models import AuditKind
from controlplane.audit.selectors import audit_list
from controlplane.errors import InvalidRequest
from web.access import viewer_required
from web.views.base import page

PAGE = 50


def _moment(raw: str, name: str, problems: list[str]) -> datetime | None:
    raw = raw.strip()
    if not raw:
        return None
    moment = parse_datetime(raw)
    if moment is None:
        day = parse_date(raw)
        moment = None if day is None else datetime.combine(day, time.min)
    if moment is None:
        problems.append(f"{name} {raw!r} is not a date (YYYY-MM-DD) or date and time")
        return None
    return moment if timezone.is_aware(moment) else timezone.make_aware(moment, UTC)


@viewer_required
def audit(request: HttpRequest) -> HttpResponse:
    get = request.GET
    problems: list[str] = []
    kind = get.get("kind", "").strip()
    if kind and kind not in AuditKind.values:
        problems.append(f"kind {kind!r} is not one of {list(AuditKind.values)}")
        kind = ""
    before = get.get("before", "")
    before_id = int(before) if before.isdigit() else None
    since = _moment(get.get("since", ""), "since", problems)
    until = _moment(get.get("until", ""), "until", problems)
    try:
        entries = audit_list(
            actor=get.get("actor", "").strip() or None,
            action=get.get("action", "").strip() or None,
            kind=kind or None,
            operation=get.get("operation", "").strip() or None,
            since=since,
            until=until,
            before_id=before_id,
        )
    except InvalidRequest as exc:
        problems.append(exc.message)
        entries = audit_list(before_id=before_id)
    rows = list(entries[: PAGE + 1])
    more = len(rows) > PAGE
    rows = rows[:PAGE]
    query = get.copy()
    query.pop("before", None)
    context = {
        "entries": rows,
        "next_before": rows[-1].pk if more and rows else None,
        "filters": {
            k: get.get(k, "") for k in ("actor", "action", "kind", "operation", "since", "until")
        },
        "kinds": AuditKind.values,
        "query": query.urlencode(),
        "problems": problems,
    }
    return page(request, "web/audit.html", context)
