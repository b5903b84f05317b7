"""A job web end to end: the clickstream job and a second-stage job reading its branch output
run as real Spark jobs launched by the control plane (Celery worker on Redis, PostgreSQL);
`manage.py align` coordinates the alignment protocol while input keeps arriving; the
downstream's aligned epochs read exactly one upstream epoch each and its totals equal the
upstream's output; the web shows the edge aligned."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest

from runners.engine import read_output
from runners.engine.branch_source import epoch_mapping, upstream_epochs
from snapshots_store import Repository
from tests.e2e.harness import ControlPlane, wait_for
from tests.scrape import scrape_metrics

pytestmark = [pytest.mark.services, pytest.mark.spark]


def test_align_a_running_downstream_job(control_plane: ControlPlane, settings: Any) -> None:
    from controlplane.operations.models import Operation
    from controlplane.operations.webs import web_graph

    plane = control_plane
    plane.add_input(files=2)
    plane.register()
    plane.manage(
        "register", "totals", "--job", "web-totals",
        "--job-args", json.dumps({"store": plane.store_url, "namespace": "clicks"}),
        "--job-name", "totals-main", "--parallelism", "1",
    )  # fmt: skip
    plane.start_worker()
    plane.manage("start", "clicks-main")
    plane.manage("start", "totals-main")
    stop = threading.Event()

    def feed() -> None:  # one more input file every few seconds: the upstream keeps committing
        files = 2
        while not stop.is_set() and files < 30:
            time.sleep(3)
            files += 1
            plane.add_input(files=files)

    feeder = threading.Thread(target=feed)
    feeder.start()
    try:
        out = plane.manage("align", "totals-main", "--upstream-job", "clicks-main")
    finally:
        stop.set()
        feeder.join()
    op = Operation.objects.get(kind="align")
    assert op.state == "succeeded", (out, op.error_message, plane.worker_log()[-3000:])
    scrape_metrics("align")
    start = op.result["aligned"]["from_epoch"]
    up = Repository.open(plane.store_url, "clicks")
    down = Repository.open(plane.store_url, "totals")
    plane.wait_caught_up()
    last = upstream_epochs(up, "main")[-1].epoch
    wait_for(
        lambda: epoch_mapping(down, "main")[-1].upstream_epochs[-1] == last,
        timeout=240,
        what="the downstream to read the upstream's last epoch",
    )
    mapping = epoch_mapping(down, "main")
    aligned = [m for m in mapping if m.epoch >= start]
    assert aligned and all(m.aligned and len(m.upstream_epochs) == 1 for m in aligned)
    read = [e for m in mapping for e in m.upstream_epochs]
    assert read == sorted(set(read)) == [e.epoch for e in upstream_epochs(up, "main")]
    sessions = read_output(up, "main").to_pandas()
    totals = read_output(down, "main").to_pandas().groupby("user").last()
    expected = sessions.groupby("user")["clicks"].agg(["size", "sum"])
    assert totals["count"].to_dict() == expected["size"].to_dict()
    assert totals["sum_clicks"].to_dict() == expected["sum"].to_dict()
    settings.EPOCHAL_STORE_URL = plane.store_url  # the jobs' store, as the worker sees it
    (edge,) = web_graph()["edges"]
    assert (edge["upstream"], edge["downstream"], edge["state"]) == (
        "clicks-main",
        "totals-main",
        "aligned",
    )
    assert edge["lag"] == 0 and not edge["lag_alarm"]
