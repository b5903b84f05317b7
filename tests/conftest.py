"""Shared fixtures: one SparkSession per test run, and service checks.

Service-backed tests (PostgreSQL, Redis, RabbitMQ, Kafka) run when the service answers. In CI
(`EPOCHAL_REQUIRE_SERVICES=1`, set by `.ci/run`) a missing service fails the test instead of
skipping it, so CI can never pass by skipping.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

REQUIRE_SERVICES = os.environ.get("EPOCHAL_REQUIRE_SERVICES") == "1"
#: The test suite's JVM flags: no C2 compiler, serial GC. They start a JVM ~1 s sooner, which
#: short test jobs need and nothing else does (jobs and benchmarks run with the JVM defaults).
FAST_START_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
FAST_START_CONF = {"spark.driver.extraJavaOptions": FAST_START_JVM_OPTIONS}
#: The same flags for a job the tests start as a subprocess ($PYSPARK_SUBMIT_ARGS).
FAST_START_SUBMIT_ARGS = (
    f'--conf "spark.driver.extraJavaOptions={FAST_START_JVM_OPTIONS}" pyspark-shell'
)

# The test suite's own jobs and state migrations, registered the way any package registers
# them (entry points in installed metadata): tests/entry_points holds the metadata of a small
# distribution, epochal-test-plugins. On sys.path for this process and on PYTHONPATH for the
# servers, workers and engine runs the tests start; never part of an installed Epochal.
TEST_PLUGINS = str(Path(__file__).resolve().parent / "entry_points")
#: PYTHONPATH for a process a test starts from the repository root: the code and the plugins
SUBPROCESS_PYTHONPATH = os.pathsep.join((str(Path(__file__).resolve().parent.parent), TEST_PLUGINS))
if TEST_PLUGINS not in sys.path:
    sys.path.append(TEST_PLUGINS)
if TEST_PLUGINS not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (os.environ.get("PYTHONPATH", ""), TEST_PLUGINS) if p
    )


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _url_answers(url: str, default_port: int) -> bool:
    """True when the host and port of a service URL (e.g. ``redis://h:6380/0``) accept TCP."""
    parsed = urlsplit(url)
    return _port_open(parsed.hostname or "127.0.0.1", parsed.port or default_port)


def require_service(name: str, available: bool, how: str) -> None:
    """Skip (or, in CI, fail) when a service a test needs is not there."""
    if available:
        return
    message = f"{name} is not available: {how}"
    if REQUIRE_SERVICES:
        pytest.fail(f"{message} (EPOCHAL_REQUIRE_SERVICES=1 makes this mandatory)")
    pytest.skip(message)


@pytest.fixture(scope="session")
def redis_url() -> str:
    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    how = f"run `bin/services up redis` or set REDIS_URL ({url})"
    require_service("Redis", _url_answers(url, 6379), how)
    return url


@pytest.fixture(scope="session")
def rabbitmq_url() -> str:
    url = os.environ.get("RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672//")
    how = f"run `bin/services up rabbitmq` or set RABBITMQ_URL ({url})"
    require_service("RabbitMQ", _url_answers(url, 5672), how)
    return url


@pytest.fixture(scope="session")
def rabbitmq_stream_url() -> str:
    """The RabbitMQ stream protocol endpoint (the rabbitmq_stream plugin, port 5552)."""
    url = os.environ.get("RABBITMQ_STREAM_URL", "rabbitmq-stream://guest:guest@127.0.0.1:5552/%2F")
    require_service(
        "RabbitMQ Streams",
        _url_answers(url, 5552),
        f"run `bin/services up rabbitmq` or set RABBITMQ_STREAM_URL ({url})",
    )
    return url


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    """A Kafka broker's bootstrap servers (`bin/services up` starts one on 127.0.0.1:9092)."""
    servers = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    first = servers.split(",")[0]
    host, _, port = first.rpartition(":")
    require_service(
        "Kafka",
        port.isdigit() and _port_open(host.strip("[]") or "127.0.0.1", int(port)),
        f"run `bin/services up` or set KAFKA_BOOTSTRAP_SERVERS ({servers})",
    )
    return servers


@pytest.fixture
def postgresql_db(db: Any) -> None:
    """The Django test database, which must be PostgreSQL (set DATABASE_URL=postgres://…)."""
    from django.db import connection

    require_service(
        "PostgreSQL",
        connection.vendor == "postgresql",
        "this test needs PostgreSQL: run `bin/services up` (see the README)",
    )


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local SparkSession (`local[2]`) shared by every test that needs Spark."""
    require_service("Java", shutil.which("java") is not None, "install OpenJDK 17")
    from runners.engine.session import build_spark_session

    session = build_spark_session(master="local[2]", app_name="epochal-tests", conf=FAST_START_CONF)
    yield session
    session.stop()


@pytest.fixture(autouse=True)
def _runners_config_follows_monkeypatch(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The runners read their configuration once per process (runners/config.py). A test
    that changes a variable with ``monkeypatch.setenv`` / ``delenv`` stands for a process
    started with it: the configuration is read again after each change, and the next test
    gets the configuration this one started with."""
    from runners import config

    saved = config.current()
    for name in ("setenv", "delenv"):
        change = getattr(monkeypatch, name)

        def changed(*args: Any, _change: Any = change, **kwargs: Any) -> None:
            _change(*args, **kwargs)
            config.reload()

        setattr(monkeypatch, name, changed)
    yield
    config.use(saved)


@pytest.fixture(autouse=True)
def _no_change_listener_left() -> Iterator[None]:
    """A watch starts this process's change listener (controlplane/changes/feed.py); its
    connection would keep the test database from being dropped, so it ends with the test."""
    yield
    from django.conf import settings

    if settings.configured:
        from controlplane.changes import feed

        feed.stop_listening()


@pytest.fixture(autouse=True)
def _fresh_local_cache() -> Iterator[None]:
    """Login lockouts and throttles count in the cache; the in-process default (locmem) is
    emptied before each test so no test inherits another's failed sign-ins."""
    from django.conf import settings

    if not settings.configured or not settings.CACHES["default"]["BACKEND"].endswith("LocMemCache"):
        yield
        return
    from django.core.cache import cache

    cache.clear()
    yield


@pytest.fixture(autouse=True)
def _fresh_response_cache() -> Iterator[None]:
    """Rendered answers are kept per process by ETag (controlplane/api/response_cache.py);
    a test database rolled back or flushed between tests may hand out the same ids and
    revisions again, with other rows behind them, which a real database never does."""
    yield
    from django.conf import settings

    if settings.configured:
        from controlplane.api.response_cache import RESPONSES

        RESPONSES.clear()


def registered_store(url: str) -> Any:
    """The `Store` registered for `url` (created as an admin's registration would, without
    the EPOCHAL_STORE_ROOTS check, since test stores live under pytest's tmp_path)."""
    import hashlib

    from controlplane.applications.models import Store

    name = "store-" + hashlib.sha256(url.encode()).hexdigest()[:12]
    return Store.objects.get_or_create(url=url, defaults={"name": name})[0]
