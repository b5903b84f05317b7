"""Fixtures of the fault suite: the store suite's moto S3 server (over HTTP) and a fault proxy
in front of it per test."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from runners.engine import EpochRunner
from snapshots_store import Repository
from tests.engine.jobs import crash_job, write_epochs
from tests.faults.s3_proxy import FaultyS3Proxy, faulty_s3
from tests.store.conftest import s3_endpoint

__all__ = ["s3_endpoint"]

#: A retry policy quick enough for tests: small waits, a read timeout the proxy's "slow"
#: answers pass (they are held 1.2 s).
FAST_RETRY_ENV = {
    "EPOCHAL_STORE_RETRY_ATTEMPTS": "100",
    "EPOCHAL_STORE_RETRY_BUDGET_S": "20",
    "EPOCHAL_STORE_RETRY_BASE_S": "0.01",
    "EPOCHAL_STORE_RETRY_CAP_S": "0.2",
    "EPOCHAL_STORE_CONNECT_TIMEOUT_S": "1",
    "EPOCHAL_STORE_READ_TIMEOUT_S": "0.5",
}
SLOW_ANSWER_S = 1.2


@pytest.fixture
def fast_retries(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    for name, value in FAST_RETRY_ENV.items():
        monkeypatch.setenv(name, value)
    return FAST_RETRY_ENV


@pytest.fixture
def s3_proxy(s3_endpoint: str) -> Iterator[FaultyS3Proxy]:
    """A fault proxy in front of moto, injecting nothing until the test says so."""
    with faulty_s3(s3_endpoint, slow_s=SLOW_ANSWER_S, seed=29) as proxy:
        yield proxy


@pytest.fixture
def proxied_store(s3_endpoint: str, s3_proxy: FaultyS3Proxy, fast_retries: object) -> str:
    """A store URL on a fresh bucket, reached through the fault proxy."""
    bucket = f"faults-{uuid.uuid4().hex[:16]}"
    boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1").create_bucket(
        Bucket=bucket
    )
    return f"s3://{bucket}/root?endpoint_url={s3_proxy.endpoint}"


EPOCHS, RECORDS = 3, 700  # the fault suite's job: 3 epochs of 700 records over 120 keys


@pytest.fixture(scope="session")
def fault_data(tmp_path_factory: pytest.TempPathFactory) -> str:
    directory = tmp_path_factory.mktemp("store-faults") / "in"
    write_epochs(str(directory), files=EPOCHS, keys=120, records=RECORDS, seed=29)
    return str(directory)


@pytest.fixture(scope="session")
def reference(spark: Any, fault_data: str, tmp_path_factory: pytest.TempPathFactory) -> Repository:
    """The job's fault-free run on a local store (namespace "crash")."""
    repo = Repository.open(f"file://{tmp_path_factory.mktemp('reference')}/store", "crash")
    os.environ["EPOCHAL_TEST_DATA"] = fault_data
    EpochRunner(spark, crash_job(), repo=repo, parallelism=2).run()
    return repo
