"""Every page in Chromium against the live server, on a small real lineage (no Spark): the
overview's table following a change without a reload, charts drawn by plotly.js from our
static files, the lineage graph clickable, the key lookup and the rescale preview live, no
console error, no request leaving localhost."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controlplane.jobs.models import Job
from tests.web.browser import chromium, watched
from tests.web.conftest import PASSWORD, build_lineage

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as instance:
        yield instance


def test_pages_render_in_chromium_without_errors(
    browser: Any,
    live_server: Any,
    transactional_db: None,
    users: Any,
    store_url: str,
    tmp_path: Path,
) -> None:
    lineage = build_lineage(tmp_path)
    operator = watched(browser, live_server.url)
    operator.login("operator", PASSWORD)
    page = operator.page
    assert page.locator("[data-job=clicks-main] [data-testid=epoch]").inner_text() == "5"
    operator.screenshot("fixture-overview")
    # the table follows the change feed: a job failing elsewhere shows without a reload
    Job.objects.filter(pk=lineage.job.pk).update(state="failed", status_reason="driver lost")
    page.wait_for_selector('tr.level-alarm[data-job="clicks-main"]', timeout=15_000)
    assert "driver lost" in page.inner_text('[data-job="clicks-main"]')

    operator.go("/jobs/clicks-main/")
    page.wait_for_function("document.querySelectorAll('.js-plotly-plot').length === 7")
    traces = page.evaluate("document.getElementById('chart-allocation').data.length")
    assert traces == 3
    operator.screenshot("fixture-job")

    operator.go("/applications/clicks/lineage/")
    assert page.locator("svg .node").count() == len(lineage.main) + len(lineage.fork)
    page.click(f".graph-row[data-snapshot='{lineage.main[4]}'] a.snap")
    page.wait_for_selector("[data-testid=snapshot-detail] [data-testid=diff-summary]")
    page.fill("[data-testid=snapshot-detail] input[name=key]", "user-3")
    page.press("[data-testid=snapshot-detail] input[name=key]", "Enter")
    page.wait_for_selector("[data-testid=state-row]")
    assert '"clicks": 20' in page.inner_text("[data-testid=state-row]")  # (4 + 1) * (3 + 1)
    operator.screenshot("fixture-lineage")

    operator.go("/jobs/clicks-main/rescale/")
    page.fill("#id_parallelism", "4")
    page.wait_for_selector("[data-testid=moves-summary]")
    assert "of 8 key groups change task" in page.inner_text("[data-testid=moves-summary]")
    page.fill("#id_parallelism", "99")
    page.wait_for_selector("[data-testid=preview-error]")
    assert "exceeds the lineage's max parallelism" in page.inner_text("[data-testid=preview-error]")

    for path in ("/applications/clicks/", "/applications/clicks/versions/1/", "/audit/"):
        response = operator.go(path)
        assert response is not None and response.status == 200, path
    operator.assert_clean()
    operator.context.close()
