"""A registered store's credentials come from the environment variables it names, read by the
worker when it reaches the store, never from the database. Through a live server, a real
Celery worker and a moto S3 server spoken to over HTTP: with the variables set (and no other
AWS credentials anywhere in the worker's environment) the lineage is copied there; without
them the operation fails naming the store and the variables, before the job is touched, and
nothing is written anywhere."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from controlplane.applications.models import Application, Store
from controlplane.applications.stores import StoreCredentialsMissing, store_register
from controlplane.jobs.models import Run
from controlplane.jobs.services import job_spec
from tests.api.conftest import Lineage
from tests.security.attacks import Worker, call, store_files
from tests.store.conftest import AtomicMotoServer, _free_port

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.services]

OPERATIONS = "/api/jobs/clicks-main/operations/"
KEY_ID, SECRET = "archive-key-id", "archive-secret"
#: every other place boto3 would look for credentials, unset in the worker
AWS_DEFAULTS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE")


@pytest.fixture(scope="module")
def s3_server() -> Iterator[str]:
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    port = _free_port()
    server = AtomicMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture
def bucket(s3_server: str) -> Any:
    client = boto3.client(
        "s3",
        endpoint_url=s3_server,
        region_name="us-east-1",
        aws_access_key_id=KEY_ID,
        aws_secret_access_key=SECRET,
    )
    name = f"archive-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=name)
    return client, name


def _keys(bucket: Any) -> list[str]:
    client, name = bucket
    return [item["Key"] for item in client.list_objects_v2(Bucket=name).get("Contents", [])]


@pytest.fixture
def worker_env(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str | None]:
    """No AWS credentials but the store's own variables (when the test sets them), and a home
    without ~/.aws: the worker can only have the credentials the store names."""
    home = tmp_path / "home"
    home.mkdir()
    env: dict[str, str | None] = dict.fromkeys(AWS_DEFAULTS)
    env.update(HOME=str(home), AWS_CONFIG_FILE=str(home / "none"))
    env.update(AWS_SHARED_CREDENTIALS_FILE=str(home / "none"), AWS_EC2_METADATA_DISABLED="true")
    env.update(getattr(request, "param", {}))
    return env


def _register(s3_server: str, bucket: Any) -> Store:
    return store_register(
        name="archive",
        url=f"s3://{bucket[1]}/lineages?endpoint_url={s3_server}",
        credentials_env="ARCHIVE",
    )


@pytest.mark.parametrize(
    "worker_env",
    [{"ARCHIVE_AWS_ACCESS_KEY_ID": KEY_ID, "ARCHIVE_AWS_SECRET_ACCESS_KEY": SECRET}],
    indirect=True,
)
def test_the_worker_reaches_a_store_with_the_credentials_its_variables_hold(
    live_server: Any, lineage: Lineage, store_url: str, tokens: dict[str, str],
    s3_server: str, bucket: Any, worker: Worker,
) -> None:  # fmt: skip
    store = _register(s3_server, bucket)
    body = {"kind": "migrate", "params": {"mode": "copy", "store": "archive"}}
    response = call(live_server.url, tokens["operator"], "POST", OPERATIONS, body)
    assert response.status_code == 202, response.text
    op = worker.wait_for(response.json()["id"])
    assert op.state == "succeeded", op.error_message
    copied = _keys(bucket)
    assert any("/refs/" in key or "refs" in key for key in copied), copied
    assert op.result["copy"]["objects_copied"] > 0
    assert Application.objects.get(name="clicks").store == store


def test_a_missing_variable_fails_the_operation_naming_the_store_and_the_variable(
    live_server: Any, lineage: Lineage, store_url: str, tokens: dict[str, str],
    s3_server: str, bucket: Any, worker: Worker,
) -> None:  # fmt: skip
    _register(s3_server, bucket)
    source = Path(store_url.removeprefix("file://"))
    before = store_files(source)
    body = {"kind": "migrate", "params": {"mode": "copy", "store": "archive"}}
    response = call(live_server.url, tokens["operator"], "POST", OPERATIONS, body)
    assert response.status_code == 202, response.text
    op = worker.wait_for(response.json()["id"])
    assert op.state == "failed"
    assert op.error_code == "store_credentials_missing"
    message = op.error_message
    assert "'archive'" in message and "ARCHIVE_AWS_ACCESS_KEY_ID" in message
    assert "ARCHIVE_AWS_SECRET_ACCESS_KEY" in message and "set" in message
    # It failed before anything moved: the first phase, the job untouched, nothing written.
    failed = [p["name"] for p in op.phases if p["state"] == "failed"]
    assert failed == ["check_store"], op.phases
    assert _keys(bucket) == []
    assert store_files(source) == before
    assert Application.objects.get(name="clicks").store is None


def test_a_job_on_the_store_is_launched_with_its_variables_or_not_at_all(
    lineage: Lineage, s3_server: str, bucket: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job whose application lives in the store gets the store's variable prefix in its
    launch spec (the local launcher hands `<prefix>_AWS_*` to the job as `AWS_*`, the
    Kubernetes launcher mounts the store's secret); with a variable missing, the launch is
    refused naming the store and the variable, before any run exists."""
    store = _register(s3_server, bucket)
    Application.objects.filter(pk=lineage.application.pk).update(store=store)
    lineage.job.refresh_from_db()
    monkeypatch.delenv("ARCHIVE_AWS_SECRET_ACCESS_KEY", raising=False)
    monkeypatch.setenv("ARCHIVE_AWS_ACCESS_KEY_ID", KEY_ID)
    with pytest.raises(StoreCredentialsMissing, match=r"'archive'.*ARCHIVE_AWS_SECRET_ACCESS_KEY"):
        job_spec(lineage.job, run_id="a1b2c3d4e5f6")
    assert not Run.objects.filter(job=lineage.job).exists()
    monkeypatch.setenv("ARCHIVE_AWS_SECRET_ACCESS_KEY", SECRET)
    spec = job_spec(lineage.job, run_id="a1b2c3d4e5f6")
    assert spec.store_credentials_env == "ARCHIVE"
    assert spec.store_url.startswith("s3://") and SECRET not in json.dumps(spec.to_dict())
