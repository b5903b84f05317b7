"""The job page: live charts, key groups and their tasks, the running operation, commits; and
its tabs: exceptions across restarts, the driver's live log, the checkpoint history."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.utils import timezone
from django.utils.html import json_script
from django.views.decorators.http import require_POST

from controlplane.api.conditional import matches
from controlplane.audit.services import audit_request
from controlplane.autoscaler.selectors import latest_decision
from controlplane.autoscaler.services import policy_of
from controlplane.changes.keys import job_key
from controlplane.changes.selectors import named_revision
from controlplane.errors import InvalidRequest, NotFound
from controlplane.jobs.health import job_health
from controlplane.jobs.logs import job_exceptions, log_lines
from controlplane.jobs.models import Job, Run
from controlplane.jobs.selectors import (
    job_current_run,
    job_get,
    job_not_found,
    job_run_get,
    job_run_list,
)
from controlplane.jobs.services import job_set_savepoint_schedule
from controlplane.lineage.epoch_stats import epoch_series
from controlplane.lineage.event_time import watermark_lag_s
from controlplane.lineage.selectors import tag_list
from controlplane.lineage.state_reads import KeyGroupSizes, key_group_sizes
from controlplane.operations.selectors import operation_list
from web import charts, forms
from web.access import operator_required, viewer_required
from web.event_time import event_time_context
from web.live import live_etag, not_modified, still_unchanged, watch_headers
from web.views.base import domain_errors, is_htmx, page

CHART_EPOCHS = 200
RECENT_COMMITS = 12


def job_context(job: Job) -> dict[str, Any]:
    """Everything the job page and its live refresh show."""
    [health] = job_health([job])
    points = epoch_series(application=job.application, branch=job.branch, limit=CHART_EPOCHS)
    operations = list(operation_list(job=job.name)[:30])
    head = health.head
    sizes: KeyGroupSizes | None = None
    state_note = ""
    if head is not None:
        try:
            sizes = key_group_sizes(application=job.application, snapshot_id=head.snapshot_id)
        except NotFound as exc:
            state_note = exc.message
        if sizes is not None and sizes.missing:
            state_note = (
                f"{sizes.missing} state chunk(s) of the head are missing from the store: "
                "run `python -m snapshots_store fsck`"
            )
    parallelism = head.parallelism if head is not None else job.parallelism
    max_parallelism = head.max_parallelism if head is not None else job.application.max_parallelism
    figures = charts.job_figures(points, operations, sizes, parallelism, max_parallelism)
    last = points[-1] if points else None
    timed = next((p for p in reversed(points) if p.watermark_ms is not None), None)
    return {
        **event_time_context(job.application, sizes.snapshot_id if sizes else None),
        "watermark_point": timed,
        "event_time_job": any(p.event_time for p in points),
        "watermark_now_lag_s": watermark_lag_s(
            timed.watermark_ms if timed else None, timezone.now()
        ),
        "job": job,
        "health": health,
        "head": head,
        "last": last,
        "run": job_current_run(job),
        "operation": health.operation,
        "recent_operations": [op for op in operations if not op.active][:6],
        "commits": list(reversed(points[-RECENT_COMMITS:])),
        "sizes": sizes,
        "state_note": state_note,
        "allocation_parallelism": parallelism,
        "max_parallelism": max_parallelism,
        "figures": json_script(figures, "chart-data"),
        "chart_config": json_script(charts.CONFIG, "chart-config"),
        "autoscale_policy": policy_of(job),
        "autoscale_decision": latest_decision(job),
    }


def _job_revision(name: str) -> tuple[int, int, str]:
    """(id, revision, ETag of the live parts) of job `name`, read before what they show."""
    found = named_revision(table=Job._meta.db_table, name=name, prefix="job")
    if found is None:
        raise job_not_found(name)
    job_id, revision = found
    return job_id, revision, live_etag("job", job_id, revision, ages=True)


@viewer_required
@domain_errors
def job_detail(request: HttpRequest, name: str) -> HttpResponse:
    _, _, etag = _job_revision(name)
    context = {**job_context(job_get(name=name)), "watch_headers": watch_headers(etag)}
    return page(request, "web/job.html", context)


@viewer_required
@domain_errors
def job_live(request: HttpRequest, name: str) -> HttpResponse:
    """The page's live parts, swapped in out of band (one request refreshes them all), once
    the job, its run, operation or branch head changed (or they aged; see web/live.py)."""
    job_id, revision, etag = _job_revision(name)
    if matches(request, etag):  # type: ignore[arg-type]
        if still_unchanged(request, job_key(job_id), revision):
            return not_modified(etag)
        job_id, revision, etag = _job_revision(name)
    context = {**job_context(job_get(name=name)), "watch_headers": watch_headers(etag)}
    response = page(request, "web/partials/job_live.html", context)
    response["ETag"] = etag
    return response


# -- the job's other tabs: exceptions, the driver's log, checkpoint history ------------------

LOG_TAIL = 500


@viewer_required
@domain_errors
def job_exceptions_view(request: HttpRequest, name: str) -> HttpResponse:
    """Why the job's runs ended badly, across restarts: reason, traceback, abandoned epoch;
    and the operations on it that failed."""
    job = job_get(name=name)
    context = {
        "job": job,
        "tab": "exceptions",
        "exceptions": job_exceptions(job),
        "failed_operations": list(operation_list(job=job.name, state="failed")[:20]),
    }
    return page(request, "web/job_exceptions.html", context)


def _log_run(job: Job, run_id: str) -> Run | None:
    return job_run_get(job, run_id=run_id) if run_id else job_current_run(job)


@viewer_required
@domain_errors
def job_log_view(request: HttpRequest, name: str) -> HttpResponse:
    """The driver's log of a run (default: the newest), its last lines, filtered by a search;
    `follow` refreshes them every 2 s (the fragment alone for htmx)."""
    job = job_get(name=name)
    run_id = request.GET.get("run", "").strip()
    search = request.GET.get("q", "").strip()
    follow = request.GET.get("follow", "1") == "1"
    run = _log_run(job, run_id)
    lines = [] if run is None else log_lines(run, tail=LOG_TAIL, search=search)
    context = {
        "job": job,
        "tab": "log",
        "run": run,
        "runs": list(job_run_list(job)[:30]),
        "lines": lines,
        "search": search,
        "follow": follow,
        "tail": LOG_TAIL,
    }
    template = "web/partials/job_log_lines.html" if is_htmx(request) else "web/job_log.html"
    return page(request, template, context)


@viewer_required
@domain_errors
def job_log_download(request: HttpRequest, name: str) -> HttpResponse:
    """The whole log the launcher keeps of a run, as a text file."""
    job = job_get(name=name)
    run = _log_run(job, request.GET.get("run", "").strip())
    text = "" if run is None else "\n".join(log_lines(run)) + "\n"
    response = HttpResponse(text, content_type="text/plain; charset=utf-8")
    filename = f"{job.name}-{run.run_id if run else 'no-run'}.log"
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


@viewer_required
@domain_errors
def job_checkpoints_view(request: HttpRequest, name: str) -> HttpResponse:
    """Every commit of the branch (epochs, rescales, rollbacks …) with its size and timing,
    the savepoints (tags) among them, and the epochs runs began and never committed."""
    job = job_get(name=name)
    points = list(reversed(epoch_series(application=job.application, branch=job.branch, limit=500)))
    tags: dict[str, list[str]] = {}
    for tag in tag_list(application=job.application):
        if tag.target is not None:
            tags.setdefault(tag.target.snapshot_id, []).append(tag.name)
    failed = [e for e in job_exceptions(job) if e.abandoned_epoch is not None]
    durations = [p.process_s for p in points if p.process_s is not None]
    context = {
        "job": job,
        "tab": "checkpoints",
        "points": points,
        "event_time_job": any(p.event_time for p in points),
        "tags": tags,
        "failed": failed,
        "summary": {
            "count": len(points),
            "savepoints": sum(1 for p in points if p.snapshot_id in tags),
            "failed": len(failed),
            "bytes": sum(p.bytes_written for p in points),
            "longest_s": max(durations) if durations else None,
        },
        "schedule_form": forms.SavepointScheduleForm(
            initial={"interval_s": job.savepoint_interval_s, "retention": job.savepoint_retention}
        ),
    }
    return page(request, "web/job_checkpoints.html", context)


@operator_required
@require_POST
@domain_errors
def job_savepoint_schedule(request: HttpRequest, name: str) -> HttpResponse:
    """Change the job's periodic savepoints from the checkpoints tab (operators; audited)."""
    job = job_get(name=name)
    form = forms.SavepointScheduleForm(request.POST)
    if not form.is_valid():
        raise InvalidRequest(
            f"periodic savepoints of {job.name} refused: {dict(form.errors)}",
            fields={k: [str(m) for m in v] for k, v in form.errors.items()},
        )
    interval_s, retention = form.cleaned_data["interval_s"], form.cleaned_data["retention"]
    job_set_savepoint_schedule(job, interval_s=interval_s, retention=retention)
    audit_request(
        user=request.user,
        action="web savepoint-schedule",
        target=f"job:{job.name}",
        status_code=200,
        source="web",
        detail={"interval_s": interval_s, "retention": retention},
    )
    return redirect("web:job-checkpoints", name=job.name)
