"""Event time in the control plane, from a real run of the windowed example job
(runners/jobs/pageviews.py: 5-minute windows sliding by 1 minute, watermark delay 30 s):
the job and snapshot REST resources carry the watermark, its lag at the commit and the late
records of each epoch; the job page shows them with a chart, and per key group the open
windows (counted against the input, independently of the engine) and, for a job that records
them, pending timers."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from django.test import Client
from rest_framework.test import APIClient

from controlplane.applications.models import Application, ApplicationVersion
from controlplane.jobs.models import Job
from controlplane.jobs.services import job_create
from controlplane.lineage.models import Snapshot
from controlplane.lineage.services import reindex_application
from runners.engine import EpochRunner, read_dead_letters
from runners.engine.keygroups import key_group_of
from runners.jobs import pageviews
from snapshots_store import Repository
from tests.api.test_metrics_families import make_app
from tests.conftest import registered_store

pytestmark = [pytest.mark.spark]

M = 8
FILES = 3


@pytest.fixture(scope="module")
def pageviews_run(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Three epochs of the example job (one input file each) in a store of their own."""
    root = tmp_path_factory.mktemp("pageviews")
    data = str(root / "views")
    pageviews.generate(data, files=FILES, views=400)
    store = f"file://{root / 'store'}"
    repo = Repository.open(store, "pageviews")
    runner = EpochRunner(spark, pageviews.job(data), repo=repo, parallelism=2, max_parallelism=M)
    runner.run(max_epochs=FILES)
    history = [m for _, m in repo.log(repo.read_ref("heads/main").target, first_parent=True)]
    assert [m.epoch for m in reversed(history)] == list(range(1, FILES + 1))
    return {"store": store, "data": data, "repo": repo}


def register(run: dict[str, Any]) -> Job:
    app = Application.objects.create(
        name="pageviews",
        store_namespace="pageviews",
        max_parallelism=M,
        store=registered_store(run["store"]),
    )
    version = ApplicationVersion.objects.create(
        application=app, number=1, job="pageviews", config={}
    )
    reindex_application(application=app, repo=run["repo"])
    return job_create(name="pageviews-main", application=app, version=version, parallelism=2)


def manifests(repo: Repository) -> list[tuple[str, Any]]:
    """(snapshot id, manifest) of main, oldest first."""
    return list(reversed(list(repo.log(repo.read_ref("heads/main").target, first_parent=True))))


def late_per_epoch(repo: Repository) -> Counter[int]:
    dead = read_dead_letters(repo, "main").to_pylist()
    return Counter(int(d["_epoch"]) for d in dead if d["reason"] == "late")


def expected_open_windows(data: str, applied_ms: int) -> dict[int, int]:
    """Open (page, window) pairs per key group after the last epoch, from the input alone:
    every window a record falls in whose end the last applied watermark has not passed
    (a late record's windows all ended at or before it; a closed window's too)."""
    size, slide = pageviews.WINDOW_MS, pageviews.SLIDE_MS
    table = pq.read_table(data)
    pairs: set[tuple[str, int]] = set()
    for page, ts in zip(table["page"].to_pylist(), table["ts"].to_pylist(), strict=True):
        last = ts - ts % slide
        for start in range(last, ts - size, -slide):
            if start + size > applied_ms:
                pairs.add((page, start))
    counts: Counter[int] = Counter(key_group_of(page, M) for page, _ in pairs)
    return dict(counts)


@pytest.mark.django_db
def test_rest_job_and_snapshots_carry_the_watermark_and_late_records(
    pageviews_run: dict[str, Any],
    tmp_path: Path,
    client_for: Callable[[str | None], APIClient],
) -> None:
    job = register(pageviews_run)
    history = manifests(pageviews_run["repo"])
    head_id, head = history[-1]
    watermark = head.extra["event_time"]["watermark"]
    assert watermark is not None and head.stats["watermark_ms"] == watermark
    client = client_for("viewer")
    answer = client.get(f"/api/jobs/{job.name}/")
    assert answer.status_code == 200
    body = answer.json()
    assert body["head"]["snapshot_id"] == head_id
    assert body["watermark_ms"] == watermark
    created = datetime.fromisoformat(body["head"]["created_at"].replace("Z", "+00:00"))
    lag = created.timestamp() - watermark / 1000
    assert body["watermark_lag_s"] == pytest.approx(lag, abs=0.002)
    late = late_per_epoch(pageviews_run["repo"])
    assert sum(late.values()) > 0  # 1% of the views are 10 minutes late
    assert body["late_records"] == late[head.epoch] == head.extra["event_time"]["late"]
    # facts of a commit: the read stays conditional (304 on the same ETag)
    again = client.get(f"/api/jobs/{job.name}/", HTTP_IF_NONE_MATCH=answer["ETag"])
    assert again.status_code == 304
    for snapshot_id, manifest in history:  # per epoch: the snapshot resource
        one = client.get(f"/api/applications/pageviews/snapshots/{snapshot_id}/").json()
        assert one["late_records"] == late[manifest.epoch], manifest.epoch
        assert one["watermark_ms"] == manifest.extra["event_time"]["watermark"]
    plain = make_app(tmp_path, "plain", [{"records_in": 10}])
    nothing = client.get(f"/api/jobs/{plain.name}/").json()
    assert nothing["head"] is not None
    assert (nothing["watermark_ms"], nothing["watermark_lag_s"], nothing["late_records"]) == (
        None,
        None,
        None,
    )


@pytest.mark.django_db
def test_job_page_and_snapshot_panel_show_watermark_and_open_windows(
    pageviews_run: dict[str, Any], admin_client: Client
) -> None:
    job = register(pageviews_run)
    history = manifests(pageviews_run["repo"])
    head_id, head = history[-1]
    doc = head.extra["event_time"]
    expected = expected_open_windows(pageviews_run["data"], doc["applied"])
    assert expected and {int(kg) for kg in doc["due"]} == set(expected)
    page = admin_client.get(f"/jobs/{job.name}/")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'data-testid="watermark"' in html and 'id="chart-event-time"' in html
    assert '"event-time"' in html  # its figure is in the chart data
    shown = re.search(r'data-testid="event-time-watermark">([^<]+)<', html)
    assert shown is not None and shown.group(1).startswith("2026-01-01 ")
    assert open_windows(html) == expected
    late = late_per_epoch(pageviews_run["repo"])
    per_epoch = [late[m.epoch] for _, m in reversed(history)]  # newest first, as listed
    assert [int(n) for n in re.findall(r'data-testid="commit-late">(\d+)<', html)] == per_epoch
    tab = admin_client.get(f"/jobs/{job.name}/checkpoints/").content.decode()
    assert [int(n) for n in re.findall(r'data-testid="checkpoint-late">(\d+)<', tab)] == per_epoch
    panel = admin_client.get(
        f"/applications/pageviews/snapshots/{head_id}/", HTTP_HX_REQUEST="true"
    )
    assert panel.status_code == 200
    assert open_windows(panel.content.decode()) == expected
    assert f">{sum(expected.values())}<" in panel.content.decode()  # the total
    first_id, _ = history[0]  # epoch 1 applied no watermark: every window it saw is open
    first = admin_client.get(
        f"/applications/pageviews/snapshots/{first_id}/", HTTP_HX_REQUEST="true"
    )
    assert 'data-testid="event-time-keygroups"' in first.content.decode()


def open_windows(html: str) -> dict[int, int]:
    rows = re.findall(r'<tr data-key-group="(\d+)">.*?data-testid="open-windows">([\d,]+)<', html)
    return {int(kg): int(n.replace(",", "")) for kg, n in rows}


@pytest.mark.django_db
def test_pending_timers_per_key_group_when_the_job_records_them(
    tmp_path: Path, admin_client: Client
) -> None:
    """A job with timers records its pending timers per key group (`extra.timers.pending`,
    runners.engine.eventtime.timers): the snapshot panel shows them; a job without event time
    shows no event-time parts."""
    doc = {
        "watermark": 1_767_225_600_000,
        "applied": 1_767_225_540_000,
        "partitions": {"0": [1_767_225_630_000, 5_000]},
        "late": 2,
        "due": {},
        "max_parallelism": 8,
        "spec": {"column": "ts", "delay_ms": 30_000, "idle_ms": None},
    }
    stats = {"records_in": 10, "late_records": 2, "watermark_ms": 1_767_225_600_000}
    timer_doc = {"event": {"3": 1_767_225_660_000, "6": 1_767_225_700_000}, "processing": {},
              "pending": {"3": 5, "6": 2}, "max_parallelism": 8}  # fmt: skip
    job = make_app(tmp_path, "timed", [stats], extra={"event_time": doc, "timers": timer_doc})
    head = Snapshot.objects.get(application=job.application).snapshot_id
    panel = admin_client.get(f"/applications/timed/snapshots/{head}/", HTTP_HX_REQUEST="true")
    html = panel.content.decode()
    timers = re.findall(r'<tr data-key-group="(\d+)">.*?data-testid="pending-timers">(\d+)<', html)
    assert {int(kg): int(n) for kg, n in timers} == {3: 5, 6: 2}
    assert 'data-testid="open-windows"' not in html  # no windows in this job
    assert "2026-01-01 00:00:00 UTC" in html and "2 late records" in html
    page = admin_client.get(f"/jobs/{job.name}/").content.decode()
    assert 'data-testid="pending-timers"' in page and 'id="chart-event-time"' in page
    plain = make_app(tmp_path, "plain", [{"records_in": 10}])
    html = admin_client.get(f"/jobs/{plain.name}/").content.decode()
    assert 'data-testid="watermark"' not in html and "chart-event-time" not in html
    assert 'data-testid="commit-late"' not in html
    assert 'data-testid="event-time"' not in html
