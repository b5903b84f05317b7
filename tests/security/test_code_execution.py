"""Finding 1: an operator must not run code of their choosing. Every attack goes through a
live server with a real Celery worker behind it (so an accepted attack would run: the first
test proves the worker executes what is accepted), and each must leave its canary file
uncreated, be refused with a 4xx naming the field, and be audited."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from controlplane.applications.models import ApplicationVersion
from controlplane.jobs.models import Job
from controlplane.operations.models import Operation
from tests.api.conftest import Lineage
from tests.conftest import SUBPROCESS_PYTHONPATH
from tests.security.attacks import ROOT, Worker, call, refusals, store_files

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.services]

FORK = "/api/applications/clicks/operations/"
MIGRATE = "/api/jobs/clicks-main/operations/"


def _state(store_url: str) -> tuple[int, int, int, dict[str, tuple[int, int]]]:
    """Versions, jobs, operations and the store's files: equal before and after = nothing."""
    return (
        ApplicationVersion.objects.count(),
        Job.objects.count(),
        Operation.objects.count(),
        store_files(Path(store_url.removeprefix("file://"))),
    )


def _settle(worker: Worker) -> None:
    """Give the worker time to run anything that might have been queued."""
    time.sleep(3)
    assert worker.process.poll() is None


def test_the_worker_runs_what_is_accepted(
    live_server: Any, lineage: Lineage, tokens: dict[str, str], worker: Worker
) -> None:
    accepted = call(live_server.url, tokens["operator"], "POST", MIGRATE, {"kind": "savepoint"})
    assert accepted.status_code == 202, accepted.text
    assert worker.wait_for(accepted.json()["id"]).state == "succeeded"


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"job": "os:system", "config": {"job_args": {"command": "touch CANARY"}}}, "job"),
        ({"config": {"job_args": {"command": "touch CANARY"}}}, "config"),
        (
            {"config": {"spark_conf": {"spark.driver.extraJavaOptions": "-javaagent:CANARY"}}},
            "config",
        ),
        ({"code_version": "evil", "job": "clickstream"}, "code_version"),
    ],
    ids=["job-os-system", "job-args", "jvm-options-in-config", "new-version"],
)
def test_an_operator_fork_cannot_create_a_version(
    live_server: Any,
    lineage: Lineage,
    store_url: str,
    tokens: dict[str, str],
    worker: Worker,
    tmp_path: Path,
    params: dict[str, Any],
    named: str,
) -> None:
    canary = tmp_path / "canary"
    params = _with_canary(params, canary)
    before = _state(store_url)
    body = {"kind": "fork", "params": {"snapshot": lineage.main[1], "branch": "x", **params}}
    response = call(live_server.url, tokens["operator"], "POST", FORK, body)
    assert response.status_code == 403, response.text
    assert named in response.json()["error"]["fields"]
    assert refusals(FORK, 403, named), "the refusal is audited with the field"
    _settle(worker)
    assert _state(store_url) == before and lineage.repo.read_ref("heads/x") is None
    assert not canary.exists()


def _with_canary(value: Any, canary: Path) -> Any:
    if isinstance(value, dict):
        return {k: _with_canary(v, canary) for k, v in value.items()}
    if isinstance(value, str):
        return value.replace("CANARY", str(canary))
    return value


@pytest.mark.parametrize(
    ("function", "status"),
    # a module:attr is not a name (400); a name nothing registered is well-formed (422)
    [("os:system", 400), ("builtins:exec", 400), ("not-registered", 422)],
)
def test_migrate_runs_only_registered_state_migrations(
    live_server: Any,
    lineage: Lineage,
    store_url: str,
    tokens: dict[str, str],
    worker: Worker,
    function: str,
    status: int,
) -> None:
    before = _state(store_url)
    body = {"kind": "migrate", "params": {"mode": "transform", "function": function}}
    response = call(live_server.url, tokens["operator"], "POST", MIGRATE, body)
    assert response.status_code == status, response.text
    assert "function" in response.json()["error"]["fields"]
    assert refusals(MIGRATE, status, "function")
    _settle(worker)
    assert _state(store_url) == before


def test_versions_are_created_by_admins_naming_entry_points(
    live_server: Any, lineage: Lineage, store_url: str, tokens: dict[str, str]
) -> None:
    path = "/api/applications/clicks/versions/"
    before = _state(store_url)
    by_operator = call(live_server.url, tokens["operator"], "POST", path, {"job": "clickstream"})
    assert by_operator.status_code == 403
    for job in ("os:system", "runners.jobs.clickstream:job", "not-installed"):
        response = call(live_server.url, tokens["admin"], "POST", path, {"job": job})
        assert response.status_code == 400, response.text
        assert "job" in response.json()["error"]["fields"]
    assert len(refusals(path, 400, "job")) == 3
    assert _state(store_url) == before
    listed = call(live_server.url, tokens["viewer"], "GET", "/api/entry-points/").json()
    assert "clickstream" in {e["name"] for e in listed["jobs"]}
    assert all(":" not in e["name"] for e in listed["jobs"] + listed["state_migrations"])


def test_the_engine_loads_jobs_only_by_entry_point_name(tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    done = subprocess.run(
        [sys.executable, "-m", "runners.engine.main", "--job", "os:system",
         "--job-args", f'{{"command": "touch {canary}"}}',
         "--store", f"file://{tmp_path / 'store'}", "--namespace", "x"],
        cwd=ROOT, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": SUBPROCESS_PYTHONPATH},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode != 0
    assert "not an entry-point name" in done.stderr and "module:attr" in done.stderr
    assert not canary.exists() and not (tmp_path / "store").exists()


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("spark.driver.extraJavaOptions", "-javaagent:CANARY"),
        ("spark.executor.extraJavaOptions", "-XX:OnOutOfMemoryError=touch CANARY"),
        ("spark.driver.extraClassPath", "CANARY"),
        ("spark.jars", "file://CANARY"),
        ("spark.files", "CANARY"),
        ("spark.extraListeners", "evil.Listener"),
        ("spark.plugins", "evil.Plugin"),
        ("spark.executor.memory", "10t"),  # an allowed key out of bounds
        ("spark.executor.instances", 4),  # an allowed key, not a string
    ],
)
def test_an_operator_chooses_only_bounded_resource_spark_settings(
    live_server: Any,
    lineage: Lineage,
    store_url: str,
    tokens: dict[str, str],
    worker: Worker,
    tmp_path: Path,
    key: str,
    value: Any,
) -> None:
    canary = tmp_path / "canary"
    value = _with_canary(value, canary)
    before = _state(store_url)
    job = {"name": "tuned", "application": "clicks", "branch": "tuned", "spark_conf": {key: value}}
    created = call(live_server.url, tokens["operator"], "POST", "/api/jobs/", job)
    fork = {
        "kind": "fork",
        "params": {"snapshot": lineage.main[1], "branch": "tuned", "spark_conf": {key: value}},
    }
    forked = call(live_server.url, tokens["operator"], "POST", FORK, fork)
    for response, path in ((created, "/api/jobs/"), (forked, FORK)):
        assert response.status_code == 400, response.text
        assert f"spark_conf.{key}" in response.json()["error"]["fields"]
        assert refusals(path, 400, "spark_conf")
    _settle(worker)
    assert _state(store_url) == before and not canary.exists()


def test_allowed_resource_settings_reach_the_run_over_the_versions(
    live_server: Any, lineage: Lineage, tokens: dict[str, str]
) -> None:
    from controlplane.jobs.services import job_spec

    settings = {"spark.executor.memory": "4g", "spark.sql.shuffle.partitions": "64"}
    job = {"name": "tuned", "application": "clicks", "branch": "tuned", "spark_conf": settings}
    created = call(live_server.url, tokens["operator"], "POST", "/api/jobs/", job)
    assert created.status_code == 201, created.text
    spec = job_spec(Job.objects.get(name="tuned"), run_id="abc123")
    assert {k: spec.spark_conf[k] for k in settings} == settings
