"""The sink registry: admins register destinations (checked by the destination and against the
allowed roots and hosts), viewers read them, versions name them, the job spec carries their
config to the engine, a fork never names its parent's, and the sink lag is a job field and a
metric."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from rest_framework.test import APIClient

from controlplane.applications.models import Sink
from controlplane.applications.services import version_create
from controlplane.jobs.services import job_spec
from controlplane.lineage.services import reindex_application
from runners.job_spec import JobSpec
from tests.api.conftest import JOB_REFERENCE, Lineage

pytestmark = pytest.mark.django_db

Client = Callable[[str | None], APIClient]


def _register(
    name: str, kind: str, config: dict[str, Any], credentials_env: str = "", secret: str = ""
) -> Sink:
    sink = Sink(name=name, kind=kind, config=config, credentials_env=credentials_env,
                credentials_secret=secret)  # fmt: skip
    sink.full_clean()
    sink.save()
    return sink


@pytest.fixture
def roots(tmp_path: Path, settings: Any) -> Path:
    settings.EPOCHAL_SINK_ROOTS = (tmp_path,)
    settings.EPOCHAL_SINK_HOSTS = ("127.0.0.1",)
    return tmp_path


def test_admins_register_sinks_inside_the_allowed_places_only(roots: Path) -> None:
    _register("lake", "delta", {"path": str(roots / "lake")})
    cases = [
        ("delta", {"path": "/etc/lake"}, "path: /etc/lake is outside the sink roots"),
        ("rabbitmq_streams", {"url": "rabbitmq-stream://app:pw@127.0.0.1:5552/%2F",
                              "stream": "s"}, "url: no password in the URL"),
        ("redis_streams", {"url": "redis://:pw@127.0.0.1:6379/0", "stream": "s"},
         "url: no password in the URL"),
        ("iceberg", {"catalog_uri": "postgresql+psycopg://app:pw@127.0.0.1/db",
                     "warehouse": str(roots / "wh"), "table": "a.b"},
         "catalog_uri: no password in the URL"),
        ("redis_streams", {"url": "redis://127.0.0.1:6379/0", "stream": "s",
                           "password_env": "PW"}, "set credentials_env instead"),
        ("delta", {"path": str(roots / "x"), "mode": "a"}, "sink 'bad': mode: unknown field"),
        ("postgres", {"url": "postgresql://evil.example/db", "table": "t"},
         "url: host 'evil.example' is not an allowed sink host"),
        ("postgres", {"url": "postgresql://u:pw@127.0.0.1/db", "table": "t"}, "no password"),
        ("postgres", {"url": "postgresql://u@127.0.0.1/db", "table": "t",
                      "password_env": "PW"}, "set credentials_env instead"),
        ("nosuch", {}, "'nosuch' is not one of"),
    ]  # fmt: skip
    for kind, config, message in cases:
        with pytest.raises(ValidationError, match=message):
            _register("bad", kind, config)
    assert list(Sink.objects.values_list("name", flat=True)) == ["lake"]


def test_viewers_read_the_registry_and_nobody_writes_it_over_rest(
    roots: Path, client_for: Client
) -> None:
    _register("rows", "postgres", {"url": "postgresql://app@127.0.0.1/db", "table": "clicks"},
              credentials_env="CLICKS_DB_PASSWORD", secret="clicks-db")  # fmt: skip
    with pytest.raises(ValidationError, match="set credentials_env too"):  # a secret of what?
        _register("rows2", "postgres", {"url": "postgresql://app@127.0.0.1/db", "table": "t"},
                  secret="clicks-db")  # fmt: skip
    response = client_for("viewer").get("/api/sinks/")
    assert response.status_code == 200
    (row,) = response.json()["results"]
    assert row["name"] == "rows" and row["kind"] == "postgres"
    assert row["credentials_env"] == "CLICKS_DB_PASSWORD"
    assert row["credentials_secret"] == "clicks-db"  # the Kubernetes Secret's name, no more
    assert "password" not in str(row["config"]).lower()
    for role, status in (("operator", 403), ("admin", 405)):  # admins use the admin site
        posted = client_for(role).post("/api/sinks/", {"name": "x", "kind": "delta"})
        assert posted.status_code == status
    assert client_for(None).get("/api/sinks/").status_code in (401, 403)


def test_a_version_names_registered_sinks_and_the_spec_carries_their_config(
    roots: Path, lineage: Lineage, client_for: Client
) -> None:
    _register("lake", "delta", {"path": str(roots / "lake"), "partition_by": ["key"]})
    _register("rows", "postgres", {"url": "postgresql://app@127.0.0.1/db", "table": "clicks"},
              credentials_env="CLICKS_DB_PASSWORD", secret="clicks-db")  # fmt: skip
    url = f"/api/applications/{lineage.application.name}/versions/"
    refused = client_for("admin").post(
        url, {"job": JOB_REFERENCE, "config": {"sinks": ["lake", "nope"]}}, format="json"
    )
    assert refused.status_code == 400, refused.content
    error = refused.json()["error"]
    assert "no sink named 'nope' is registered" in str(error["fields"]["config"])
    created = client_for("admin").post(
        url, {"job": JOB_REFERENCE, "config": {"sinks": ["lake", "rows"]}}, format="json"
    )
    assert created.status_code == 201, created.content
    job = lineage.job
    job.version = lineage.application.versions.get(number=created.json()["number"])
    job.save()
    spec = job_spec(job, run_id="r1")
    assert spec.sinks == (
        {"name": "lake", "kind": "delta",
         "config": {"path": str(roots / "lake"), "partition_by": ["key"]}},
        {"name": "rows", "kind": "postgres",
         "config": {"url": "postgresql://app@127.0.0.1/db", "table": "clicks",
                    "password_env": "CLICKS_DB_PASSWORD"}},
    )  # fmt: skip
    # the password's variable, and the Kubernetes Secret holding it (mounted, never read here)
    assert spec.sink_credentials_env == {"rows": "CLICKS_DB_PASSWORD"}
    assert spec.sink_secrets == {"rows": "clicks-db"}
    assert JobSpec.from_dict(spec.to_dict()) == spec
    args = spec.engine_arguments()
    assert args[args.index("--sinks") + 1].startswith('[{"config": {"partition_by"')
    # the engine builds them from the arguments (what runners/engine/main.py does)
    from runners.engine.main import with_sinks
    from tests.engine.jobs import aggregate_job

    engine_job = with_sinks(aggregate_job(str(roots)), args[args.index("--sinks") + 1])
    assert [s.name for s in engine_job.sinks] == ["lake", "rows"]
    # a registration an admin broke after the version was made: refused before launch
    Sink.objects.filter(name="lake").update(config={"path": "/etc/lake"})
    with pytest.raises(Exception, match="sink 'lake' cannot be used: path: /etc/lake"):
        job_spec(job, run_id="r2")


def test_a_fork_never_names_its_parents_sink(
    roots: Path, lineage: Lineage, client_for: Client
) -> None:
    _register("lake", "delta", {"path": str(roots / "lake")})
    version = version_create(application=lineage.application, job=JOB_REFERENCE,
                             config={"sinks": ["lake"]})  # fmt: skip
    lineage.job.version = version
    lineage.job.save()
    body = {"kind": "fork", "params": {"snapshot": lineage.main[2], "branch": "try",
                                       "version": version.number}}  # fmt: skip
    response = client_for("operator").post(
        f"/api/jobs/{lineage.job.name}/operations/", body, format="json"
    )
    assert response.status_code == 422, response.content  # well-formed, names a taken sink
    message = response.json()["error"]["message"]
    assert "sink 'lake' is written by job clicks-main" in message and "sinks" in message

    # an operator forks with sinks of its own (registered ones nobody writes), or none
    from controlplane.operations.models import Operation

    _register("lake2", "delta", {"path": str(roots / "lake2")})
    unknown = dict(body, params={**body["params"], "sinks": ["nope"]})
    refused = client_for("operator").post(
        f"/api/jobs/{lineage.job.name}/operations/", unknown, format="json"
    )
    assert refused.status_code in (400, 422), refused.content
    assert "sinks" in refused.json()["error"]["fields"]
    for branch, sinks in (("try", ["lake2"]), ("none", [])):
        fork = dict(body, params={**body["params"], "branch": branch, "sinks": sinks})
        accepted = client_for("operator").post(
            f"/api/jobs/{lineage.job.name}/operations/", fork, format="json"
        )
        assert accepted.status_code in (200, 201, 202), accepted.content
        params = Operation.objects.get(pk=accepted.json()["id"]).params
        assert params["version_id"] is None  # a new version like the job's but for its sinks
        assert params["new_version"]["config"].get("sinks", []) == sinks
        assert params["new_version"]["job"] == JOB_REFERENCE


def test_the_sink_lag_is_a_job_field_and_a_metric(lineage: Lineage, client_for: Client) -> None:
    import dataclasses

    # the engine records the lag in each epoch's stats: a commit carrying it
    newest = lineage.repo.read_manifest(lineage.repo.resolve("main"))
    with_lag = dataclasses.replace(
        newest, epoch=5, parents=(lineage.repo.resolve("main"),),
        stats={**newest.stats, "sink_lag_epochs": 3, "sink_lag_s": 42.5},
    )  # fmt: skip
    lineage.repo.write_manifest(with_lag)
    lineage.repo.commit(with_lag, "main", expected_head=lineage.repo.resolve("main"),
                        reason="epoch 5")  # fmt: skip
    reindex_application(application=lineage.application, repo=lineage.repo)
    detail = client_for("viewer").get(f"/api/jobs/{lineage.job.name}/")
    assert detail.json()["sink_lag"] == {"epochs": 3, "seconds": 42.5}
    metrics = client_for("viewer").get("/metrics").content.decode()
    assert 'epochal_job_sink_lag_epochs{application="clicks",job_name="clicks-main"} 3.0' in metrics
    assert (
        'epochal_job_sink_lag_seconds{application="clicks",job_name="clicks-main"} 42.5' in metrics
    )


def test_rollback_of_a_job_with_a_log_sink_needs_a_confirmation_the_audit_keeps(
    roots: Path, lineage: Lineage, client_for: Client
) -> None:
    from controlplane.audit.models import AuditEntry

    _register("out", "kafka", {"bootstrap_servers": "127.0.0.1:9092", "topic": "clicks-out"})
    version = version_create(application=lineage.application, job=JOB_REFERENCE,
                             config={"sinks": ["out"]})  # fmt: skip
    lineage.job.version = version
    lineage.job.save()
    url = f"/api/jobs/{lineage.job.name}/operations/"
    body: dict[str, Any] = {"kind": "rollback", "params": {"to": lineage.main[2]}}
    refused = client_for("operator").post(url, body, format="json")
    assert refused.status_code == 422, refused.content
    error = refused.json()["error"]
    assert "out (kafka)" in error["message"] and "confirm_published" in error["fields"]
    body["params"]["confirm_published"] = True
    accepted = client_for("operator").post(url, body, format="json")
    assert accepted.status_code == 202, accepted.content
    entry = AuditEntry.objects.filter(action="operation.rollback", outcome="requested").get()
    assert entry.detail["params"]["confirm_published"] is True
    assert entry.detail["params"]["published_stay_in"] == ["out (kafka)"]
