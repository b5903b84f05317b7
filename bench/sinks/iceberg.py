"""`python -m bench.sinks`: the Iceberg sink, measured by bench/sinks/paired_runs.py. Its SQL
catalog is the PostgreSQL database of $DATABASE_URL when set (``postgres://…``), else a SQLite
file in the work directory (the embedded default); data files under the work directory.
Target: ratio_with_sink >= 0.8."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.sinks.paired_runs import measure_sink

TARGET = 0.8


def catalog_uri(workdir: Path) -> str:
    url = os.environ.get("DATABASE_URL", "")
    if url.startswith(("postgres://", "postgresql://")):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return f"sqlite:///{workdir / 'iceberg-catalog.db'}"


def measure(*, records_per_epoch: int, epochs: int, workdir: Path) -> dict[str, Any]:
    def destination(run: str) -> tuple[str, dict[str, Any], Callable[[], None]]:
        tag = uuid.uuid4().hex[:8]
        config = {"catalog_uri": catalog_uri(workdir), "warehouse": str(workdir / "warehouse"),
                  "table": f"bench_{run}_{tag}.totals", "catalog_name": f"bench-{tag}"}  # fmt: skip

        def cleanup() -> None:
            from runners.engine.destinations import build

            sink = build("cleanup", "iceberg", config)
            if sink.load() is not None:
                sink.catalog().purge_table(sink.table)
            sink.close()

        return "iceberg", config, cleanup

    result = measure_sink(destination, records_per_epoch=records_per_epoch, epochs=epochs,
                          workdir=workdir, target=TARGET)  # fmt: skip
    result["catalog"] = catalog_uri(workdir).split(":", 1)[0]
    return result
