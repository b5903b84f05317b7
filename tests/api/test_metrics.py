"""/metrics: read from the database at scrape time, protected by a bearer token or a login."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.test import APIClient

from controlplane.audit.models import AuditEntry
from controlplane.operations.models import Operation
from controlplane.operations.services import operation_request
from tests.api.conftest import Lineage

Client = Callable[[str | None], APIClient]


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_metrics_report_jobs_epochs_commit_latency_and_operations(
    lineage: Lineage, client_for: Client, settings: Any
) -> None:
    op = operation_request(kind="stop", application=lineage.application, job=lineage.job)
    now = timezone.now()
    Operation.objects.filter(pk=op.operation.pk).update(
        state="succeeded", started_at=now - timedelta(seconds=20), finished_at=now
    )
    response = client_for("viewer").get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    got = samples(response.content.decode())

    assert got[("epochal_jobs", (("state", "created"),))] == 1
    assert got[("epochal_jobs", (("state", "running"),))] == 0
    app = ("application", "clicks")
    assert got[("epochal_epochs_committed", (app, ("branch", "main")))] == 4  # + 1 initial
    assert got[("epochal_epochs_committed", (app, ("branch", "exp")))] == 1  # + 1 fork
    assert got[("epochal_branch_head_epoch", (app, ("branch", "main")))] == 4
    # process_s of the 5 epoch commits: 0.2 .. 0.5 (main epochs 1-4) and 0.4 (exp epoch 3)
    assert got[("epochal_commit_latency_window", (app,))] == 5
    assert got[("epochal_commit_latency_seconds", (app, ("percentile", "50")))] == 0.4
    assert got[("epochal_commit_latency_seconds", (app, ("percentile", "99")))] == 0.5
    assert got[("epochal_operations", (("kind", "stop"), ("state", "succeeded")))] == 1
    assert got[("epochal_operations", (("kind", "rescale"), ("state", "pending")))] == 0
    stop = ("kind", "stop")
    assert got[("epochal_operation_duration_seconds_count", (stop,))] == 1
    assert got[("epochal_operation_duration_seconds_sum", (stop,))] == 20
    assert got[("epochal_operation_duration_seconds_bucket", (stop, ("le", "15.0")))] == 0
    assert got[("epochal_operation_duration_seconds_bucket", (stop, ("le", "30.0")))] == 1


def test_metrics_need_the_bearer_token_or_a_login(
    lineage: Lineage, client_for: Client, settings: Any
) -> None:
    settings.EPOCHAL_METRICS_TOKEN = "scrape-secret"
    scraper = APIClient()
    scraper.credentials(HTTP_AUTHORIZATION="Bearer scrape-secret")
    assert scraper.get("/metrics").status_code == 200
    wrong = APIClient()
    wrong.credentials(HTTP_AUTHORIZATION="Bearer guess")
    refused = wrong.get("/metrics")
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "authentication_failed"
    assert client_for(None).get("/metrics").status_code == 401
    assert client_for("viewer").get("/metrics").status_code == 200
    # Anonymous refusals are counted (and exported), not audited row by row.
    assert not AuditEntry.objects.filter(target="/metrics", status_code=401).exists()
    exported = scraper.get("/metrics").content.decode()
    assert 'epochal_rejections_total{kind="unauthenticated"}' in exported

    settings.EPOCHAL_METRICS_TOKEN = ""
    assert scraper.get("/metrics").status_code == 401  # no token configured: none accepted

    settings.EPOCHAL_AUDIT_READS = True
    settings.EPOCHAL_METRICS_TOKEN = "scrape-secret"
    assert scraper.get("/metrics").status_code == 200
    entry = AuditEntry.objects.filter(target="/metrics", status_code=200).get()
    assert entry.detail["actor"] == "metrics-token"


def test_metrics_answer_after_a_commit_without_timing(lineage: Lineage, client_for: Client) -> None:
    """A restart rescale commits metadata only: its manifest has no `process_s`. The scrape
    still answers, and the latency quantiles are over the timed commits alone."""
    from controlplane.lineage.services import reindex_application
    from snapshots_store import Manifest

    head = lineage.repo.read_manifest(lineage.main[-1])
    untimed = Manifest(
        branch="main",
        epoch=head.epoch,
        parents=(lineage.main[-1],),
        max_parallelism=head.max_parallelism,
        parallelism=3,
        kind="rescale",
        offsets=head.offsets,
        key_groups=head.key_groups,
        stats={},
        provenance={"from_parallelism": "2"},
    )
    lineage.repo.commit(untimed, "main", expected_head=lineage.main[-1], reason="rescale 2->3")
    reindex_application(application=lineage.application, repo=lineage.repo)

    response = client_for("viewer").get("/metrics")
    assert response.status_code == 200, response.content[:500]
    got = samples(response.content.decode())
    app = ("application", "clicks")
    assert got[("epochal_commit_latency_window", (app,))] == 5  # the rescale commit has no timing
    assert got[("epochal_commit_latency_seconds", (app, ("percentile", "50")))] == 0.4
