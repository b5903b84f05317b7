"""A real Spark standalone cluster for the whole session, and a moto S3 store beside it.

One master and two workers from the pyspark install, each worker its own process with 1 core,
its own work directory, its own `SPARK_LOCAL_DIRS` and its own state cache; the store is a
bucket on a moto S3 server spoken to over HTTP. Nothing a test checks can pass between
executors through a local disk: state moves through the object store or not at all.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from runners.local_cluster import LocalCluster, free_port
from tests.conftest import FAST_START_JVM_OPTIONS, SUBPROCESS_PYTHONPATH, require_service
from tests.store.conftest import S3_ENV, AtomicMotoServer

#: The cluster jobs' JVMs: the test suite's quick-start flags for driver and executors, and
#: the executors' Python and code path (the standalone launcher sets the same from its
#: settings: runners/standalone.py).
CLUSTER_CONF = {
    "spark.driver.extraJavaOptions": FAST_START_JVM_OPTIONS,
    "spark.executor.extraJavaOptions": FAST_START_JVM_OPTIONS,
    "spark.executor.cores": "1",
    "spark.executor.memory": "1g",
    "spark.executorEnv.PYTHONPATH": SUBPROCESS_PYTHONPATH,
    **{f"spark.executorEnv.{k}": v for k, v in S3_ENV.items()},
}
CLUSTER_SUBMIT_ARGS = shlex.join(
    [*(f"--conf={k}={v}" for k, v in CLUSTER_CONF.items()), "pyspark-shell"]
)


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    require_service("Java", shutil.which("java") is not None, "install OpenJDK 17")
    cluster = LocalCluster(tmp_path_factory.mktemp("cluster"), workers=2, cores=1)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def s3_store_endpoint() -> Iterator[str]:
    """A moto S3 server over HTTP with a bucket `cluster`; its endpoint URL."""
    os.environ.update(S3_ENV)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    port = free_port()
    server = AtomicMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(
        Bucket="cluster"
    )
    try:
        yield endpoint
    finally:
        server.stop()


@pytest.fixture
def s3_store(s3_store_endpoint: str, request: pytest.FixtureRequest) -> str:
    """A store of its own for each test, under the shared bucket."""
    return f"s3://cluster/{request.node.name}?endpoint_url={s3_store_endpoint}"


@pytest.fixture
def driver_cache(tmp_path: Path) -> dict[str, str]:
    """The driver's own state cache, apart from every worker's."""
    cache = tmp_path / "driver-cache"
    cache.mkdir()
    return {"EPOCHAL_STATE_CACHE_DIR": str(cache)}
