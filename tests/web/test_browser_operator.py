"""What an operator trusts, asserted in Chromium from the pages themselves (live server, a
real lineage in a real store, real local runs; no Spark):

* a job the database calls running shows `unknown (control plane was down)` until the
  reconciler watches its run again;
* the operations list filters by kind and leads to an operation page that says who asked and
  how, each phase's duration, and its results in words;
* the job page's charts: nothing drawn outside its card, output rows on their own axis, each
  operation marked once with a legend; its tabs: exceptions with the traceback, the driver's
  log following a live run (search, download), the checkpoint history with savepoints and the
  failed checkpoint;
* the lineage draws what a rollback left behind grey, its `-abandoned` tag without the
  savepoint ring;
* a page that does not exist is our 404, not Django's debug page.

With EPOCHAL_DOCS_SCREENSHOTS=1 the screenshots docs/dashboard.md shows are written to
docs/images/ (else to var/artifacts/screenshots/)."""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from controlplane.jobs.models import Job
from controlplane.jobs.services import watch_record
from controlplane.lineage.services import reindex_application
from controlplane.operations.models import Operation
from tests.web.browser import ROOT, Watched, chromium, watched
from tests.web.conftest import PASSWORD, Lineage, build_lineage, commit
from tests.web.runs import CRASHING, TICKING, local_run
from tests.web.test_operations_pages import finish, requested

pytestmark = pytest.mark.browser

DOCS_IMAGES = ROOT / "docs" / "images"
#: every chart's drawing (title, axes, legend) stays inside its card
INSIDE_CARDS = """() => {
  const out = [];
  for (const card of document.querySelectorAll('.chart')) {
    const box = card.getBoundingClientRect();
    for (const t of card.querySelectorAll('svg text')) {
      if (!t.textContent.trim()) continue;
      const r = t.getBoundingClientRect();
      if (r.width === 0) continue;
      if (r.left < box.left - 1 || r.right > box.right + 1 || r.top < box.top - 1 ||
          r.bottom > box.bottom + 1) out.push(card.id + ': ' + t.textContent);
    }
  }
  return out;
}"""


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as instance:
        yield instance


def shot(seen: Watched, name: str) -> None:
    """A screenshot of the viewport: docs/images/dashboard-NAME.png when asked for."""
    if os.environ.get("EPOCHAL_DOCS_SCREENSHOTS") == "1":
        seen.page.evaluate("window.scrollTo(0, 0)")
        seen.page.screenshot(path=str(DOCS_IMAGES / f"dashboard-{name}.png"))
    else:
        seen.screenshot(f"operator-{name}", full_page=False)


def richer(tmp_path: Path) -> Lineage:
    """build_lineage's history and 14 more epochs at p=3, then a rollback to epoch 12 that
    leaves epochs 13 to 19 behind under an `-abandoned` tag, and two epochs after it."""
    lineage = build_lineage(tmp_path)
    repo, head = lineage.repo, lineage.main[-1]
    for epoch in range(6, 20):
        head = commit(repo, "main", head, epoch, parallelism=3)
        lineage.main.append(head)
    abandoned = head
    target = lineage.main[12]
    head = commit(
        repo, "main", target, 13, head=abandoned, parallelism=3, kind="rollback",
        provenance={"rollback_of": abandoned, "reason": "bad input in epochs 13-19"},
    )  # fmt: skip
    repo.cas_ref("tags/rollback-7f3a-abandoned", None, abandoned, reason="rollback")
    lineage.main[13:] = [head]
    for epoch in (14, 15):
        head = commit(repo, "main", head, epoch, parallelism=3)
        lineage.main.append(head)
    repo.cas_ref("tags/sp-before-deploy", None, head, reason="savepoint")
    reindex_application(application=lineage.application, repo=repo)
    return lineage


def test_an_operator_can_trust_what_the_pages_say(
    browser: Any,
    pages_closed: None,
    live_server: Any,
    transactional_db: None,
    users: Any,
    store_url: str,
    tmp_path: Path,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings.DEBUG = False  # as the demo and production run: no debug page
    lineage = richer(tmp_path)
    job = lineage.job
    crashed = local_run(
        job, tmp_path, monkeypatch, program=CRASHING, run_id="crash0000001", finish=True
    )
    assert crashed.phase == "failed"
    ticking = local_run(
        job, tmp_path, monkeypatch, program=TICKING, run_id="live00000001", finish=False
    )
    Job.objects.filter(pk=job.pk).update(state="running", desired_state="running")
    tip = lineage.main[-1]
    savepoint = requested(lineage, "savepoint", "web", users["operator"], snapshot=tip)
    finish(savepoint, tag="sp-before-deploy", snapshot=tip)
    stop = requested(lineage, "stop", "cli")
    finish(stop, state="failed")
    # ended now, after the charts' first commit (finish() backdates them)
    Operation.objects.filter(pk__in=[savepoint.pk, stop.pk]).update(finished_at=timezone.now())
    watch_record(timezone.now() - dt.timedelta(minutes=5))  # the reconciler was down

    operator = watched(browser, live_server.url)
    operator.login("operator", PASSWORD)
    page = operator.page
    try:
        # -- nobody watched the run: unknown, and why ------------------------------------
        row = page.locator('[data-job="clicks-main"]')
        assert row.locator("[data-testid=job-state]").inner_text() == "UNKNOWN"  # CSS caps
        assert "(control plane was down)" in row.inner_text()
        watch_record()  # the reconciler is back
        operator.go("/")
        assert row.locator("[data-testid=job-state]").inner_text() == "RUNNING"
        shot(operator, "overview")

        # -- operations list, filtered, and one operation in words ----------------------
        operator.follow("nav >> text=Operations")
        assert page.locator("[data-testid=operations] tbody tr").count() == 2
        page.select_option("select[name=kind]", "stop")
        operator.follow("[data-testid=operation-filters] button[type=submit]")
        assert page.locator("[data-testid=operations] tbody tr").count() == 1
        page.select_option("select[name=kind]", "")
        page.fill("input[name=requester]", "operator")
        operator.follow("[data-testid=operation-filters] button[type=submit]")
        assert page.locator("[data-testid=operations] tbody tr").count() == 1
        shot(operator, "operations")
        operator.follow("[data-testid=operations] tbody tr a >> text=savepoint")
        assert page.inner_text("[data-testid=asked-by]") == "operator, through the dashboard"
        durations = page.locator("[data-testid=phase-duration]").all_inner_texts()
        assert durations == ["1.5 s", "1.5 s"]
        assert "{'" not in page.inner_text("main") and "True" not in page.inner_text("main")
        shot(operator, "operation")

        # -- the job page's charts ------------------------------------------------------
        operator.go("/jobs/clicks-main/")
        page.wait_for_function("document.querySelectorAll('.js-plotly-plot').length === 7")
        page.wait_for_timeout(500)  # plotly's automargin redraw
        assert page.evaluate(INSIDE_CARDS) == []
        axis = page.evaluate("document.getElementById('chart-throughput').layout.yaxis2")
        assert axis["overlaying"] == "y" and axis["side"] == "right"
        legend = page.evaluate(
            "Array.from(document.querySelectorAll('#chart-parallelism .legend .legendtext'))"
            ".map(t => t.textContent)"
        )
        assert {"savepoint", "stop"} <= set(legend)
        shot(operator, "job")

        # -- exceptions: why the crashed run failed ---------------------------------------
        operator.follow("[data-testid=job-tabs] >> text=Exceptions")
        crash = page.locator(f'[data-run="{crashed.run_id}"]')
        assert "RuntimeError: state chunk 3 of key group 5 is corrupt" in crash.inner_text()
        assert "epoch 8 was begun and never committed" in crash.inner_text()
        shot(operator, "exceptions")

        # -- the live log: follows the running run, searches, downloads ---------------------
        operator.follow("[data-testid=job-tabs] >> text=Log")
        log = page.locator("[data-testid=log] pre")
        page.wait_for_function(
            "document.querySelector('[data-testid=log] pre').textContent.includes('tick 3')"
        )
        seen_before = log.inner_text().count("tick")
        page.wait_for_function(  # new lines arrive without a reload
            f"document.querySelector('[data-testid=log] pre').textContent"
            f".split('tick').length - 1 > {seen_before + 2}",
            timeout=20_000,
        )
        shot(operator, "log")
        page.fill("input[name=q]", "tick 1")
        operator.follow("[data-testid=log-filters] button[type=submit]")
        lines = [line for line in log.inner_text().splitlines() if line.strip()]
        assert lines and all("tick 1" in line for line in lines), lines
        with page.expect_download() as download:
            page.click("[data-testid=log-download]")
        assert download.value.suggested_filename == f"clicks-main-{ticking.run_id}.log"

        # -- checkpoint history -------------------------------------------------------------
        operator.follow("[data-testid=job-tabs] >> text=Checkpoints")
        history = page.locator("[data-testid=checkpoints] tbody tr")
        assert history.count() == len(lineage.main)  # the branch's line, newest first
        assert "sp-before-deploy" in page.inner_text("[data-testid=checkpoints]")
        failed = page.inner_text("[data-testid=failed-checkpoints]")
        assert crashed.run_id in failed
        shot(operator, "checkpoints")

        # -- the lineage: the abandoned line is grey, its tag no savepoint ---------------------
        operator.go("/applications/clicks/lineage/")
        assert page.locator("svg .node-mark.abandoned").count() == 7  # epochs 13 to 19
        assert page.locator("svg path.lane.abandoned").count() >= 1
        ringed = page.evaluate(
            "Array.from(document.querySelectorAll('svg g.node'))"
            ".filter(g => g.querySelector('circle.tag-ring'))"
            ".map(g => g.querySelector('title').textContent.split('\\n').pop())"
        )
        assert len(ringed) == 2, ringed  # sp-1 and sp-before-deploy, not rollback-…-abandoned
        shot(operator, "lineage")

        # -- our 404 --------------------------------------------------------------------------
        response = operator.go("/no/such/page/")
        assert response is not None and response.status == 404
        assert "There is no page at /no/such/page/" in page.inner_text("main")
        assert "URLconf" not in page.content()
        operator.console_errors = [e for e in operator.console_errors if "404" not in e]
        operator.assert_clean()
    finally:
        operator.context.close()
        from controlplane.jobs.services import launcher_for
        from runners.launcher import RunHandle

        launcher_for("local").cleanup(RunHandle.from_dict(ticking.handle))  # type: ignore[arg-type]
