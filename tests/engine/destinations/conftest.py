"""Fixtures of the destination tests: one destination of each kind, with unique names on the
shared services (an Iceberg table in a catalog on PostgreSQL, a Redis stream, a RabbitMQ
stream), removed afterwards."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from runners.engine.destinations import build
from runners.engine.rabbitmq_stream import create_stream, delete_stream
from tests.conftest import _port_open, require_service


@pytest.fixture(scope="session")
def catalog_uri() -> str:
    """The Iceberg SQL catalog's URL: the PostgreSQL database of $DATABASE_URL."""
    url = os.environ.get("DATABASE_URL", "")
    parts = urlsplit(url)
    require_service(
        "PostgreSQL",
        parts.scheme.startswith("postgres")
        and _port_open(parts.hostname or "", parts.port or 5432),
        f"set DATABASE_URL=postgres://… and run `bin/services up` ({url!r})",
    )
    return "postgresql+psycopg://" + url.split("://", 1)[1]


def specs(tmp: Path, catalog_uri: str, redis_url: str, rabbitmq_url: str,
          **overrides: dict[str, Any]) -> list[dict[str, Any]]:  # fmt: skip
    """One sink spec per kind with unique names (`overrides`: config fields per kind)."""
    tag = uuid.uuid4().hex[:10]
    configs = {
        "iceberg": {"catalog_uri": catalog_uri, "warehouse": str(tmp / "warehouse"),
                    "table": f"t{tag}.totals", "catalog_name": f"test-{tag}"},
        "redis_streams": {"url": redis_url, "stream": f"epochal-test-out-{tag}"},
        "rabbitmq_streams": {"url": rabbitmq_url, "stream": f"epochal-test-out-{tag}"},
    }  # fmt: skip
    return [{"name": kind.split("_")[0], "kind": kind, "config": {**c, **overrides.get(kind, {})}}
            for kind, c in configs.items()]  # fmt: skip


@pytest.fixture
def destinations(
    tmp_path: Path, catalog_uri: str, redis_url: str, rabbitmq_stream_url: str
) -> Iterator[list[dict[str, Any]]]:
    """Specs of an Iceberg table, a Redis stream and a RabbitMQ stream (the stream created)."""
    made = specs(tmp_path, catalog_uri, redis_url, rabbitmq_stream_url,
                 redis_streams={"batch_size": 40}, rabbitmq_streams={"batch_size": 40})  # fmt: skip
    rabbit = made[2]["config"]
    create_stream(rabbit["url"], rabbit["stream"])
    yield made
    cleanup(made)


def cleanup(made: list[dict[str, Any]]) -> None:
    sinks = {s["kind"]: build(s["name"], s["kind"], s["config"]) for s in made}
    iceberg, redis_sink = sinks["iceberg"], sinks["redis_streams"]
    try:
        if iceberg.load() is not None:
            iceberg.catalog().purge_table(iceberg.table)
    finally:
        iceberg.close()
    redis_sink.redis().delete(redis_sink.stream, redis_sink.marker_key)
    redis_sink.close()
    rabbit = sinks["rabbitmq_streams"]
    delete_stream(rabbit.url, rabbit.stream)
