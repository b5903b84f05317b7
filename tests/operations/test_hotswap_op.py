"""The hotswap operation (CLI `manage.py hotswap`, REST through the operations endpoint)
swaps a running job for its fork at S while both jobs commit epochs on real Spark: each
epoch's results come from exactly one job (old up to S, new after)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from controlplane.applications.models import Application, ApplicationVersion
from controlplane.errors import InvalidRequest
from controlplane.jobs.models import Job
from controlplane.jobs.services import job_create
from controlplane.operations.executor import execute
from controlplane.operations.models import Operation
from controlplane.operations.services import operation_request
from runners.engine import EpochRunner
from runners.engine.hotswap import SwapSide, swap_output
from runners.engine.state_ops import new_branch_commit
from snapshots_store import Repository
from tests.conftest import registered_store
from tests.engine.jobs import aggregate_job, write_epochs
from tests.scrape import scrape_metrics

pytestmark = [pytest.mark.spark, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def pair(spark: Any, tmp_path: Path) -> dict[str, Any]:
    store = f"file://{tmp_path / 'store'}"
    data = str(tmp_path / "in")
    write_epochs(data, files=12, keys=50, records=200)
    app = Application.objects.create(
        name="app", store_namespace="app", max_parallelism=128, store=registered_store(store)
    )
    version = ApplicationVersion.objects.create(
        application=app, number=1, job="clickstream", config={}
    )
    old = job_create(name="app-main", application=app, version=version, parallelism=2)
    new = job_create(name="app-v2", application=app, version=version, branch="v2")
    repo = Repository.open(store, "app")
    EpochRunner(spark, aggregate_job(data), repo=repo, parallelism=2).run(max_epochs=2)
    new_branch_commit(
        repo, "main", "v2", kind="fork", operation_id="op-fork",
        provenance={"reason": "v2"}, code_version="2",
    )  # fmt: skip
    return {"store": store, "data": data, "old": old, "new": new, "repo": repo, "spark": spark}


def test_hotswap_operation_swaps_at_s(pair: dict[str, Any]) -> None:
    old_job: Job = pair["old"]
    requested = operation_request(
        kind="hotswap",
        application=old_job.application,
        job=old_job,
        params={"new_job": "app-v2", "lead_epochs": 3, "timeout_s": 180},
        dispatch=False,
    )
    runners = [
        EpochRunner(pair["spark"], aggregate_job(pair["data"]), repo=pair["repo"], branch=b)
        for b in ("main", "v2")
    ]
    stop = threading.Event()

    def jobs() -> None:  # the new job starts once the swap is prepared (it must not emit before)
        while not stop.is_set():
            prepared = "swap" in pair["repo"].read_control("v2")[0]
            for runner in runners if prepared else runners[:1]:
                runner.run_epoch()
            time.sleep(0.1)

    worker = threading.Thread(target=jobs)
    worker.start()
    try:
        outcome = execute(requested.operation.pk)
    finally:
        stop.set()
        worker.join(timeout=120)
    op = Operation.objects.get(pk=requested.operation.pk)
    assert outcome == "succeeded", (op.error_code, op.error_message)
    s = op.result["swap_epoch"]
    assert s == 5 and op.result["swapped"]
    scrape_metrics("hotswap")
    out = swap_output(
        SwapSide(pair["store"], "app", "main"), SwapSide(pair["store"], "app", "v2")
    ).to_pandas()
    by_epoch = out.groupby("_epoch")["_job"].unique()
    assert all(list(j) == ["old" if e <= s else "new"] for e, j in by_epoch.items())
    assert max(by_epoch.index) > s


def test_hotswap_requests_are_validated_and_the_cli_records_one(pair: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest, match="not in the future"):
        operation_request(
            kind="hotswap",
            application=pair["old"].application,
            job=pair["old"],
            params={"new_job": "app-v2", "swap_epoch": 1},
            dispatch=False,
        )
    with pytest.raises(InvalidRequest, match=r"no commits yet|share history"):
        Job.objects.filter(pk=pair["new"].pk).update(branch="nowhere")
        operation_request(
            kind="hotswap",
            application=pair["old"].application,
            job=pair["old"],
            params={"new_job": "app-v2"},
            dispatch=False,
        )
    Job.objects.filter(pk=pair["new"].pk).update(branch="v2")
    # no job acknowledges the prepare in time: the swap is aborted, the old job emits again
    requested = operation_request(
        kind="hotswap",
        application=pair["old"].application,
        job=pair["old"],
        params={"new_job": "app-v2", "timeout_s": 1},
        dispatch=False,
    )
    assert execute(requested.operation.pk) == "failed"
    for branch, role in (("main", "old"), ("v2", "new")):
        swap = pair["repo"].read_control(branch)[0]["swap"]
        assert (swap["phase"], swap["role"]) == ("aborted", role)
    call_command("hotswap", "app-main", "--new-job", "app-v2", "--swap-epoch", "9", "--no-wait")
    op = Operation.objects.get(kind="hotswap", params__swap_epoch=9)
    assert op.params["swap_epoch"] == 9 and op.params["new_job"] == "app-v2"
    op.state = "cancelled"
    op.save()
    # REST: the generic operations endpoint
    from rest_framework.test import APIClient

    from controlplane.accounts.services import user_create, user_token

    client = APIClient()
    token = user_token(user=user_create(username="op", role="operator", password="pw-operator1"))
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    r = client.post(
        "/api/jobs/app-main/operations/",
        {"kind": "hotswap", "params": {"new_job": "app-v2", "swap_epoch": 7}},
        format="json",
    )
    assert r.status_code == 202, r.content
    assert Operation.objects.filter(kind="hotswap", params__swap_epoch=7).exists()
