"""End to end, on one real running Spark job of a real control plane (Celery worker with the
reconciler, the local launcher):

- its Spark UI is on, its address recorded with the run, linked by `epochal jobs show`, and
  served through the control plane's authenticated proxy over real HTTP (Spark's own pages,
  their links rewritten to the proxy; anonymous users sent to the login; traversal, absolute
  URLs and writes refused);
- `epochal export > jobs.yaml`, an edit of the parallelism and `epochal apply -f jobs.yaml`
  rescale it through an ordinary rescale operation; `epochal diff` shows nothing left, a
  second apply requests nothing, and the diff of the old file shows the drift.
"""

from __future__ import annotations

import http.client
import json
import re
import time
import urllib.parse
from typing import Any

import pytest
import yaml

from tests.e2e.harness import ControlPlane, wait_for

# a job start and a live rescale: minutes on a loaded machine. The default suite covers the
# same through the demo (tests/controlplane: the Spark UI link opened through the proxy) and
# the CLI and REST tests of the job file (tests/cli, tests/api).
pytestmark = [pytest.mark.services, pytest.mark.spark, pytest.mark.slow]

JOB = "clicks-main"


def _get(base: str, path: str, cookie: str = "", method: str = "GET") -> http.client.HTTPResponse:
    """One request exactly as written (no client-side normalisation of `path`)."""
    parts = urllib.parse.urlsplit(base)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)
    connection.request(method, path, headers={"Cookie": cookie} if cookie else {})
    response = connection.getresponse()
    response.body = response.read()  # type: ignore[attr-defined]
    connection.close()
    return response


def test_spark_ui_proxy_and_job_file_rescale(control_plane: ControlPlane, live_server: Any) -> None:
    from django.test import Client

    from controlplane.accounts.roles import VIEWER
    from controlplane.accounts.services import user_create
    from controlplane.jobs.models import Job, Run
    from controlplane.operations.models import Operation

    plane = control_plane
    began = time.monotonic()
    plane.add_input(files=2, clicks=300)
    plane.register(JOB, parallelism=2)
    plane.start_worker()
    out = plane.epochal("start", JOB)
    assert "succeeded" in out, out

    run = wait_for(
        lambda: Run.objects.filter(job__name=JOB, spark_ui_url__isnull=False).first(),
        timeout=120,
        what=f"the run's Spark UI address; worker log:\n{plane.worker_log()}",
    )
    assert re.fullmatch(r"http://(localhost|127\.0\.0\.1):\d+", run.spark_ui_url), run.spark_ui_url
    assert run.spec["spark_conf"]["spark.ui.proxyBase"] == f"/jobs/{JOB}/spark-ui"
    shown = plane.epochal("jobs", "show", JOB)
    assert f"spark ui:    http://127.0.0.1:8000/jobs/{JOB}/spark-ui/" in shown, shown

    # -- the proxy, over real HTTP ------------------------------------------------------------
    print(f"proxy from {time.monotonic() - began:.1f} s")
    base = live_server.url
    viewer = user_create(username="ui-reader", role=VIEWER)
    client = Client()
    client.force_login(viewer)
    cookie = f"sessionid={client.cookies['sessionid'].value}"
    prefix = f"/jobs/{JOB}/spark-ui"

    anonymous = _get(base, f"{prefix}/jobs/")
    assert anonymous.status == 302 and "/login/" in anonymous.getheader("Location", "")

    start = _get(base, f"{prefix}/", cookie)  # Spark redirects to its jobs page
    assert start.status == 302, start.body  # type: ignore[attr-defined]
    assert start.getheader("Location") == f"{prefix}/jobs/"  # the driver's own address: rewritten
    page = _get(base, f"{prefix}/jobs/", cookie)
    html = page.body.decode()  # type: ignore[attr-defined]
    assert page.status == 200 and "Spark Jobs" in html, html[:500]
    links = re.findall(r'(?:href|src)="(/[^"]*)"', html)
    assert links and all(link.startswith(f"{prefix}/") for link in links), links[:10]
    stages = _get(base, f"{prefix}/stages/", cookie)
    assert stages.status == 200 and b"Stages" in stages.body  # type: ignore[attr-defined]
    static = next(link for link in links if link.endswith(".css"))
    assert _get(base, static, cookie).status == 200

    for path in (
        f"{prefix}/../../admin/",
        f"{prefix}/static/%2e%2e/%2e%2e/etc/passwd",
        f"{prefix}/http://example.com/",
        f"{prefix}//example.com/x",
    ):
        refused = _get(base, path, cookie)
        assert refused.status in (400, 404), (path, refused.status)
        assert b"Spark Jobs" not in refused.body  # type: ignore[attr-defined]
    assert _get(base, f"{prefix}/http://example.com/", cookie).status == 400
    assert _get(base, f"{prefix}/jobs/", cookie, method="POST").status in (403, 405)

    # -- the job file ---------------------------------------------------------------------------
    print(f"job file from {time.monotonic() - began:.1f} s")
    exported = plane.epochal("export")
    document = yaml.safe_load(exported)
    [entry] = document["jobs"]
    assert entry["name"] == JOB and entry["parallelism"] == 2 and entry["state"] == "running"
    (plane.tmp / "old.yaml").write_text(exported)
    entry["parallelism"] = 1  # live: the run has the cores (no restart)
    (plane.tmp / "jobs.yaml").write_text(yaml.safe_dump(document))
    diff = plane.epochal("diff", "-f", "jobs.yaml")
    assert f"{JOB}: parallelism 2 -> 1: rescale operation" in diff, diff
    applied = plane.epochal("apply", "-f", "jobs.yaml", "--json")
    [outcome] = json.loads(applied[applied.index("[") :])
    assert outcome["request"] == "rescale" and outcome["outcome"] == "requested", outcome
    again = json.loads(plane.epochal("apply", "-f", "jobs.yaml", "--json"))
    assert again == [] or again[0]["outcome"] == "already requested", again
    operation = Operation.objects.get(pk=outcome["operation"])
    assert operation.requested_via == "cli" and operation.reason == "job file"
    plane.add_input(files=3, clicks=300)  # a third file: its epoch applies the new parallelism
    wait_for(
        lambda: Operation.objects.get(pk=operation.pk).state == "succeeded" or None,
        timeout=240,
        what=f"the rescale to succeed; worker log:\n{plane.worker_log()}",
    )
    print(f"rescaled at {time.monotonic() - began:.1f} s")
    assert Job.objects.get(name=JOB).parallelism == 1
    assert "no changes" in plane.epochal("diff", "-f", "jobs.yaml")
    assert "no changes" in plane.epochal("apply", "-f", "jobs.yaml")
    drift = plane.epochal("diff", "-f", "old.yaml")
    assert f"{JOB}: parallelism 1 -> 2: rescale operation" in drift, drift
