"""Prometheus metrics at `/metrics`, read from the database at scrape time.

A custom collector queries PostgreSQL (or SQLite) on every scrape, so every web process
answers the same numbers whichever process or worker did the work. Reading needs a bearer
token equal to `EPOCHAL_METRICS_TOKEN`, or any authenticated user (API token or session).

Exported:

* ``epochal_jobs{state}`` — jobs by state;
* ``epochal_epochs_committed{application,branch}`` — epoch commits (kinds epoch and rescale)
  in the lineage index, by the branch they were committed on; ``epochal_branch_head_epoch``
  the epoch number at each branch head;
* ``epochal_commit_latency_seconds{application,quantile}`` and ``…_window`` — quantiles of
  the epoch time up to its commit point (manifest stats ``process_s``, written by the engine)
  over the most recent commits of each application (``EPOCHAL_METRICS_COMMIT_WINDOW``, 500);
* ``epochal_operations{kind,state}`` — operations by kind and state;
* ``epochal_operation_duration_seconds{kind}`` — a histogram of finished operations' durations.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Count
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from rest_framework import authentication, exceptions, renderers
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.api.base import audit_api_request
from controlplane.applications.models import Application
from controlplane.jobs.models import Job, JobState
from controlplane.lineage.models import Branch, Snapshot
from controlplane.operations.models import Operation, OperationKind, OperationState

DURATION_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
QUANTILES = (0.5, 0.9, 0.99)


def _quantile(ordered: list[float], q: float) -> float:
    rank = max(1, min(len(ordered), round(q * len(ordered) + 0.5)))
    return ordered[rank - 1]


class DatabaseCollector(Collector):
    """Reads the control plane's tables on every `collect()`."""

    def collect(self) -> Iterator[Metric]:
        yield from self._jobs()
        yield from self._epochs()
        yield from self._commit_latency()
        yield from self._operations()

    def _jobs(self) -> Iterator[Metric]:
        counts = dict(Job.objects.values_list("state").annotate(n=Count("id")).order_by())
        family = GaugeMetricFamily("epochal_jobs", "Jobs by state.", labels=["state"])
        for state in JobState.values:
            family.add_metric([state], counts.get(state, 0))
        yield family

    def _epochs(self) -> Iterator[Metric]:
        names = dict(Application.objects.values_list("id", "name"))
        committed = GaugeMetricFamily(
            "epochal_epochs_committed",
            "Epoch commits in the lineage index, by the branch they were committed on.",
            labels=["application", "branch"],
        )
        rows = (
            Snapshot.objects.filter(kind__in=("epoch", "rescale"))
            .values_list("application_id", "branch")
            .annotate(n=Count("id"))
            .order_by()
        )
        for app_id, branch, n in rows:
            committed.add_metric([names.get(app_id, str(app_id)), branch], n)
        yield committed
        heads = GaugeMetricFamily(
            "epochal_branch_head_epoch",
            "Epoch number of each branch head.",
            labels=["application", "branch"],
        )
        for app_id, branch, epoch in Branch.objects.filter(head__isnull=False).values_list(
            "application_id", "name", "head__epoch"
        ):
            heads.add_metric([names.get(app_id, str(app_id)), branch], epoch)
        yield heads

    def _commit_latency(self) -> Iterator[Metric]:
        window = int(settings.EPOCHAL_METRICS_COMMIT_WINDOW)
        latency = GaugeMetricFamily(
            "epochal_commit_latency_seconds",
            "Epoch time up to the commit point (manifest stats process_s), quantiles over "
            "the most recent commits of each application.",
            labels=["application", "quantile"],
        )
        size = GaugeMetricFamily(
            "epochal_commit_latency_window",
            "Recent commits with a process_s stat behind epochal_commit_latency_seconds.",
            labels=["application"],
        )
        table = connection.ops.quote_name(Snapshot._meta.db_table)
        for app_id, name in Application.objects.values_list("id", "name"):
            with connection.cursor() as cursor:
                cursor.execute(
                    f"SELECT stats FROM {table} WHERE application_id = %s "
                    "AND kind IN ('epoch', 'rescale') ORDER BY id DESC LIMIT %s",
                    [app_id, window],
                )
                # commits without timing (a restart rescale's metadata-only commit) have none
                found = sorted(
                    v for v in (_process_s(row[0]) for row in cursor.fetchall()) if v is not None
                )
            size.add_metric([name], len(found))
            for q in QUANTILES if found else ():
                latency.add_metric([name, str(q)], _quantile(found, q))
        yield latency
        yield size

    def _operations(self) -> Iterator[Metric]:
        counts = {
            (kind, state): n
            for kind, state, n in Operation.objects.values_list("kind", "state")
            .annotate(n=Count("id"))
            .order_by()
        }
        family = GaugeMetricFamily(
            "epochal_operations", "Operations by kind and state.", labels=["kind", "state"]
        )
        for kind in OperationKind.values:
            for state in OperationState.values:
                family.add_metric([kind, state], counts.get((kind, state), 0))
        yield family
        durations: dict[str, list[float]] = {kind: [] for kind in OperationKind.values}
        finished = Operation.objects.filter(
            started_at__isnull=False, finished_at__isnull=False
        ).values_list("kind", "started_at", "finished_at")
        for kind, started, ended in finished.iterator():
            durations.setdefault(kind, []).append(max(0.0, (ended - started).total_seconds()))
        histogram = HistogramMetricFamily(
            "epochal_operation_duration_seconds",
            "Durations of finished operations (started to finished).",
            labels=["kind"],
        )
        for kind, values in durations.items():
            buckets = [
                (str(bound), float(sum(1 for v in values if v <= bound)))
                for bound in DURATION_BUCKETS
            ]
            buckets.append(("+Inf", float(len(values))))
            histogram.add_metric([kind], buckets, sum_value=sum(values))
        yield histogram


def _process_s(raw: Any) -> float | None:
    stats = json.loads(raw) if isinstance(raw, str | bytes) else raw
    value = stats.get("process_s") if isinstance(stats, dict) else None
    return float(value) if isinstance(value, int | float) else None


def render_metrics() -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DatabaseCollector())
    return generate_latest(registry)


# -- the endpoint ----------------------------------------------------------------------------


class _MetricsToken:
    """Stands for the scraper that presented `EPOCHAL_METRICS_TOKEN`."""

    is_authenticated = True
    is_active = True
    is_superuser = False
    username = "metrics-token"

    def get_username(self) -> str:
        return self.username


class MetricsTokenAuthentication(authentication.BaseAuthentication):
    def authenticate(self, request: Request) -> tuple[Any, None] | None:
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        expected = str(settings.EPOCHAL_METRICS_TOKEN)
        if scheme.lower() != "bearer" or not token:
            return None
        if expected and hmac.compare_digest(token.strip().encode(), expected.encode()):
            return _MetricsToken(), None
        raise exceptions.AuthenticationFailed("invalid bearer token for /metrics")

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="metrics"'


class IsAuthenticated(BasePermission):
    def has_permission(self, request: Request, view: Any) -> bool:
        if not request.user or not request.user.is_authenticated:
            raise exceptions.NotAuthenticated()
        return True


class PrometheusRenderer(renderers.BaseRenderer):
    media_type = "text/plain"
    format = "txt"
    charset = "utf-8"

    def render(self, data: Any, accepted_media_type: Any = None, context: Any = None) -> bytes:
        if isinstance(data, bytes):
            return data
        return json.dumps(data).encode()


class AnyAccept(BaseContentNegotiation):
    """Prometheus asks for openmetrics or text: answer the text exposition format always."""

    def select_parser(self, request: Request, parsers: Any) -> Any:
        return parsers[0] if parsers else None

    def select_renderer(self, request: Request, renderers: Any, format_suffix: Any = None) -> Any:
        return renderers[0], renderers[0].media_type


class MetricsView(APIView):
    authentication_classes = [
        MetricsTokenAuthentication,
        authentication.TokenAuthentication,
        authentication.SessionAuthentication,
    ]
    permission_classes = [IsAuthenticated]
    renderer_classes = [PrometheusRenderer]
    content_negotiation_class = AnyAccept
    throttle_classes: list[Any] = []
    schema = None

    def get(self, request: Request) -> Response:
        return Response(render_metrics(), content_type=CONTENT_TYPE_LATEST)

    def finalize_response(
        self, request: Request, response: Response, *args: Any, **kwargs: Any
    ) -> Response:
        response = super().finalize_response(request, response, *args, **kwargs)
        if response.status_code >= 400:
            response.content_type = "application/json"  # the error body is JSON
        audit_api_request(request, response, source="metrics")
        return response
