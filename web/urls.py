from django.contrib.auth import views as auth_views
from django.urls import path

from web.views import actions, applications, audit, base, jobs, lineage, operations, overview, webs

app_name = "web"
urlpatterns = [
    path("", overview.overview, name="overview"),
    path("healthz", base.healthz, name="healthz"),
    path(
        "login/",
        auth_views.LoginView.as_view(
            template_name="web/login.html", redirect_authenticated_user=True
        ),
        name="login",
    ),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("jobs/<str:name>/", jobs.job_detail, name="job"),
    path("jobs/<str:name>/live/", jobs.job_live, name="job-live"),
    path("jobs/<str:name>/exceptions/", jobs.job_exceptions_view, name="job-exceptions"),
    path("jobs/<str:name>/log/", jobs.job_log_view, name="job-log"),
    path("jobs/<str:name>/log/download/", jobs.job_log_download, name="job-log-download"),
    path("jobs/<str:name>/checkpoints/", jobs.job_checkpoints_view, name="job-checkpoints"),
    path(
        "jobs/<str:name>/savepoint-schedule/",
        jobs.job_savepoint_schedule,
        name="job-savepoint-schedule",
    ),
    path("jobs/<str:name>/<str:kind>/", actions.job_action, name="job-action"),
    path("applications/<str:app>/", applications.application_detail, name="application"),
    path(
        "applications/<str:app>/versions/<int:number>/",
        applications.version_detail,
        name="version",
    ),
    path("applications/<str:app>/lineage/", lineage.lineage, name="lineage"),
    path(
        "applications/<str:app>/snapshots/<str:snapshot_id>/",
        lineage.snapshot_detail,
        name="snapshot",
    ),
    path(
        "applications/<str:app>/snapshots/<str:snapshot_id>/key/",
        lineage.key_lookup,
        name="key-lookup",
    ),
    path("applications/<str:app>/fork/", actions.fork, name="fork"),
    path("operations/", operations.operations, name="operations"),
    path("operations/<str:operation_id>/", operations.operation_detail, name="operation"),
    path(
        "operations/<str:operation_id>/cancel/",
        actions.operation_cancel_view,
        name="operation-cancel",
    ),
    path("audit/", audit.audit, name="audit"),
    path("web/", webs.job_web, name="job-web"),
]
