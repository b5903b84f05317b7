"""Finding 7, fork: every parameter is validated before any side effect (a refused fork leaves
no version, branch, job or operation), and of concurrent forks to the same new branch exactly
one is accepted — the database decides (a unique index on the active operation's target
branch), not a check-then-act. Through a live server."""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests
from django.core.servers.basehttp import ThreadedWSGIServer

from controlplane.applications.models import ApplicationVersion
from controlplane.jobs.models import Job
from controlplane.operations.models import Operation
from tests.api.conftest import Lineage
from tests.security.attacks import call, refusals, store_files

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.services]

FORK = "/api/applications/clicks/operations/"
CLIENTS = 20
ThreadedWSGIServer.request_queue_size = 128  # 20 simultaneous connects


def _nothing_changed(store_url: str, before: Any) -> None:
    assert _counts(store_url) == before


def _counts(store_url: str) -> Any:
    return (
        ApplicationVersion.objects.count(),
        Job.objects.count(),
        Operation.objects.count(),
        store_files(Path(store_url.removeprefix("file://"))),
    )


@pytest.mark.parametrize(
    ("params", "status", "field"),
    [
        ({"job_name": "bad name!"}, 400, "job_name"),
        ({"job_name": "clicks-main"}, 409, "job_name"),
        ({"parallelism": 100000}, 400, "parallelism"),
        ({"parallelism": 0}, 400, "parallelism"),
        ({"version": 99}, 422, "version"),  # well-formed, but names nothing: 422
        ({"snapshot": "no-such-snapshot"}, 422, "snapshot"),
        ({"branch": "main"}, 409, "branch"),
        ({"start": "yes"}, 400, "start"),
        ({"spark_conf": {"spark.driver.extraJavaOptions": "-javaagent:/tmp/x.jar"}}, 400,
         "spark_conf.spark.driver.extraJavaOptions"),
    ],
    ids=["job-name", "job-exists", "parallelism-over-m", "parallelism-0", "version",
         "snapshot", "branch-exists", "start", "jvm-option"],
)  # fmt: skip
def test_a_refused_fork_leaves_nothing_behind(
    live_server: Any,
    lineage: Lineage,
    store_url: str,
    tokens: dict[str, str],
    params: dict[str, Any],
    status: int,
    field: str,
) -> None:
    before = _counts(store_url)
    body = {
        "kind": "fork",
        "params": {"snapshot": lineage.main[1], "branch": "exp-2", **params},
    }
    response = call(live_server.url, tokens["operator"], "POST", FORK, body)
    assert response.status_code == status, response.text
    assert field in response.json()["error"]["fields"], response.text
    assert refusals(FORK, status, field.split(".")[0])
    _nothing_changed(store_url, before)
    assert lineage.repo.read_ref("heads/exp-2") is None


def test_concurrent_forks_to_one_new_branch_accept_exactly_one(
    postgresql_db: None, live_server: Any, lineage: Lineage, tokens: dict[str, str]
) -> None:
    barrier = threading.Barrier(CLIENTS)

    def one(i: int) -> requests.Response:
        barrier.wait(timeout=60)
        body = {
            "kind": "fork",
            "params": {"snapshot": lineage.main[1], "branch": "race", "job_name": f"race-{i}"},
        }
        return call(live_server.url, tokens["operator"], "POST", FORK, body)

    with ThreadPoolExecutor(max_workers=CLIENTS) as pool:
        responses = list(pool.map(one, range(CLIENTS)))
    statuses = Counter(r.status_code for r in responses)
    assert statuses == {202: 1, 409: CLIENTS - 1}, statuses
    for response in responses:
        if response.status_code == 409:
            error = response.json()["error"]
            assert error["code"] == "branch_pending" and "branch" in error["fields"]
    forks = Operation.objects.filter(kind="fork")
    assert forks.count() == 1 and forks.get().target_branch == "race"
