"""An application (versions, jobs, branches, tags) and one application version."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse

from controlplane.applications.selectors import (
    application_get,
    version_children,
    version_get,
    version_list,
)
from controlplane.jobs.health import job_health
from controlplane.jobs.selectors import job_list
from controlplane.lineage.selectors import (
    branch_list,
    snapshot_count,
    snapshot_find,
    tag_list,
)
from web.access import viewer_required
from web.views.base import domain_errors, page


@viewer_required
@domain_errors
def application_detail(request: HttpRequest, app: str) -> HttpResponse:
    application = application_get(name=app)
    context = {
        "application": application,
        "versions": list(version_list(application=application))[::-1],  # newest first
        "health": job_health(job_list(application=application.name), with_backlog=False),
        "branches": branch_list(application=application),
        "tags": tag_list(application=application),
        "snapshots": snapshot_count(application=application),
    }
    return page(request, "web/application.html", context)


@viewer_required
@domain_errors
def version_detail(request: HttpRequest, app: str, number: int) -> HttpResponse:
    application = application_get(name=app)
    version = version_get(application=application, number=number)
    source = None
    if version.source_snapshot_id:
        source = snapshot_find(application=application, snapshot_id=version.source_snapshot_id)
    context = {
        "application": application,
        "version": version,
        "source": source,
        "children": version_children(version),
        "health": job_health(job_list(version=version), with_backlog=False),
        "config": version.config,
    }
    return page(request, "web/version.html", context)
