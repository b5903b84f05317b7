"""PostgreSQL's part of `python -m bench.sinks` (bench/sinks/common.py): the PostgreSQL sink in
append mode (COPY) into a scratch table of the database DATABASE_URL names (dropped after),
read back for the exactly-once check."""

from __future__ import annotations

import os
import pathlib
import uuid
from typing import Any

import pyarrow as pa

from bench.sinks.common import measure_sink
from runners.engine.destinations import build
from runners.engine.destinations.postgres import MARKS


def database_url() -> str:
    url = os.environ.get("DATABASE_URL", "postgres://root@127.0.0.1:5432/postgres")
    return "postgresql://" + url.partition("://")[2]


def _read(sink: Any) -> pa.Table:
    import psycopg

    with psycopg.connect(database_url()) as conn:
        cur = conn.execute(f"SELECT key, count, sum_value, max_value, _epoch FROM {sink.table}")
        rows = cur.fetchall()
    names = ["key", "count", "sum_value", "max_value", "_epoch"]
    return pa.table({n: [r[i] for r in rows] for i, n in enumerate(names)})


def measure(*, records_per_epoch: int, epochs: int, workdir: pathlib.Path) -> dict[str, Any]:
    import psycopg

    table = f"bench_sink_{uuid.uuid4().hex[:10]}"
    try:
        return measure_sink(
            kind="postgres",
            make_sink=lambda d: build("rows", "postgres", {"url": database_url(), "table": table}),
            read_destination=_read,
            records_per_epoch=records_per_epoch,
            epochs=epochs,
            workdir=workdir / "postgres",
            settings={"mode": "append (COPY, CSV)", "server": database_url().rpartition("@")[2]},
        )
    finally:
        with psycopg.connect(database_url(), autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {table}")
            conn.execute(f"DELETE FROM {MARKS} WHERE destination = %s", (table,))
