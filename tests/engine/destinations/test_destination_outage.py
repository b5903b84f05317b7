"""The three destinations unreachable for a while, against real servers: a Redis server of the
test's own stopped and started again, the RabbitMQ broker and the Iceberg catalog's PostgreSQL
behind TCP proxies of the test's own that it cuts (the shared servers are never stopped).

While they are down the epoch's snapshot is still committed (its sinks stage what they can);
the sinks' commits fail, and so does a retry while they are down, without writing anything.
Once they are back, a restart finishes the epoch's commit in each destination and the job goes
on: every destination holds every epoch once.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from runners.engine import EngineError, EpochRunner
from runners.engine.destinations import build
from snapshots_store import Repository
from tests.engine.destinations.conftest import cleanup, specs
from tests.engine.destinations.support import PrivateRedis, TcpProxy, contents
from tests.engine.jobs import aggregate_job
from tests.engine.test_kafka_sink import output_by_epoch

pytestmark = [pytest.mark.spark, pytest.mark.services]


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path)
    server.start()
    yield server
    server.stop()


def _proxy(url: str, default_port: int) -> TcpProxy:
    parts = urlsplit(url.replace("postgresql+psycopg", "postgresql"))
    return TcpProxy((parts.hostname or "127.0.0.1", parts.port or default_port))


def test_destinations_down_then_back_finish_the_epoch_and_go_on(
    spark: Any, tmp_path: Path, epochs_dir: str, catalog_uri: str,
    rabbitmq_stream_url: str, private_redis: PrivateRedis,
) -> None:  # fmt: skip
    from runners.engine.rabbitmq_stream import create_stream

    catalog_proxy, broker_proxy = _proxy(catalog_uri, 5432), _proxy(rabbitmq_stream_url, 5552)
    via = {
        "iceberg": catalog_uri.replace(
            f":{urlsplit(catalog_uri).port or 5432}/", f":{catalog_proxy.port}/"
        ),
        "rabbitmq": rabbitmq_stream_url.replace(
            f":{urlsplit(rabbitmq_stream_url).port or 5552}/", f":{broker_proxy.port}/"
        ),
    }
    direct = specs(tmp_path, catalog_uri, private_redis.url, rabbitmq_stream_url)
    through: list[dict[str, Any]] = [
        {"catalog_uri": via["iceberg"]}, {}, {"url": via["rabbitmq"], "load_balancer": True},
    ]  # fmt: skip
    made = [{**s, "config": {**s["config"], **extra}}
            for s, extra in zip(direct, through, strict=True)]  # fmt: skip
    create_stream(rabbitmq_stream_url, direct[2]["config"]["stream"])
    repo = Repository.open(f"file://{tmp_path}/store", "outage")

    def runner(first: str = "iceberg") -> EpochRunner:
        ordered = sorted(made, key=lambda s: s["name"] != first)
        sinks = [build(s["name"], s["kind"], s["config"]) for s in ordered]
        return EpochRunner(spark, aggregate_job(epochs_dir, sinks=sinks), repo=repo)

    try:
        first = runner()
        assert first.run_epoch() is not None
        catalog_proxy.cut()
        broker_proxy.cut()
        private_redis.stop()
        with pytest.raises(EngineError, match=r"could not commit epoch 2 .* is committed"):
            first.run_epoch()
        assert repo.read_manifest(repo.resolve("main")).epoch == 2  # the store went on
        for name in ("iceberg", "redis", "rabbitmq"):  # a retry while they are down, each first
            with pytest.raises(EngineError, match=f"sink '{name}' could not finish epoch 2"):
                runner(name).run_epoch()
        assert repo.read_manifest(repo.resolve("main")).epoch == 2
        catalog_proxy.restore()
        broker_proxy.restore()
        private_redis.start()
        results = runner().run()  # finishes epoch 2 in each destination, then goes on
        assert [r.epoch for r in results] == [3, 4, 5, 6]
        expected = output_by_epoch(repo)
        for spec in direct:
            sink = build(spec["name"], spec["kind"], spec["config"])
            assert contents(sink) == expected, spec["kind"]
            sink.close()
    finally:
        catalog_proxy.close()
        broker_proxy.close()
        cleanup(direct)
