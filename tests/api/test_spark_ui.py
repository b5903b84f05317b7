"""The Spark UI's settings, its recorded address and the proxy's refusals (no open relay).

The proxy itself, over real HTTP to a real running job's UI, is in
tests/e2e/test_spark_ui_and_job_files.py; here the rules it relies on, without Spark."""

from __future__ import annotations

import json
from typing import Any

import pytest

from controlplane.errors import InvalidRequest, NotFound
from controlplane.jobs import spark_ui
from controlplane.jobs.models import Run, RunPhase
from runners.engine.session import DEFAULT_CONF, session_conf
from runners.engine.spark_ui import job_session_conf, submitted_conf
from runners.job_spec import JobSpec
from runners.kubernetes import manifests
from runners.launcher import pyspark_submit_args

STARTED = {"event": "started", "branch": "main", "standby": False, "load_s": 1, "session_s": 7}


def _log(address: str | None) -> str:
    lines = ['{"event": "epoch_start", "n": 1}', "Spark says hello"]
    return "\n".join([json.dumps({**STARTED, "spark_ui": address}), *lines])


def test_a_jobs_driver_turns_the_ui_on_unless_its_version_turns_it_off() -> None:
    args = pyspark_submit_args("local[2]", {"spark.ui.port": "0"}, 1024)
    assert submitted_conf({"PYSPARK_SUBMIT_ARGS": args}) == {"spark.ui.port": "0"}
    assert job_session_conf({"PYSPARK_SUBMIT_ARGS": args}) == {"spark.ui.enabled": "true"}
    off = pyspark_submit_args("local[2]", {"spark.ui.enabled": "false"}, 1024)
    assert job_session_conf({"PYSPARK_SUBMIT_ARGS": off}) == {"spark.ui.enabled": "false"}
    assert job_session_conf({}) == {"spark.ui.enabled": "true"}


def test_a_versions_submitted_settings_win_over_the_library_defaults() -> None:
    # a builder setting would override the --conf of PYSPARK_SUBMIT_ARGS: defaults step aside
    args = pyspark_submit_args("local[2]", {"spark.sql.shuffle.partitions": "64"}, 1024)
    env = {"PYSPARK_SUBMIT_ARGS": args}
    built = session_conf(job_session_conf(env), env)
    assert "spark.sql.shuffle.partitions" not in built  # the submitted 64 stays
    assert built["spark.ui.enabled"] == "true" and built["spark.python.worker.reuse"] == "true"
    assert session_conf(None, {}) == DEFAULT_CONF  # a library or test session: all defaults


def test_the_started_event_says_where_the_ui_is() -> None:
    assert spark_ui.reported_address(_log("http://localhost:41234")) == "http://localhost:41234"
    assert spark_ui.reported_address(_log(None)) == ""  # the UI is off
    assert spark_ui.reported_address('{"event": "epoch_start", "n": 1}\nnot json {') is None


def _run(runner: str = "local", **handle: str) -> Run:
    spec = JobSpec(
        application="Orders App",
        namespace="orders",
        branch="main",
        store_url="file:///tmp/store",
        job="clickstream",
        parallelism=2,
        run_id="3f2a1b9c0d1e",
    )
    return Run(
        run_id=spec.run_id,
        runner=runner,
        parallelism=2,
        spec=spec.to_dict(),
        handle={"location": "jobs-ns", **handle},
        phase=RunPhase.RUNNING,
    )


@pytest.mark.parametrize(
    ("runner", "address", "usable"),
    [
        ("local", "http://localhost:41234", True),
        ("local", "http://127.0.0.1:4040", True),
        ("local", "http://[::1]:4040", True),
        ("local", "http://10.0.0.7:4040", False),  # another machine: never
        ("local", "http://example.com:80", False),
        ("local", "https://localhost:4040", False),
        ("local", "http://localhost", False),  # no port
        ("local", "http://localhost:4040/admin", False),
        ("local", "http://user@localhost:4040", False),
        ("kubernetes", "http://orders-app-3f2a1b9c0d1e-driver-svc.jobs-ns.svc:4040", True),
        ("kubernetes", "http://orders-app-3f2a1b9c0d1e-driver-svc.jobs-ns.svc:8080", False),
        ("kubernetes", "http://other-driver-svc.jobs-ns.svc:4040", False),
        ("kubernetes", "http://localhost:4040", False),
    ],
)
def test_only_where_the_runs_driver_can_be_is_usable(
    runner: str, address: str, usable: bool
) -> None:
    assert (spark_ui.address_problem(_run(runner), address) == "") is usable


def test_the_kubernetes_driver_service_exposes_the_ui_port() -> None:
    spec = JobSpec.from_dict(_run("kubernetes").spec)
    service = manifests.driver_service(spec, _placement(), {"metadata": {"name": "p", "uid": "u"}})
    assert {"name": "spark-ui", "port": 4040, "targetPort": 4040} in service["spec"]["ports"]
    assert manifests.spark_conf(spec, _placement())["spark.ui.port"] == "4040"


def _placement() -> Any:
    return manifests.Placement(namespace="jobs-ns", image="epochal:test", service_account="sa")


@pytest.mark.parametrize(
    ("rest", "query", "target"),
    [
        ("", "", "/"),
        ("jobs/", "", "/jobs/"),
        ("stages/stage/", "id=3&attempt=0", "/stages/stage/?id=3&attempt=0"),
        ("static/spark logo.svg".replace(" ", "-"), "", "/static/spark-logo.svg"),
        ("api/v1/applications/app-1/jobs", "", "/api/v1/applications/app-1/jobs"),
        ("a%2f..", "", "/a%252f.."),  # a literal percent sign stays literal
    ],
)
def test_the_proxy_asks_the_driver_for_relative_paths_of_the_ui(
    rest: str, query: str, target: str
) -> None:
    assert spark_ui.upstream_path(rest, query) == target


@pytest.mark.parametrize(
    "rest",
    [
        "../admin/",
        "static/../../etc/passwd",
        "..",
        "./jobs/",
        "/etc/passwd",
        "/example.com/x",  # what `spark-ui//example.com/x` leaves
        "http://example.com/",
        "http:/example.com/",
        "javascript:alert(1)",
        "jobs\\..\\admin",
        "jobs/\x00",
        "jobs/ x",
        "jobs/\n",
    ],
)
def test_traversal_and_absolute_urls_are_refused(rest: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        spark_ui.upstream_path(rest)
    assert refused.value.fields == {"path": [refused.value.fields["path"][0]]}
    assert "only serves paths of the run's own UI" in refused.value.message


def test_redirects_come_back_through_the_proxy() -> None:
    own = "http://localhost:41234"
    assert spark_ui.rewrite_location(f"{own}/jobs/", own, "j") == "/jobs/j/spark-ui/jobs/"
    assert spark_ui.rewrite_location(f"{own}/x?a=1", own, "j") == "/jobs/j/spark-ui/x?a=1"
    assert spark_ui.rewrite_location("/jobs/j/spark-ui/stages/", own, "j") == (
        "/jobs/j/spark-ui/stages/"
    )
    assert spark_ui.rewrite_location("http://evil.example/", own, "j") == "/jobs/j/spark-ui/"
    assert spark_ui.rewrite_location("//evil.example/x", own, "j") == "/jobs/j/spark-ui/"


@pytest.mark.django_db
def test_the_run_records_its_address_once_and_the_proxy_uses_only_a_usable_one(
    lineage: Any,
) -> None:
    job = lineage.job
    reads: list[int] = []

    def logs(text: str) -> Any:
        def read(lines: int) -> str:
            reads.append(lines)
            return text

        return read

    with pytest.raises(NotFound, match="has no running run"):
        spark_ui.spark_ui_address(job)
    run = Run.objects.create(
        job=job, run_id="r1", runner="local", parallelism=2, spec={}, phase=RunPhase.RUNNING
    )
    spark_ui.record_spark_ui(run, logs('{"event": "epoch_start", "n": 1}'))
    assert run.spark_ui_url is None  # not started yet: looked for again on the next watch
    with pytest.raises(NotFound, match="not reported its Spark UI yet"):
        spark_ui.spark_ui_address(job)
    spark_ui.record_spark_ui(run, logs(_log("http://localhost:41234/")))
    assert Run.objects.get(pk=run.pk).spark_ui_url == "http://localhost:41234"
    assert spark_ui.spark_ui_address(job) == (run, "http://localhost:41234")
    spark_ui.record_spark_ui(run, logs(_log("http://10.0.0.7:1")))  # recorded already
    assert len(reads) == 2 and Run.objects.get(pk=run.pk).spark_ui_url == "http://localhost:41234"

    other = Run.objects.create(
        job=job, run_id="r2", runner="local", parallelism=2, spec={}, phase=RunPhase.RUNNING
    )
    spark_ui.record_spark_ui(other, logs(_log("http://10.0.0.7:4040")))
    assert Run.objects.get(pk=other.pk).spark_ui_url == ""  # never contacted
    with pytest.raises(NotFound, match="has no Spark UI"):
        spark_ui.spark_ui_address(job)
    assert spark_ui.run_spark_ui_text(other) == "off (the version sets spark.ui.enabled to false)"
    assert (
        spark_ui.run_spark_ui_text(run, "http://cp:8000/")
        == "http://cp:8000/jobs/clicks-main/spark-ui/"
    )


@pytest.mark.django_db
def test_every_run_gets_the_proxy_base_and_no_kill_links_and_a_version_may_turn_it_off(
    lineage: Any,
) -> None:
    from controlplane.applications.services import version_create
    from controlplane.jobs.services import job_spec

    conf = job_spec(lineage.job, run_id="r1").spark_conf
    assert conf["spark.ui.proxyBase"] == "/jobs/clicks-main/spark-ui"
    assert conf["spark.ui.killEnabled"] == "false"
    off = version_create(
        application=lineage.application,
        job=lineage.version.job,
        config={"spark_conf": {"spark.ui.enabled": "false"}},
    )
    lineage.job.version = off
    assert job_spec(lineage.job, run_id="r2").spark_conf["spark.ui.enabled"] == "false"


@pytest.mark.django_db
def test_the_proxy_needs_a_viewer_and_says_why_there_is_no_ui(lineage: Any, client: Any) -> None:
    from controlplane.accounts.services import user_create

    anonymous = client.get("/jobs/clicks-main/spark-ui/jobs/")
    assert anonymous.status_code == 302 and "/login/" in anonymous["Location"]
    client.force_login(user_create(username="ui-viewer", role="viewer"))
    stopped = client.get("/jobs/clicks-main/spark-ui/jobs/")
    assert stopped.status_code == 404 and b"has no running run" in stopped.content
    assert client.get("/jobs/clicks-main/spark-ui/http://example.com/").status_code == 400
    assert client.get("/jobs/no-such-job/spark-ui/").status_code == 404
    assert client.head("/jobs/clicks-main/spark-ui/").status_code == 404
    assert client.delete("/jobs/clicks-main/spark-ui/").status_code == 405

    page = client.get("/jobs/clicks-main/")
    assert page.status_code == 200 and b'data-testid="spark-ui-link"' not in page.content
    Run.objects.create(
        job=lineage.job,
        run_id="r1",
        runner="local",
        parallelism=2,
        spec={},
        phase=RunPhase.RUNNING,
        spark_ui_url="http://localhost:41234",
    )
    page = client.get("/jobs/clicks-main/")
    assert b'data-testid="spark-ui-link"' in page.content
    assert b'href="/jobs/clicks-main/spark-ui/"' in page.content
