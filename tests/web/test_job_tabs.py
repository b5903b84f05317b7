"""The job page's tabs: exceptions across restarts (reason, traceback, the epoch a run began
and never committed), the driver's log (search, follow, download) and the checkpoint history
(every commit with size and timing, savepoints, failed checkpoints).

The runs are real local runs of a tiny program that prints what the engine prints — its JSON
events, then a traceback — so the launcher's own log reading is what the pages show."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from django.test import Client

from controlplane.jobs.models import Run
from tests.web.conftest import Lineage
from tests.web.runs import CRASHING, local_run

ClientFor = Callable[[str | None], Client]


@pytest.fixture
def crashed_run(lineage: Lineage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Run:
    """A real local run of the job that printed two epochs' events and crashed in the
    second (tests/web/runs.py)."""
    run = local_run(
        lineage.job, tmp_path, monkeypatch, program=CRASHING, run_id="crash0000001", finish=True
    )
    assert run.phase == "failed", run.reason
    return run


def test_the_exceptions_tab_shows_why_a_run_failed(
    client_for: ClientFor, lineage: Lineage, crashed_run: Run
) -> None:
    html = client_for("viewer").get("/jobs/clicks-main/exceptions/").content.decode()
    assert f'data-run="{crashed_run.run_id}"' in html
    assert "exit code 1" in html
    assert "RuntimeError: state chunk 3 of key group 5 is corrupt" in html
    assert "in deep" in html  # the traceback's frames
    assert "epoch 8 was begun and never committed" in html
    assert 'data-testid="job-tabs"' in html


def test_the_log_tab_searches_follows_and_downloads(
    client_for: ClientFor, lineage: Lineage, crashed_run: Run
) -> None:
    client = client_for("viewer")
    page = client.get("/jobs/clicks-main/log/").content.decode()
    assert "INFO a line about nothing" in page and "RuntimeError" in page
    assert 'hx-trigger="every 2s"' in page  # following by default
    found = client.get("/jobs/clicks-main/log/?q=runtimeerror&follow=0").content.decode()
    assert "RuntimeError" in found and "a line about nothing" not in found
    assert 'hx-trigger="every 2s"' not in found
    fragment = client.get("/jobs/clicks-main/log/?follow=1", HTTP_HX_REQUEST="true")
    assert fragment.content.decode().lstrip().startswith('<section id="job-log"')
    download = client.get(f"/jobs/clicks-main/log/download/?run={crashed_run.run_id}")
    assert download["Content-Disposition"] == (
        f'attachment; filename="clicks-main-{crashed_run.run_id}.log"'
    )
    assert b'{"event": "epoch_start", "n": 2}' in download.content


def test_the_checkpoints_tab_lists_commits_savepoints_and_failures(
    client_for: ClientFor, lineage: Lineage, crashed_run: Run
) -> None:
    lineage.repo.cas_ref("tags/sp-before-crash", None, lineage.main[-1], reason="savepoint")
    from controlplane.lineage.services import reindex_application

    reindex_application(application=lineage.application, repo=lineage.repo)
    html = client_for("viewer").get("/jobs/clicks-main/checkpoints/").content.decode()
    history = html[html.index('data-testid="checkpoints"') :]
    assert history.count('<tr><td class="num">') == len(lineage.main)
    assert '<span class="tag">sp-before-crash</span>' in history
    failed = html[html.index('data-testid="failed-checkpoints"') :]
    assert crashed_run.run_id in failed and ">8<" in failed
    summary = html[html.index('data-testid="checkpoint-summary"') :]
    tagged = history.count('<span class="tag">')
    assert f"{len(lineage.main)} commits" in summary and "1 failed" in summary
    assert f">{tagged} savepoint" in summary and tagged >= 1


def test_the_epoch_view_shows_each_tasks_busy_time_and_records(
    client_for: ClientFor, lineage: Lineage
) -> None:
    """The engine writes what each task did into the manifest (`extra.tasks`); the snapshot
    panel shows it, with each task's busy time against the busiest's."""
    from controlplane.lineage.services import reindex_application
    from snapshots_store import Manifest

    head = lineage.main[-1]
    tasks = [
        {"task": 0, "records_in": 300, "output_rows": 10, "busy_s": 0.5, "bytes_written": 2048,
         "key_groups_written": 4},
        {"task": 1, "records_in": 900, "output_rows": 30, "busy_s": 2.0, "bytes_written": 4096,
         "key_groups_written": 4},
    ]  # fmt: skip
    manifest = Manifest(
        branch="main", epoch=6, parents=(head,), max_parallelism=8, parallelism=2,
        kind="epoch", stats={"records_in": 1200}, extra={"tasks": tasks},
    )  # fmt: skip
    sid = lineage.repo.commit(manifest, "main", expected_head=head, reason="epoch 6")
    reindex_application(application=lineage.application, repo=lineage.repo)
    html = (
        client_for("viewer")
        .get(f"/applications/clicks/snapshots/{sid}/", HTTP_HX_REQUEST="true")
        .content.decode()
    )
    table = html[html.index('data-testid="epoch-tasks"') :]
    rows = re.findall(r'<tr data-task="(\d)">(.*?)</tr>', table, re.S)
    assert [task for task, _ in rows] == ["0", "1"]
    assert '300 <span class="muted">(25%)</span>' in rows[0][1] and "0.5 s" in rows[0][1]
    assert 'style="width: 25%"' in rows[0][1] and 'style="width: 100%"' in rows[1][1]


def test_operators_set_periodic_savepoints_from_the_checkpoints_tab(
    client_for: ClientFor, lineage: Lineage
) -> None:
    """A job setting, not an operation: the form posts the interval and retention, the page
    then says the schedule; viewers see the schedule but no form and cannot post one; a bad
    interval is refused in words and changes nothing."""
    from controlplane.audit.models import AuditEntry
    from controlplane.jobs.models import Job

    url = "/jobs/clicks-main/checkpoints/"
    viewer, operator = client_for("viewer"), client_for("operator")
    assert 'data-testid="savepoint-schedule-form"' not in viewer.get(url).content.decode()
    assert 'data-testid="savepoint-schedule-form"' in operator.get(url).content.decode()
    post = "/jobs/clicks-main/savepoint-schedule/"
    assert viewer.post(post, {"interval_s": 60, "retention": 3}).status_code == 403

    refused = operator.post(post, {"interval_s": 5, "retention": 3})
    assert refused.status_code == 400 and "at least 10 seconds" in refused.content.decode()
    assert Job.objects.get(name="clicks-main").savepoint_interval_s == 0

    saved = operator.post(post, {"interval_s": 3600, "retention": 24})
    assert saved.status_code == 302 and saved["Location"].endswith(url)
    job = Job.objects.get(name="clicks-main")
    assert (job.savepoint_interval_s, job.savepoint_retention) == (3600, 24)
    schedule = viewer.get(url).content.decode()
    said = schedule[schedule.index('data-testid="savepoint-schedule"') :]
    assert "keeping the newest 24" in said.split("</p>")[0]
    assert AuditEntry.objects.filter(action="web savepoint-schedule", source="web").count() == 1
