"""/metrics: lag per job and per job-web edge, the commit duration histogram, autoscaler
decisions — and a scrape costs the same number of queries for 1 application or 12."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext, override_settings

from controlplane.applications.models import Application, ApplicationVersion
from controlplane.autoscaler.models import AutoscaleDecision
from controlplane.jobs.models import Job
from controlplane.jobs.services import job_create
from controlplane.lineage.services import reindex_application
from snapshots_store import Manifest, Repository
from tests.api.test_metrics import samples
from tests.conftest import registered_store

TOKEN = "families"


def scrape() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with override_settings(EPOCHAL_METRICS_TOKEN=TOKEN):
        response = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200, response.content[:1000]
    return samples(response.content.decode())


def make_app(
    tmp_path: Path, name: str, epochs: list[dict[str, Any]], extra: dict[str, Any] | None = None
) -> Job:
    store = f"file://{tmp_path / 'store'}"
    app = Application.objects.create(
        name=name, store_namespace=name, max_parallelism=8, store=registered_store(store)
    )
    version = ApplicationVersion.objects.create(
        application=app, number=1, job="clickstream", config={}
    )
    repo = Repository.open(store, name)
    head = None
    for epoch, stats in enumerate(epochs, start=1):
        manifest = Manifest(
            branch="main",
            epoch=epoch,
            max_parallelism=8,
            parallelism=2,
            kind="epoch",
            parents=() if head is None else (head,),
            stats=stats,
            extra=extra or {},
        )
        head = repo.commit(manifest, "main", expected_head=head, reason=f"epoch {epoch}")
    reindex_application(application=app, repo=repo)
    return job_create(name=f"{name}-main", application=app, version=version, parallelism=2)


def epoch_stats(process_s: float, backlog: int, records: int) -> dict[str, Any]:
    return {
        "records_in": 100,
        "busy_s": 1.0,
        "process_s": process_s,
        "backlog_epochs": backlog,
        "backlog_records": records,
    }


@pytest.mark.django_db
def test_lag_per_job_and_per_edge_commit_histogram_and_autoscaler(
    tmp_path: Path, postgresql_db: None
) -> None:
    up = make_app(tmp_path, "up", [epoch_stats(0.2 * e, 0, 0) for e in range(1, 6)])
    inputs = {
        "inputs": {
            "upstream": {
                "kind": "branch_output",
                "store": "file://elsewhere",
                "namespace": "up",
                "branch": "main",
                "after_epoch": 1,
                "epochs": [2],
                "snapshots": [],
                "aligned": True,
            }
        }
    }
    down = make_app(tmp_path, "down", [{"records_in": 5, "process_s": 3.0}] * 2, inputs)
    fan_doc = {**inputs["inputs"]["upstream"], "epochs": [4]}
    fan = {"inputs": {"merged": {"kind": "fan_in", "marker_ms": 4000, "inputs": {"up": fan_doc}}}}
    make_app(tmp_path, "fan", [{"records_in": 5}], fan)
    solo = make_app(tmp_path, "solo", [epoch_stats(0.1, 4, 1200)])
    AutoscaleDecision.objects.create(
        job=solo,
        mode="recommend",
        action="scale_up",
        current_parallelism=2,
        recommended_parallelism=5,
        reason="r",
        outcome="recommended",
    )
    AutoscaleDecision.objects.create(
        job=solo,
        mode="recommend",
        action="hold",
        current_parallelism=2,
        recommended_parallelism=3,
        reason="r",
        outcome="held",
    )
    got = scrape()
    edge = (("downstream", "down-main"), ("source", "upstream"), ("upstream", "up-main"))
    assert got[("epochal_web_edge_lag_epochs", edge)] == 3  # up at epoch 5, down read 2
    down = (("application", "down"), ("job_name", "down-main"))
    solo = (("application", "solo"), ("job_name", "solo-main"))
    assert got[("epochal_job_lag_epochs", down)] == 3
    fan_edge = (("downstream", "fan-main"), ("source", "merged/up"), ("upstream", "up-main"))
    assert got[("epochal_web_edge_lag_epochs", fan_edge)] == 1  # a fan-in's upstream edge
    assert got[("epochal_job_lag_epochs", solo)] == 4
    assert got[("epochal_job_lag_records", solo)] == 1200
    assert ("epochal_job_lag_records", down) not in got
    app = ("application", "up")
    assert got[("epochal_commit_duration_seconds_count", (app,))] == 5
    assert got[("epochal_commit_duration_seconds_bucket", (app, ("le", "0.5")))] == 2
    assert got[("epochal_commit_duration_seconds_bucket", (app, ("le", "1.0")))] == 5
    assert got[("epochal_commit_duration_seconds_sum", (app,))] == pytest.approx(3.0)
    solo_up = (("action", "scale_up"), ("job_name", "solo-main"), ("outcome", "recommended"))
    assert got[("epochal_autoscaler_decisions", solo_up)] == 1
    newest = (("job_name", "solo-main"), ("mode", "recommend"))
    assert got[("epochal_autoscaler_recommended_parallelism", newest)] == 3
    assert got[("epochal_job_parallelism", (("job_name", "up-main"),))] == 2
    del up, down


@pytest.mark.django_db
def test_one_scrape_costs_the_same_queries_for_one_or_twelve_applications(
    tmp_path: Path, postgresql_db: None, django_assert_max_num_queries: Any
) -> None:
    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            scrape()
        return len(captured)

    make_app(tmp_path, "app0", [epoch_stats(0.3, 1, 10)] * 3)
    one = queries()
    assert one <= 16  # authentication and audit included
    for i in range(1, 12):
        job = make_app(tmp_path, f"app{i}", [epoch_stats(0.3, 1, 10)] * 3)
        AutoscaleDecision.objects.create(
            job=job,
            mode="apply",
            action="hold",
            current_parallelism=2,
            recommended_parallelism=2,
            reason="r",
            outcome="held",
        )
    assert queries() == one
    with django_assert_max_num_queries(one):
        scrape()
