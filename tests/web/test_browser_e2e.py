"""The dashboard end to end in Chromium: a whole control plane (Celery worker with beat on
Redis, PostgreSQL, real Spark runs of the example clickstream job) behind the live server.

An admin logs in, starts the job and sees it commit epochs live, rescales 2→3 from the UI and
sees the allocation chart change, rolls back to a snapshot picked in the lineage graph, forks
a branch from a snapshot, and finds all three in the lineage graph; a viewer sees no action
buttons. No page logs a console error and no request leaves localhost. Screenshots of each
page go to var/artifacts/screenshots."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import require_service
from tests.e2e.conftest import E2E_REDIS_DB, _stop_runs
from tests.e2e.harness import ControlPlane, wait_for
from tests.web.browser import Watched, chromium, watched
from tests.web.conftest import PASSWORD

pytestmark = [pytest.mark.browser, pytest.mark.services, pytest.mark.spark]
SLOW = 300_000  # ms: a Spark run starting or restarting on a busy 2-core machine
OPERATION_PAGE = re.compile(r"/jobs/clicks-main/\?operation=")  # where a job action redirects
# The checkout's own Redis database (EPOCHAL_E2E_REDIS_DB, as tests/e2e): a database shared by
# every checkout (a fixed 9 before) let another run's worker take this test's tasks, and its
# operations stayed pending. Within one test session the e2e tests run one after another.
DASHBOARD_REDIS_DB = E2E_REDIS_DB


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as instance:
        yield instance


@pytest.fixture
def control_plane(tmp_path: Any, transactional_db: None, redis_url: str) -> Iterator[ControlPlane]:
    """As tests/e2e's, on the dashboard tests' own Redis database."""
    from django.db import connection

    require_service(
        "PostgreSQL",
        connection.vendor == "postgresql",
        "the dashboard's end-to-end test needs DATABASE_URL=postgres://…",
    )
    import redis

    url = f"{redis_url.rsplit('/', 1)[0]}/{DASHBOARD_REDIS_DB}"
    redis.Redis.from_url(url).flushdb()
    plane = ControlPlane(tmp_path, url)
    try:
        yield plane
    finally:
        plane.stop_workers()
        _stop_runs(plane)


@pytest.fixture
def tasks_to(control_plane: ControlPlane) -> Iterator[None]:
    """Requests made by the live server (this process) go to the control plane's broker."""
    from controlplane.celery import app

    def use(url: str) -> None:
        app.conf.broker_url = url
        app._pool = None  # the connection pools remember the broker they were made for
        amqp = app.__dict__.get("amqp")
        if amqp is not None:
            amqp._producer_pool = None

    before = app.conf.broker_url
    use(control_plane.env["CELERY_BROKER_URL"])
    yield
    use(before)


def last_operation(seen: Watched, kind: str) -> str:
    """Wait on the job page until the job's last operation of `kind` ended; its state."""
    selector = f"[data-testid=last-operation][data-kind={kind}]"
    seen.page.wait_for_selector(selector, timeout=SLOW)
    state = seen.page.get_attribute(selector, "data-state")
    assert state == "succeeded", seen.page.inner_text("#job-operation")
    return state


def epoch(seen: Watched) -> int:
    return int(seen.page.inner_text("#job-status [data-testid=epoch]").strip())


def epoch_above(seen: Watched, number: int) -> None:
    """Wait, without reloading, until the job page shows a head epoch above `number`."""
    seen.page.wait_for_function(
        "n => Number(document.querySelector('#job-status [data-testid=epoch]').textContent) > n",
        arg=number,
        timeout=SLOW,
    )


@pytest.mark.timeout(1200)
def test_dashboard_drives_a_running_job(
    browser: Any,
    pages_closed: None,
    live_server: Any,
    control_plane: ControlPlane,
    tasks_to: None,
    users: Any,
    settings: Any,
) -> None:
    from controlplane.lineage.models import Snapshot

    plane = control_plane
    settings.EPOCHAL_STORE_URL = plane.store_url
    plane.add_input(files=2)
    plane.register()
    plane.start_worker()

    sessions: list[Watched] = []
    try:
        admin = watched(browser, live_server.url)
        sessions.append(admin)
        admin.login("admin", PASSWORD)
        page = admin.page

        # start from the UI, then watch epochs commit without reloading the page
        admin.go("/jobs/clicks-main/")
        admin.follow("[data-testid=actions] >> text=Start")
        admin.follow("[data-testid=confirm]", url=OPERATION_PAGE)
        page.wait_for_function(
            "/^\\d+$/.test(document.querySelector('#job-status [data-testid=epoch]')"
            ".textContent.trim())",
            timeout=SLOW,
        )
        first = epoch(admin)
        plane.add_input(files=4)
        epoch_above(admin, first)
        assert page.locator("[data-job]").count() == 0  # still the job page, never reloaded
        page.wait_for_function("document.querySelectorAll('.js-plotly-plot').length === 7")
        assert page.evaluate("document.getElementById('chart-allocation').data.length") == 2
        admin.screenshot("job")

        # rescale 2 -> 3: the key-group moves first, then the operation, then the new allocation
        admin.follow("[data-testid=actions] >> text=Rescale")
        page.fill("#id_parallelism", "3")
        page.wait_for_selector("[data-testid=moves-summary]")
        assert "of 128 key groups change task" in page.inner_text("[data-testid=moves-summary]")
        admin.screenshot("rescale")
        admin.follow("[data-testid=confirm]", url=OPERATION_PAGE)
        last_operation(admin, "rescale")
        page.wait_for_function(
            "document.getElementById('chart-allocation').data.length === 3", timeout=SLOW
        )
        assert page.get_attribute("#job-keygroups", "data-parallelism") == "3"
        rescaled = epoch(admin)
        plane.add_input(files=5)
        epoch_above(admin, rescaled)

        # roll back to a snapshot picked in the lineage graph
        target = (
            Snapshot.objects.filter(branch="main", kind="epoch", parallelism=2)
            .order_by("generation")
            .values_list("snapshot_id", flat=True)
            .first()
        )
        assert target is not None
        admin.go("/applications/clicks/lineage/?branch=main")
        page.click(f".graph-row[data-snapshot='{target}'] a.snap")
        page.wait_for_selector(f"[data-testid=snapshot-detail][data-snapshot='{target}']")
        admin.follow("text=Roll back clicks-main here")
        page.wait_for_selector("[data-testid=abandoned]")
        assert "This abandons" in page.inner_text("[data-testid=abandoned]")
        admin.screenshot("rollback")
        admin.follow("[data-testid=confirm]", url=OPERATION_PAGE)
        last_operation(admin, "rollback")

        # fork a new branch from that snapshot; an operator picks an existing version (the
        # source job's by default), never code
        admin.go(f"/applications/clicks/lineage/?at={target}")
        admin.follow("[data-testid=snapshot-actions] >> text=Fork from here")
        page.fill("#id_branch", "experiment")
        page.fill("#id_reason", "try v2")
        admin.follow("[data-testid=confirm]")
        page.wait_for_selector("[data-testid=operation][data-state=succeeded]", timeout=SLOW)
        admin.screenshot("operation")
        assert "experiment" in page.inner_text("[data-testid=operation-result]")
        admin.follow("[data-testid=operation-result] >> text=v1")
        page.wait_for_selector("[data-testid=version]")
        admin.screenshot("version")

        # the lineage graph shows the rescale, the rollback and the fork
        def marked() -> bool:
            admin.go("/applications/clicks/lineage/?size=200")
            return all(
                page.locator(f"svg .node[data-kind={kind}]").count() >= 1
                for kind in ("rescale", "rollback", "fork")
            )

        wait_for(marked, timeout=60, what="the rescale, rollback and fork in the graph")
        fork_node = page.locator("svg .node[data-kind=fork] title").first.text_content() or ""
        assert "reason: try v2" in fork_node and f"source_snapshot: {target}" in fork_node
        admin.screenshot("lineage")

        admin.go("/audit/?action=web")
        audit = page.inner_text("[data-testid=audit]")
        assert all(f"web {kind}" in audit for kind in ("start", "rescale", "rollback", "fork"))
        admin.screenshot("audit")

        # a viewer sees everything and no action button
        viewer = watched(browser, live_server.url)
        sessions.append(viewer)
        viewer.login("viewer", PASSWORD)
        viewer.go("/jobs/clicks-main/")
        viewer.page.wait_for_function("document.querySelectorAll('.js-plotly-plot').length === 7")
        assert viewer.page.locator("[data-testid=actions]").count() == 0
        viewer.go(f"/applications/clicks/lineage/?at={target}")
        assert viewer.page.locator("[data-testid=snapshot-detail]").count() == 1
        assert viewer.page.locator("[data-testid=snapshot-actions]").count() == 0
        assert viewer.page.locator("[data-testid=role]").text_content() == "viewer"
        viewer.screenshot("viewer-lineage")

        # the job page after it all: parallelism steps and operation markers
        admin.go("/jobs/clicks-main/")
        page.wait_for_function("document.querySelectorAll('.js-plotly-plot').length === 7")
        epoch_above(admin, -1)
        admin.screenshot("job-history")

        # stop from the UI; the overview shows both jobs
        admin.follow("[data-testid=actions] >> text=Stop")
        admin.follow("[data-testid=confirm]", url=OPERATION_PAGE)
        last_operation(admin, "stop")
        admin.go("/")
        assert page.locator("[data-job=clicks-main]").count() == 1
        assert page.locator("[data-job=clicks-experiment]").count() == 1
        admin.screenshot("overview")
    finally:
        for seen in sessions:  # no page keeps polling once the test's database goes
            seen.context.close()
    for seen in sessions:
        seen.assert_clean()
