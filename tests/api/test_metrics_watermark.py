"""/metrics and the job page: an event-time job's watermark lag and late records, from the
stats its head commit recorded (runners/engine/eventtime)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from django.test import Client

from controlplane.lineage.epoch_stats import epoch_series
from tests.api.test_metrics_families import make_app, scrape


@pytest.mark.django_db
def test_watermark_lag_and_late_records_per_job(
    tmp_path: Path, postgresql_db: None, admin_client: Client
) -> None:
    started = time.time()
    watermark_ms = int(started * 1000) - 90_000  # 90 s behind the wall clock
    timed = make_app(
        tmp_path,
        "views",
        [{"records_in": 10, "late_records": 0, "watermark_ms": watermark_ms - 60_000},
         {"records_in": 10, "late_records": 4, "watermark_ms": watermark_ms}],
    )  # fmt: skip
    make_app(tmp_path, "plain", [{"records_in": 10}])
    make_app(tmp_path, "early", [{"records_in": 10, "late_records": 0}])  # no watermark yet
    got = scrape()
    elapsed = time.time() - started
    views = (("application", "views"), ("job_name", "views-main"))
    assert 89 <= got[("epochal_job_watermark_lag_seconds", views)] <= 91 + elapsed
    assert got[("epochal_job_late_records", views)] == 4
    plain = (("application", "plain"), ("job_name", "plain-main"))
    assert ("epochal_job_watermark_lag_seconds", plain) not in got  # no event time: no series
    assert ("epochal_job_late_records", plain) not in got
    early = (("application", "early"), ("job_name", "early-main"))
    assert got[("epochal_job_late_records", early)] == 0  # an event-time job before its
    assert ("epochal_job_watermark_lag_seconds", early) not in got  # first watermark
    points = epoch_series(application=timed.application, branch="main")
    assert [p.late_records for p in points] == [0, 4]
    assert [p.watermark_ms for p in points] == [watermark_ms - 60_000, watermark_ms]
    page = admin_client.get(f"/jobs/{timed.name}/")
    assert page.status_code == 200
    assert (
        b'data-testid="watermark"' in page.content and b"4 late in the last epoch" in page.content
    )
