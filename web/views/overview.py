"""The overview: every job at a glance, with filters and alarms; live: the fragment follows
the change feed (any job or operation, `web.live`), and ages with the clock (lag, stalls)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse

from controlplane.api.conditional import matches
from controlplane.applications.selectors import application_names
from controlplane.jobs.health import job_health, stall_after_s
from controlplane.jobs.models import JobState
from controlplane.jobs.selectors import job_list
from controlplane.operations.selectors import OVERVIEW_KEYS, operation_list, overview_revision
from web.access import viewer_required
from web.live import WATCH_S, live_etag, not_modified, still_unchanged, watch_headers
from web.views.base import is_htmx, page

LEVELS = ("alarm", "warn", "ok", "idle")


@viewer_required
def overview(request: HttpRequest) -> HttpResponse:
    application = request.GET.get("application", "").strip()
    state = request.GET.get("state", "").strip()
    query = request.GET.get("q", "").strip()
    alarms_only = request.GET.get("alarms") == "1"
    revision = overview_revision()  # before what it describes: the ETag is never newer
    etag = live_etag("overview", "jobs", revision, ages=True)
    if is_htmx(request) and matches(request, etag):  # type: ignore[arg-type]
        if still_unchanged(request, OVERVIEW_KEYS, revision, read=overview_revision):
            return not_modified(etag)
        revision = overview_revision()
        etag = live_etag("overview", "jobs", revision, ages=True)
    problems = []
    if state and state not in JobState.values:
        problems.append(
            f"state {state!r} is not a job state; choose one of {list(JobState.values)}"
        )
        state = ""
    known = application_names()
    if application and application not in known:
        problems.append(f"there is no application {application!r}; showing every application")
        application = ""
    jobs = job_list(application=application or None, state=state or None, name_contains=query)
    health = job_health(jobs)
    counts = {level: sum(1 for h in health if h.level == level) for level in LEVELS}
    if alarms_only:
        health = [h for h in health if h.level in ("alarm", "warn")]
    context = {
        "health": health,
        "counts": counts,
        "filters": {"application": application, "state": state, "q": query, "alarms": alarms_only},
        "applications": known,
        "states": JobState.values,
        "problems": problems,
        "stall_after_s": stall_after_s(),
        "operations": list(operation_list()[:8]),
        "watch_headers": watch_headers(etag),
        "live_url": _live_url(request),
    }
    template = "web/partials/overview_live.html" if is_htmx(request) else "web/overview.html"
    response = page(request, template, context)
    response["ETag"] = etag
    return response


def _live_url(request: HttpRequest) -> str:
    """This page's fragment with the same filters, watched (`web.live.WATCH_S`)."""
    params = request.GET.copy()
    params["watch"] = str(WATCH_S)
    return f"{request.path}?{params.urlencode()}"
