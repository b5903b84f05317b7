"""Top-level URL routes."""

from django.contrib import admin
from django.urls import include, path

from controlplane.api.metrics import MetricsView

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/", include("controlplane.api.urls")),
    path("metrics", MetricsView.as_view(), name="metrics"),
    path("", include("web.urls")),
]

# Our own pages, with or without DEBUG (web/views/base.py)
handler404 = "web.views.base.not_found"
handler500 = "web.views.base.server_error"
