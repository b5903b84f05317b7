"""Routes under /api/ (namespace ``api``)."""

from __future__ import annotations

from django.urls import path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from controlplane.api.views import (
    applications,
    audit,
    autoscaler,
    jobs,
    lineage,
    operations,
    registry,
    root,
    savepoints,
    tokens,
    users,
    webs,
)

app_name = "api"

urlpatterns = [
    path("", root.ApiRootView.as_view(), name="root"),
    # applications, versions
    path("applications/", applications.ApplicationListView.as_view(), name="application-list"),
    path(
        "applications/<str:name>/",
        applications.ApplicationDetailView.as_view(),
        name="application-detail",
    ),
    path(
        "applications/<str:name>/versions/",
        applications.VersionListView.as_view(),
        name="version-list",
    ),
    path(
        "applications/<str:name>/versions/<int:number>/",
        applications.VersionDetailView.as_view(),
        name="version-detail",
    ),
    path("entry-points/", registry.EntryPointListView.as_view(), name="entry-point-list"),
    path("stores/", registry.StoreListView.as_view(), name="store-list"),
    # lineage
    path("applications/<str:name>/branches/", lineage.BranchListView.as_view(), name="branch-list"),
    path("applications/<str:name>/tags/", lineage.TagListView.as_view(), name="tag-list"),
    path(
        "applications/<str:name>/snapshots/",
        lineage.SnapshotLogView.as_view(),
        name="snapshot-list",
    ),
    path(
        "applications/<str:name>/snapshots/<str:snapshot_id>/",
        lineage.SnapshotDetailView.as_view(),
        name="snapshot-detail",
    ),
    path(
        "applications/<str:name>/snapshots/<str:snapshot_id>/diff/",
        lineage.SnapshotDiffView.as_view(),
        name="snapshot-diff",
    ),
    path("applications/<str:name>/lineage/", lineage.LineageGraphView.as_view(), name="lineage"),
    path("applications/<str:name>/state/", webs.StateView.as_view(), name="state"),
    path("applications/<str:name>/mapping/", webs.MappingView.as_view(), name="mapping"),
    path(
        "applications/<str:name>/operations/",
        operations.ApplicationOperationRequestView.as_view(),
        name="application-operations",
    ),
    # jobs
    path("jobs/", jobs.JobListView.as_view(), name="job-list"),
    path("jobs/<str:name>/", jobs.JobDetailView.as_view(), name="job-detail"),
    path("jobs/<str:name>/runs/", jobs.JobRunListView.as_view(), name="job-runs"),
    path("jobs/<str:name>/logs/", jobs.JobLogsView.as_view(), name="job-logs"),
    path(
        "jobs/<str:name>/autoscaler/",
        autoscaler.JobAutoscalerView.as_view(),
        name="job-autoscaler",
    ),
    path(
        "jobs/<str:name>/savepoint-schedule/",
        savepoints.JobSavepointScheduleView.as_view(),
        name="job-savepoint-schedule",
    ),
    path(
        "jobs/<str:name>/operations/",
        operations.JobOperationRequestView.as_view(),
        name="job-operations",
    ),
    path("web/", webs.WebView.as_view(), name="web"),
    # operations, audit, users
    path("operations/", operations.OperationListView.as_view(), name="operation-list"),
    path(
        "operations/<str:operation_id>/",
        operations.OperationDetailView.as_view(),
        name="operation-detail",
    ),
    path(
        "operations/<str:operation_id>/cancel/",
        operations.OperationCancelView.as_view(),
        name="operation-cancel",
    ),
    path("audit/", audit.AuditListView.as_view(), name="audit-list"),
    path("users/", users.UserListView.as_view(), name="user-list"),
    path("users/<str:username>/", users.UserDetailView.as_view(), name="user-detail"),
    path("tokens/", tokens.TokenListView.as_view(), name="token-list"),
    path("tokens/<int:token_id>/", tokens.TokenDetailView.as_view(), name="token-detail"),
    path("tokens/<int:token_id>/rotate/", tokens.TokenRotateView.as_view(), name="token-rotate"),
    # the schema and its browsable documentation (assets from our own static files)
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="api:schema"), name="docs"),
    path("redoc/", SpectacularRedocView.as_view(url_name="api:schema"), name="redoc"),
    re_path(r"^[\s\S]*$", root.UnknownPathView.as_view(), name="unknown"),  # newlines too
]
