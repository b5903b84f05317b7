"""Actions: each form requests the same operation as the REST API (`operation_request`, via
"web"), shows what it will do before it is confirmed, and hands over to the page that follows
its progress. Only operators see and use them; every request is in the audit log."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from controlplane.applications.models import Application
from controlplane.applications.selectors import application_get, version_list
from controlplane.applications.sinks import sink_list
from controlplane.audit.services import audit_request
from controlplane.errors import EpochalError, NotFound
from controlplane.jobs.health import job_health
from controlplane.jobs.models import Job
from controlplane.jobs.selectors import job_get
from controlplane.lineage.state_reads import key_group_sizes
from controlplane.operations.previews import rescale_preview, rollback_preview
from controlplane.operations.selectors import operation_get
from controlplane.operations.services import operation_cancel, operation_request
from web import forms
from web.access import operator_required
from web.views.base import domain_errors, error_page, is_htmx, page


@dataclass(frozen=True)
class Action:
    kind: str
    form: type[forms.ActionForm]
    title: str
    verb: str
    danger: bool = False
    what: str = ""


JOB_ACTIONS = {
    a.kind: a
    for a in (
        Action(
            "start",
            forms.StartForm,
            "Start",
            "Start the job",
            what="Launches the job from its branch head.",
        ),
        Action(
            "stop",
            forms.StopForm,
            "Stop",
            "Stop the job",
            danger=True,
            what="Stops at the next epoch boundary; the last commit is the restart point.",
        ),
        Action(
            "savepoint",
            forms.SavepointForm,
            "Savepoint",
            "Tag a savepoint",
            what="Tags a commit; tags keep it from retention.",
        ),
        Action(
            "rescale",
            forms.RescaleForm,
            "Rescale",
            "Rescale",
            what="Changes the parallelism; state moves by key groups, nothing is rehashed.",
        ),
        Action(
            "rollback",
            forms.RollbackForm,
            "Roll back",
            "Roll back",
            danger=True,
            what="Moves the branch back to an earlier snapshot and goes on from its state "
            "and offsets.",
        ),
        Action(
            "migrate",
            forms.MigrateForm,
            "Migrate",
            "Migrate",
            danger=True,
            what="Copies the lineage to another store, or rewrites state in a migration commit.",
        ),
    )
}
FORK = Action(
    "fork",
    forms.ForkForm,
    "Fork",
    "Fork",
    what="Creates a branch and a job from a snapshot, running an existing version, with "
    "provenance.",
)


def refused_form(request: HttpRequest, form: forms.ActionForm) -> None:
    """The fields a refused form names, for its audit row (`RefusalAuditMiddleware`)."""
    request._epochal_audit_detail = {  # type: ignore[attr-defined]
        "code": "invalid",
        "message": "; ".join(f"{k}: {' '.join(v)}" for k, v in form.errors.items())[:500],
        "fields": sorted(form.errors)[:20],
    }


def _initial(form_class: type[forms.ActionForm], request: HttpRequest) -> dict[str, Any]:
    return {k: v for k, v in request.GET.items() if k in form_class.base_fields}


def _request_operation(
    request: HttpRequest,
    form: forms.ActionForm,
    *,
    kind: str,
    application: Application,
    job: Job | None,
    target: str,
) -> tuple[Any, int]:
    """(operation or None, HTTP status); refusals become form errors in words."""
    try:
        requested = operation_request(
            kind=kind,
            application=application,
            job=job,
            params=form.params(),
            user=request.user,
            idempotency_key=form.cleaned_data.get("idempotency_key") or "",
            reason=form.cleaned_data.get("reason") or "",
            via="web",
        )
    except EpochalError as exc:
        for field, messages in exc.fields.items():
            on = form.field_for(field)
            if on is not None:
                form.add_error(on, [f"{field}: {m}" if on != field else m for m in messages])
        form.add_error(None, exc.message)
        audit_request(
            user=request.user,
            action=f"web {kind}",
            target=target,
            status_code=exc.http_status,
            source="web",
            detail={"code": exc.code, "message": exc.message[:500], "fields": sorted(exc.fields)},
        )
        request._epochal_audited = True  # type: ignore[attr-defined]
        return None, exc.http_status
    operation = requested.operation
    audit_request(
        user=request.user,
        action=f"web {kind}",
        target=target,
        status_code=202 if requested.created else 200,
        source="web",
        operation=operation,
        detail={"params": operation.params},
    )
    return operation, 202


def _preview(kind: str, job: Job, data: dict[str, Any]) -> dict[str, Any]:
    """What the action would do, from the form's current values ({} when nothing to show)."""
    try:
        if kind == "rescale" and str(data.get("parallelism", "")).strip():
            raw = str(data["parallelism"]).strip()
            parallelism: Any = int(raw) if raw.isdigit() else raw
            [health] = job_health([job], with_backlog=False)
            sizes = None
            if health.head is not None:
                try:
                    sizes = key_group_sizes(
                        application=job.application, snapshot_id=health.head.snapshot_id
                    ).bytes
                except NotFound:
                    sizes = None
            preview = rescale_preview(
                job=job, parallelism=parallelism, mode=data.get("mode") or "auto", sizes=sizes
            )
            return {"rescale": preview}
        if kind == "rollback" and str(data.get("to", "")).strip():
            return {"rollback": rollback_preview(job=job, to=str(data["to"]).strip())}
    except EpochalError as exc:
        return {"preview_error": exc.message}
    if kind in ("start", "stop", "savepoint"):
        [health] = job_health([job], with_backlog=False)
        return {"head": health.head}
    return {}


@operator_required
@domain_errors
@require_http_methods(["GET", "POST"])
def job_action(request: HttpRequest, name: str, kind: str) -> HttpResponse:
    action = JOB_ACTIONS.get(kind)
    if action is None:
        raise Http404(f"no action {kind!r}")
    job = job_get(name=name)
    status = 200
    if request.method == "POST":
        form = action.form(request.POST)
        if form.is_valid():
            operation, status = _request_operation(
                request,
                form,
                kind=kind,
                application=job.application,
                job=job,
                target=f"job {job.name}",
            )
            if operation is not None:
                return redirect(f"{reverse('web:job', args=[job.name])}?operation={operation.pk}")
        else:
            status = 400
            refused_form(request, form)
        data = dict(request.POST.items())
    else:
        form = action.form(initial=_initial(action.form, request))
        data = dict(request.GET.items())
    context = {"job": job, "application": job.application, "action": action, "form": form}
    context.update(_preview(kind, job, data))
    if is_htmx(request) and request.GET.get("preview") == "1":
        return page(request, "web/partials/preview.html", context)
    return page(request, "web/action.html", context, status=status)


@operator_required
@domain_errors
@require_http_methods(["GET", "POST"])
def fork(request: HttpRequest, app: str) -> HttpResponse:
    application = application_get(name=app)
    source_name = (request.POST if request.method == "POST" else request.GET).get("job", "")
    source = job_get(name=source_name) if source_name else None
    status = 200
    if request.method == "POST":
        form = forms.ForkForm(
            request.POST, versions=version_list(application=application), sinks=_sink_names()
        )
        if form.is_valid():
            operation, status = _request_operation(
                request,
                form,
                kind="fork",
                application=application,
                job=source,
                target=f"application {application.name}",
            )
            if operation is not None:
                return redirect("web:operation", operation_id=operation.pk)
        else:
            status = 400
            refused_form(request, form)
    else:
        initial = _initial(forms.ForkForm, request)
        if "snapshot" in initial and "branch" not in initial:
            initial["branch"] = f"fork-{initial['snapshot'][:8]}"
        form = forms.ForkForm(
            initial=initial, versions=version_list(application=application), sinks=_sink_names()
        )
    context = {
        "application": application,
        "source_job": source,
        "action": FORK,
        "form": form,
    }
    return page(request, "web/action.html", context, status=status)


@operator_required
@domain_errors
@require_POST
def operation_cancel_view(request: HttpRequest, operation_id: str) -> HttpResponse:
    operation = operation_get(operation_id=operation_id)
    try:
        operation_cancel(operation=operation, user=request.user)
    except EpochalError as exc:
        audit_request(
            user=request.user,
            action="web cancel",
            target=f"operation {operation.pk}",
            status_code=exc.http_status,
            source="web",
            operation=operation,
            detail={"code": exc.code, "message": exc.message[:500]},
        )
        request._epochal_audited = True  # type: ignore[attr-defined]
        return error_page(request, exc.message, status=exc.http_status)
    audit_request(
        user=request.user,
        action="web cancel",
        target=f"operation {operation.pk}",
        status_code=200,
        source="web",
        operation=operation,
    )
    return redirect("web:operation", operation_id=operation.pk)


def _sink_names() -> list[str]:
    """The registered sinks an operator may give a fork."""
    return [sink.name for sink in sink_list()]
