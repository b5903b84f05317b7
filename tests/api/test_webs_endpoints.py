"""REST endpoints of job webs: state at a snapshot / epoch (pending -> 202), the cross-job
"as of my epoch" query, and the epoch mapping."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from rest_framework.test import APIClient

from controlplane.applications.services import application_create
from runners.engine import EpochRunner
from runners.engine.branch_source import BranchOutputSource
from snapshots_store import Repository
from tests.engine.jobs import aggregate_job, write_epochs
from tests.engine.test_branch_source import downstream_job

pytestmark = [pytest.mark.spark, pytest.mark.django_db]


@pytest.fixture
def web(spark: Any, store_url: str, tokens: dict[str, str], tmp_path: Any) -> dict[str, Any]:
    data = str(tmp_path / "in")
    write_epochs(data, files=3, keys=40, records=200)
    up_app = application_create(name="counts")
    down_app = application_create(name="echo")
    up = Repository.open(store_url, "counts")
    down = Repository.open(store_url, "echo")
    upstream = EpochRunner(spark, aggregate_job(data), repo=up, parallelism=2)
    upstream.run(max_epochs=1)
    source = BranchOutputSource(store_url, "counts", "main")
    downstream = EpochRunner(spark, downstream_job(source), repo=down, parallelism=2)
    downstream.run()
    upstream.run(max_epochs=2)
    downstream.run()
    return {"up": up, "down": down, "apps": (up_app, down_app)}


def test_state_at_epoch_snapshot_and_pending(
    web: dict[str, Any], client_for: Callable[[str | None], APIClient]
) -> None:
    client = client_for("viewer")
    r = client.get("/api/applications/counts/state/", {"key": "key-3", "epoch": 2})
    assert r.status_code == 200, r.json()
    body = r.json()
    assert body["status"] == "ok" and body["epoch"] == 2 and len(body["rows"]) == 1
    assert body["rows"][0]["key"] == "key-3"
    again = client.get("/api/applications/counts/state/", {"key": "key-3", "epoch": 2})
    assert again.json() == body
    by_id = client.get(
        "/api/applications/counts/state/", {"key": "key-3", "snapshot": body["snapshot_id"]}
    )
    assert by_id.json()["rows"] == body["rows"]
    r = client.get("/api/applications/counts/state/", {"key": "key-3", "epoch": 9, "timeout": 0.2})
    assert r.status_code == 202 and r.json()["status"] == "pending"
    page = client.get("/api/applications/counts/state/", {"key_group": 5, "limit": 3}).json()
    assert page["status"] == "ok" and len(page["rows"]) <= 3
    bad = client.get("/api/applications/counts/state/", {"key_group": 5000})
    assert bad.status_code == 422 and "key group" in bad.json()["error"]["message"]
    assert client_for(None).get("/api/applications/counts/state/").status_code == 401


def test_cross_job_query_and_mapping(
    web: dict[str, Any], client_for: Callable[[str | None], APIClient]
) -> None:
    client = client_for("viewer")
    mapping = client.get("/api/applications/echo/mapping/").json()["results"]
    assert [m["upstream_epochs"] for m in mapping] == [[1], [2, 3]]
    assert mapping[1]["namespace"] == "counts"
    r = client.get(
        "/api/applications/counts/state/",
        {"key": "key-3", "as_of_application": "echo", "as_of_epoch": 2},
    )
    assert r.status_code == 200 and r.json()["epoch"] == 3
    direct = client.get("/api/applications/counts/state/", {"key": "key-3", "epoch": 3})
    assert r.json() == direct.json()


def test_every_combination_of_state_parameters_gets_an_answer(
    web: dict[str, Any], client_for: Callable[[str | None], APIClient]
) -> None:
    """The schema cannot say which query parameters go together, so the server answers each
    combination: snapshot with epoch is that epoch of the snapshot's history, as_of_application
    without as_of_epoch is as of the caller's head, and what cannot be answered is a 422."""
    client = client_for("viewer")
    url = "/api/applications/counts/state/"
    head = client.get(url, {"key": "key-3"}).json()
    at_2 = client.get(url, {"key": "key-3", "epoch": 2}).json()
    both = client.get(url, {"key": "key-3", "snapshot": head["snapshot_id"], "epoch": 2})
    assert both.status_code == 200, both.json()
    assert both.json()["snapshot_id"] == at_2["snapshot_id"] != head["snapshot_id"]
    assert both.json()["rows"] == at_2["rows"]
    after = client.get(url, {"snapshot": at_2["snapshot_id"], "epoch": 3})
    assert after.status_code == 422 and "comes after it" in after.json()["error"]["message"]
    as_of_head = client.get(url, {"key": "key-3", "as_of_application": "echo"})
    as_of_2 = client.get(url, {"key": "key-3", "as_of_application": "echo", "as_of_epoch": 2})
    assert as_of_head.status_code == 200 and as_of_head.json() == as_of_2.json()  # echo is at 2
    orphan = client.get(url, {"key": "key-3", "as_of_epoch": 2})
    assert orphan.status_code == 422
    assert "as_of_application" in orphan.json()["error"]["message"]
    typed = client.get(url, {"key": "abc", "key_type": "int"})
    assert typed.status_code == 422 and "key_type=int" in typed.json()["error"]["message"]
