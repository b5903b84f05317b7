"""Prometheus metrics at `/metrics`, read from the database at scrape time.

Custom `prometheus_client` collectors query PostgreSQL (or SQLite) on every scrape, so every
web process answers the same numbers whichever process or worker did the work. A scrape costs
a constant number of queries however many applications, jobs or commits exist (one query per
family or two; the recent commits of every application in one windowed query). Reading needs
a bearer token equal to `EPOCHAL_METRICS_TOKEN`, or any authenticated user (API token or
session). The families and example alert rules: docs/metrics.md.
"""

from __future__ import annotations

import hmac
import json
import time
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Count, Max, Min
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from rest_framework import authentication, exceptions, renderers
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.api.authentication import ApiTokenAuthentication
from controlplane.api.base import audit_api_request
from controlplane.applications.models import Application
from controlplane.audit.rejections import rejection_totals
from controlplane.autoscaler.models import AutoscaleDecision
from controlplane.jobs.models import Job, JobState
from controlplane.jobs.selectors import runs_watched_at
from controlplane.lineage.event_time import event_time_stats
from controlplane.lineage.models import Branch, Snapshot
from controlplane.operations.executor import QUEUED
from controlplane.operations.models import Operation, OperationKind, OperationState
from controlplane.operations.webs import head_inputs
from runners.engine.fan_in import flatten_inputs

DURATION_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
COMMIT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
QUANTILES = (0.5, 0.9, 0.99)
#: the label naming a job: not `job`, which Prometheus sets to the scrape job's name (a target's
#: own `job` label would become `exported_job` and the alerts could not name the job)
JOB_LABEL = "job_name"


def _quantile(ordered: list[float], q: float) -> float:
    rank = max(1, min(len(ordered), round(q * len(ordered) + 0.5)))
    return ordered[rank - 1]


def _stats(raw: Any) -> dict[str, Any]:
    stats = json.loads(raw) if isinstance(raw, str | bytes) else raw
    return stats if isinstance(stats, dict) else {}


def _number(stats: dict[str, Any], name: str) -> float | None:
    value = stats.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _histogram(values: list[float], bounds: tuple[float, ...]) -> list[tuple[str, float]]:
    buckets = [(str(b), float(sum(1 for v in values if v <= b))) for b in bounds]
    buckets.append(("+Inf", float(len(values))))
    return buckets


class DatabaseCollector(Collector):
    """Reads the control plane's tables on every `collect()`."""

    def collect(self) -> Iterator[Metric]:
        apps = {
            app_id: (name, namespace, store_url or settings.EPOCHAL_STORE_URL)
            for app_id, name, namespace, store_url in Application.objects.values_list(
                "id", "name", "store_namespace", "store__url"
            )
        }
        names = {app_id: app[0] for app_id, app in apps.items()}
        jobs = list(
            Job.objects.values_list(
                "id", "name", "application_id", "branch", "state", "parallelism"
            )
        )
        heads = {
            (app_id, branch): (epoch, _stats(stats), snapshot_id)
            for app_id, branch, epoch, stats, snapshot_id in Branch.objects.filter(
                head__isnull=False
            ).values_list(
                "application_id", "name", "head__epoch", "head__stats", "head__snapshot_id"
            )
        }
        yield from self._jobs(jobs)
        yield from self._epochs(names, heads)
        yield from self._commits(names)
        yield from self._lag(apps, jobs, heads)
        yield from self._operations()
        yield from self._autoscaler()

    def _jobs(self, jobs: list[tuple[Any, ...]]) -> Iterator[Metric]:
        family = GaugeMetricFamily("epochal_jobs", "Jobs by state.", labels=["state"])
        counts: dict[str, int] = {}
        for job in jobs:
            counts[job[4]] = counts.get(job[4], 0) + 1
        for state in JobState.values:
            family.add_metric([state], counts.get(state, 0))
        yield family
        parallelism = GaugeMetricFamily(
            "epochal_job_parallelism", "Each job's configured parallelism.", labels=[JOB_LABEL]
        )
        for job in jobs:
            parallelism.add_metric([job[1]], job[5])
        yield parallelism

    def _epochs(
        self, names: dict[Any, str], heads: dict[tuple[Any, str], tuple[int, Any, str]]
    ) -> Iterator[Metric]:
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
        family = GaugeMetricFamily(
            "epochal_branch_head_epoch",
            "Epoch number of each branch head.",
            labels=["application", "branch"],
        )
        for (app_id, branch), (epoch, _, _) in sorted(heads.items(), key=str):
            family.add_metric([names.get(app_id, str(app_id)), branch], epoch)
        yield family

    def _commits(self, names: dict[Any, str]) -> Iterator[Metric]:
        """The newest `EPOCHAL_METRICS_COMMIT_WINDOW` epoch commits of every application, in
        one windowed query: latency quantiles and a histogram of their durations."""
        window = int(settings.EPOCHAL_METRICS_COMMIT_WINDOW)
        table = connection.ops.quote_name(Snapshot._meta.db_table)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT application_id, stats FROM (SELECT application_id, stats, ROW_NUMBER() "
                "OVER (PARTITION BY application_id ORDER BY id DESC) AS n "
                f"FROM {table} WHERE kind IN ('epoch', 'rescale')) recent WHERE n <= %s",
                [window],
            )
            rows = cursor.fetchall()
        values: dict[Any, list[float]] = {app_id: [] for app_id in names}
        for app_id, raw in rows:
            # commits without timing (a restart rescale's metadata-only commit) have none
            value = _number(_stats(raw), "process_s")
            if value is not None:
                values.setdefault(app_id, []).append(value)
        latency = GaugeMetricFamily(
            "epochal_commit_latency_seconds",
            "Epoch time up to the commit point (manifest stats process_s), percentiles over "
            "the most recent commits of each application.",
            labels=["application", "percentile"],
        )
        size = GaugeMetricFamily(
            "epochal_commit_latency_window",
            "Recent commits with a process_s stat behind epochal_commit_latency_seconds.",
            labels=["application"],
        )
        histogram = HistogramMetricFamily(
            "epochal_commit_duration_seconds",
            "Epoch time up to the commit point (process_s) of the most recent commits of each "
            "application (EPOCHAL_METRICS_COMMIT_WINDOW).",
            labels=["application"],
        )
        for app_id, found in sorted(values.items(), key=lambda kv: names.get(kv[0], "")):
            name = names.get(app_id, str(app_id))
            found.sort()
            size.add_metric([name], len(found))
            for q in QUANTILES if found else ():
                latency.add_metric([name, f"{q * 100:g}"], _quantile(found, q))
            histogram.add_metric(
                [name], _histogram(found, COMMIT_BUCKETS), sum_value=round(sum(found), 6)
            )
        yield latency
        yield size
        yield histogram

    def _lag(
        self,
        apps: dict[Any, tuple[str, str, str]],
        jobs: list[tuple[Any, ...]],
        heads: dict[tuple[Any, str], tuple[int, Any, str]],
    ) -> Iterator[Metric]:
        """Lag from each job's head commit: the backlog its source reported (epochs,
        records), and per job-web edge the upstream epochs committed but not read yet."""
        lag_epochs = GaugeMetricFamily(
            "epochal_job_lag_epochs",
            "Epochs of input waiting after the job's head commit (its source's backlog, or "
            "for a job reading other jobs' outputs the largest edge lag).",
            labels=[JOB_LABEL, "application"],
        )
        lag_records = GaugeMetricFamily(
            "epochal_job_lag_records",
            "Records waiting after the job's head commit (sources that can count them).",
            labels=[JOB_LABEL, "application"],
        )
        edge_lag = GaugeMetricFamily(
            "epochal_web_edge_lag_epochs",
            "Upstream epochs committed on the upstream job's branch and not read yet by the "
            "downstream job.",
            labels=["upstream", "downstream", "source"],
        )
        sink_lag = GaugeMetricFamily(
            "epochal_job_sink_lag_epochs",
            "Epochs of the job's branch its sinks' destinations had not written at its head "
            "commit (a destination down: the job goes on, the sink catches up in order).",
            labels=[JOB_LABEL, "application"],
        )
        sink_lag_s = GaugeMetricFamily(
            "epochal_job_sink_lag_seconds",
            "Seconds since the oldest epoch a sink's destination lacked was committed, at the "
            "job's head commit.",
            labels=[JOB_LABEL, "application"],
        )
        watermark_lag = GaugeMetricFamily(
            "epochal_job_watermark_lag_seconds",
            "Wall time minus the event-time watermark of the job's head commit (event-time "
            "jobs: manifest stat watermark_ms).",
            labels=[JOB_LABEL, "application"],
        )
        late = GaugeMetricFamily(
            "epochal_job_late_records",
            "Records the job's head epoch dropped as later than its watermark.",
            labels=[JOB_LABEL, "application"],
        )
        now = time.time()
        by_location = {(apps[j[2]][1], j[3]): j for j in jobs if j[2] in apps}
        for _id, name, app_id, branch, _state, _p in jobs:
            head = heads.get((app_id, branch))
            if head is None or app_id not in apps:
                continue
            app, namespace, app_store = apps[app_id]
            _epoch, stats, snapshot_id = head
            edges: list[int] = []
            inputs = head_inputs(app_store, namespace, snapshot_id)
            for source, doc in flatten_inputs(inputs):
                upstream = by_location.get((doc.get("namespace"), doc.get("branch")))
                if upstream is None:
                    continue
                up_head = heads.get((upstream[2], upstream[3]))
                read = doc.get("epochs") or []
                last_read = max([int(e) for e in read] or [int(doc.get("after_epoch") or 0)])
                lag = max(0, (up_head[0] if up_head else 0) - last_read)
                edges.append(lag)
                edge_lag.add_metric([upstream[1], name, source], lag)
            backlog = _number(stats, "backlog_epochs")
            if backlog is not None or edges:
                lag_epochs.add_metric([name, app], backlog if backlog is not None else max(edges))
            records = _number(stats, "backlog_records")
            if records is not None:
                lag_records.add_metric([name, app], records)
            behind = _number(stats, "sink_lag_epochs")
            if behind is not None:
                sink_lag.add_metric([name, app], behind)
                sink_lag_s.add_metric([name, app], _number(stats, "sink_lag_s") or 0.0)
            timed = event_time_stats(stats)  # event-time jobs only
            if timed is not None:
                late.add_metric([name, app], timed.late_records)
                if timed.watermark_ms is not None:
                    watermark_lag.add_metric([name, app], now - timed.watermark_ms / 1000)
        yield lag_epochs
        yield lag_records
        yield sink_lag
        yield sink_lag_s
        yield edge_lag
        yield watermark_lag
        yield late

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
            histogram.add_metric(
                [kind], _histogram(values, DURATION_BUCKETS), sum_value=sum(values)
            )
        yield histogram
        yield from self._undispatched()

    def _undispatched(self) -> Iterator[Metric]:
        """Pending operations no worker has taken (the broker was away when they were
        requested, or lost their message): the reconciler dispatches them once it is back."""
        waiting = Operation.objects.filter(
            state=OperationState.PENDING, lease_owner__in=["", QUEUED]
        ).aggregate(n=Count("id"), oldest=Min("created_at"))
        count = GaugeMetricFamily(
            "epochal_operations_undispatched",
            "Pending operations no worker has taken yet (a broker outage keeps them here).",
        )
        count.add_metric([], waiting["n"] or 0)
        yield count
        oldest = GaugeMetricFamily(
            "epochal_operation_undispatched_oldest_seconds",
            "Age of the oldest pending operation no worker has taken (0: none).",
        )
        age = 0.0
        if waiting["oldest"] is not None:
            age = max(0.0, time.time() - waiting["oldest"].timestamp())
        oldest.add_metric([], age)
        yield oldest
        watched = GaugeMetricFamily(
            "epochal_reconciler_last_pass_timestamp_seconds",
            "When the reconciler's beat last checked the live runs (Unix time; 0: never).",
        )
        at = runs_watched_at()
        watched.add_metric([], 0.0 if at is None else at.timestamp())
        yield watched

    def _autoscaler(self) -> Iterator[Metric]:
        decisions = GaugeMetricFamily(
            "epochal_autoscaler_decisions",
            "Recorded autoscaler decisions (the newest 500 per job) by action and outcome.",
            labels=[JOB_LABEL, "action", "outcome"],
        )
        rows = (
            AutoscaleDecision.objects.values_list("job__name", "action", "outcome")
            .annotate(n=Count("id"))
            .order_by("job__name", "action", "outcome")
        )
        for job, action, outcome, n in rows:
            decisions.add_metric([job, action, outcome], n)
        yield decisions
        recommended = GaugeMetricFamily(
            "epochal_autoscaler_recommended_parallelism",
            "The newest autoscaler decision's recommended parallelism per job.",
            labels=[JOB_LABEL, "mode"],
        )
        newest = AutoscaleDecision.objects.values("job").annotate(last=Max("id")).values("last")
        for job, mode, value in (
            AutoscaleDecision.objects.filter(id__in=newest)
            .values_list("job__name", "mode", "recommended_parallelism")
            .order_by("job__name")
        ):
            recommended.add_metric([job, mode], value)
        yield recommended


class RejectionCollector(Collector):
    """Anonymous rejections, counted in the shared cache (controlplane/audit/rejections.py)."""

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "epochal_rejections",
            "Requests refused without writing an audit row: no or an unknown token, sign-ins "
            "naming no user, sign-ins while locked out.",
            labels=["kind"],
        )
        for kind, total in rejection_totals().items():
            family.add_metric([kind], total)
        yield family


def render_metrics() -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DatabaseCollector())
    registry.register(RejectionCollector())
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
        ApiTokenAuthentication,
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
