"""The align operation coordinates the alignment protocol through the control document while the
jobs run (real Spark epochs in a thread); the web is validated (cycles refused, naming the
cycle) and shows alignment state, lag and the lag alarm."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from controlplane.applications.models import Application, ApplicationVersion
from controlplane.errors import InvalidRequest
from controlplane.jobs.models import Job
from controlplane.jobs.services import job_create
from controlplane.operations.executor import execute
from controlplane.operations.services import operation_request
from controlplane.operations.webs import find_cycle, web_graph
from runners.engine import EpochRunner
from runners.engine.branch_source import BranchOutputSource, epoch_mapping
from snapshots_store import Repository
from tests.conftest import registered_store
from tests.engine.jobs import aggregate_job, write_epochs
from tests.engine.test_branch_source import _by_epoch, downstream_job

pytestmark = [pytest.mark.spark, pytest.mark.django_db(transaction=True)]


def _job(name: str, store: str) -> Job:
    app = Application.objects.create(
        name=name, store_namespace=name, max_parallelism=128, store=registered_store(store)
    )
    version = ApplicationVersion.objects.create(
        application=app, number=1, job="clickstream", config={}
    )
    return job_create(name=f"{name}-main", application=app, version=version, parallelism=2)


@pytest.fixture
def web(spark: Any, tmp_path: Path) -> dict[str, Any]:
    store = f"file://{tmp_path / 'store'}"
    data = str(tmp_path / "in")
    write_epochs(data, files=40, keys=60, records=300)
    up_job, down_job = _job("counts", store), _job("echo", store)
    up, down = Repository.open(store, "counts"), Repository.open(store, "echo")
    upstream = EpochRunner(spark, aggregate_job(data), repo=up, parallelism=2)
    upstream.run(max_epochs=3)
    source = BranchOutputSource(store, "counts", "main", max_epochs_per_epoch=1)
    downstream = EpochRunner(spark, downstream_job(source), repo=down, parallelism=2)
    downstream.run(max_epochs=1)
    return locals()


def test_align_operation_runs_the_protocol(web: dict[str, Any], settings: Any) -> None:
    graph = web_graph()
    (edge,) = graph["edges"]
    assert (edge["upstream"], edge["downstream"]) == ("counts-main", "echo-main")
    assert edge["state"] == "unaligned" and edge["lag"] == 2 and not edge["lag_alarm"]
    settings.EPOCHAL_WEB_LAG_ALARM_EPOCHS = 1
    assert web_graph()["edges"][0]["lag_alarm"]
    requested = operation_request(
        kind="align",
        application=web["down_job"].application,
        job=web["down_job"],
        params={"upstream_job": "counts-main", "timeout_s": 120},
        dispatch=False,
    )
    op = requested.operation
    stop = threading.Event()

    source = BranchOutputSource(web["store"], "counts", "main")  # unbounded: catches up
    downstream = EpochRunner(web["spark"], downstream_job(source), repo=web["down"])

    def jobs() -> None:  # both jobs keep committing epochs while the operation coordinates
        while not stop.is_set():
            web["upstream"].run(max_epochs=1)
            downstream.run(max_epochs=1)
            time.sleep(0.1)

    worker = threading.Thread(target=jobs)
    worker.start()
    try:
        outcome = execute(op.pk)
    finally:
        stop.set()
        worker.join(timeout=120)
    op.refresh_from_db()
    assert outcome == "succeeded", (op.error, op.phases)
    assert op.result["aligned"]["state"] == "aligned"
    start = op.result["aligned"]["from_epoch"]
    mapping = epoch_mapping(web["down"], "main")
    aligned = [m for m in mapping if m.epoch >= start]
    assert aligned and all(m.aligned and len(m.upstream_epochs) == 1 for m in aligned)
    up_out, down_out = _by_epoch(_out(web["up"])), _by_epoch(_out(web["down"]))
    for m in aligned:
        assert down_out.get(m.epoch, []) == up_out.get(m.upstream_epochs[0], [])
    # abort through the same operation kind
    requested = operation_request(
        kind="align",
        application=web["down_job"].application,
        job=web["down_job"],
        params={"upstream_job": "counts-main", "command": "abort"},
        dispatch=False,
    )
    assert execute(requested.operation.pk) == "succeeded"
    assert web_graph()["edges"][0]["state"] == "unaligned"


def _out(repo: Repository) -> Any:
    from runners.engine import read_output

    return read_output(repo, "main")


def test_cycles_across_jobs_are_refused_naming_the_cycle(web: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest, match="counts-main -> echo-main -> counts-main") as exc:
        operation_request(
            kind="align",
            application=web["up_job"].application,
            job=web["up_job"],
            params={"upstream_job": "echo-main"},
            dispatch=False,
        )
    assert exc.value.code == "web_cycle"
    assert find_cycle([("a", "b"), ("b", "c"), ("c", "a")]) == ["a", "b", "c", "a"]
    assert find_cycle([("a", "b"), ("a", "c"), ("b", "c")]) is None
