"""An application (versions, jobs, branches, tags) and one application version."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse

from controlplane.applications.selectors import application_get, version_get, version_list
from controlplane.jobs.health import job_health
from controlplane.jobs.models import Job
from controlplane.lineage.models import Snapshot
from controlplane.lineage.selectors import branch_list, tag_list
from web.access import viewer_required
from web.views.base import domain_errors, page


@viewer_required
@domain_errors
def application_detail(request: HttpRequest, app: str) -> HttpResponse:
    application = application_get(name=app)
    jobs = Job.objects.filter(application=application).select_related("application", "version")
    context = {
        "application": application,
        "versions": list(version_list(application=application).order_by("-number")),
        "health": job_health(jobs.order_by("name"), with_backlog=False),
        "branches": branch_list(application=application),
        "tags": tag_list(application=application),
        "snapshots": Snapshot.objects.filter(application=application).count(),
    }
    return page(request, "web/application.html", context)


@viewer_required
@domain_errors
def version_detail(request: HttpRequest, app: str, number: int) -> HttpResponse:
    application = application_get(name=app)
    version = version_get(application=application, number=number)
    source = None
    if version.source_snapshot_id:
        source = Snapshot.objects.filter(
            application=application, snapshot_id=version.source_snapshot_id
        ).first()
    jobs = Job.objects.filter(version=version).select_related("application", "version")
    context = {
        "application": application,
        "version": version,
        "source": source,
        "children": list(version.children.order_by("number")),
        "health": job_health(jobs.order_by("name"), with_backlog=False),
        "config": version.config,
    }
    return page(request, "web/version.html", context)
