"""Delta Lake's part of `python -m bench.sinks` (bench/sinks/common.py): the Delta sink into a
local table, read back with `deltalake` for the exactly-once check."""

from __future__ import annotations

import pathlib
from typing import Any

import pyarrow as pa

from bench.sinks.common import measure_sink
from runners.engine.destinations import build


def _read(sink: Any) -> pa.Table:
    from deltalake import DeltaTable

    return DeltaTable(sink.path).to_pyarrow_table()


def measure(*, records_per_epoch: int, epochs: int, workdir: pathlib.Path) -> dict[str, Any]:
    return measure_sink(
        kind="delta",
        make_sink=lambda d: build("lake", "delta", {"path": str(d / "lake")}),
        read_destination=_read,
        records_per_epoch=records_per_epoch,
        epochs=epochs,
        workdir=workdir / "delta",
        settings={"table": "local directory, no partitioning", "deltalake": _version()},
    )


def _version() -> str:
    import deltalake

    return str(deltalake.__version__)
