"""The job web page: jobs as nodes, branch-output edges with alignment state, lag and alarm."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from controlplane.applications.models import Application, ApplicationVersion
from controlplane.jobs.models import Job
from controlplane.jobs.services import job_create
from controlplane.jobs.store import job_repository
from snapshots_store import Manifest
from tests.conftest import registered_store

pytestmark = pytest.mark.django_db


def make_job(name: str, store: str) -> Job:
    app = Application.objects.create(name=name, store_namespace=name, store=registered_store(store))
    version = ApplicationVersion.objects.create(application=app, number=1, job="m:j")
    return job_create(name=f"{name}-main", application=app, version=version)


def commit(job: Job, epoch: int, **fields: object) -> None:
    repo = job_repository(job)
    head = repo.read_ref("heads/main")
    parents = () if head is None else (head.target,)
    manifest = Manifest(
        branch="main",
        epoch=epoch,
        max_parallelism=8,
        parallelism=2,
        kind="epoch",
        parents=parents,
        **fields,
    )  # type: ignore[arg-type]
    repo.commit(manifest, "main", expected_head=parents[0] if parents else None, reason="e")


def test_the_web_shows_edges_with_lag_and_alarm(
    client_for: Callable[[str | None], Client], tmp_path: Path, settings: Any
) -> None:
    store = f"file://{tmp_path / 'store'}"
    up = make_job("counts", store)
    down = make_job("totals", store)
    make_job("lonely", store)
    for epoch in (1, 2, 3, 4):
        commit(up, epoch)
    inputs = {
        "upstream": {
            "kind": "branch_output",
            "store": store,
            "namespace": "counts",
            "branch": "main",
            "after_epoch": 0,
            "epochs": [1],
            "snapshots": [],
            "aligned": False,
        }
    }
    commit(down, 1, offsets={"upstream": {"epoch": 1, "snapshot": 0}}, extra={"inputs": inputs})
    settings.EPOCHAL_WEB_LAG_ALARM_EPOCHS = 2

    response = client_for("viewer").get("/web/")
    assert response.status_code == 200
    html = response.content.decode()
    assert 'data-testid="job-web"' in html
    for name in ("counts-main", "totals-main", "lonely-main"):
        assert f'href="/jobs/{name}/"' in html
    assert "unaligned · lag 3" in html
    assert "totals-main is 3 epochs behind counts-main" in html


def test_the_web_needs_a_login(client_for: Callable[[str | None], Client]) -> None:
    response = client_for(None).get("/web/")
    assert response.status_code in (302, 401, 403)


def test_the_web_shows_each_input_edge_of_a_fan_in_with_its_marker_and_lag(
    client_for: Callable[[str | None], Client], tmp_path: Path
) -> None:
    store = f"file://{tmp_path / 'store'}"
    fast, slow, merged = make_job("fast", store), make_job("slow", store), make_job("merged", store)
    for epoch in (1, 2, 3, 4, 5):
        commit(fast, epoch, processing_time_ms=epoch * 1000)
    commit(slow, 1, processing_time_ms=3000)

    def doc(namespace: str, epochs: list[int]) -> dict[str, object]:
        return {
            "kind": "branch_output", "store": store, "namespace": namespace, "branch": "main",
            "after_epoch": 0, "epochs": epochs, "snapshots": [], "aligned": False,
        }  # fmt: skip

    inputs = {
        "inputs": {
            "kind": "fan_in",
            "marker_ms": 3000,
            "inputs": {"fast": doc("fast", [1, 2, 3]), "slow": doc("slow", [1])},
        }
    }
    offsets = {"inputs": {"fast/epoch": 3, "fast/snapshot": 0, "slow/epoch": 1, "slow/snapshot": 0}}
    commit(merged, 1, offsets=offsets, extra={"inputs": inputs})

    html = client_for("viewer").get("/web/").content.decode()
    assert "merged · lag 2" in html  # fast: epochs 4 and 5 wait for the slow upstream
    assert "merged · lag 0" in html
    assert html.count("merged at marker 3000 ms") == 2
    assert "<td>inputs/fast</td>" in html and "<td>inputs/slow</td>" in html
