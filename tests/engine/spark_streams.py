"""Driving a Spark Structured Streaming query over files, one micro-batch at a time: the
peer the event-time tests compare the engine with."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd


def micro_batches(
    spark: Any, stream: Any, checkpoint: Path, batches: Sequence[Mapping[Path, pd.DataFrame]]
) -> list[dict[str, Any]]:
    """Run `stream` (a streaming DataFrame) in append mode with 2 shuffle partitions: before
    micro-batch i the frames of ``batches[i]`` appear atomically as file ``part-<i>`` in their
    directories; each batch is followed by the no-data batch a moved watermark asks for.
    Returns the rows the query emitted."""
    rows: list[dict[str, Any]] = []
    previous = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", "2")
    try:
        query = (
            stream.writeStream.outputMode("append")
            .foreachBatch(lambda df, _: rows.extend(r.asDict() for r in df.collect()))
            .option("checkpointLocation", str(checkpoint))
            .start()
        )
        try:
            for i, files in enumerate(batches):
                for directory, frame in files.items():
                    frame.to_parquet(directory / f".part-{i}", index=False)
                    os.rename(directory / f".part-{i}", directory / f"part-{i:05d}.parquet")
                query.processAllAvailable()
                deadline = time.monotonic() + 5  # the no-data batch of the moved watermark
                while time.monotonic() < deadline:
                    progress = query.recentProgress
                    if progress and progress[-1]["numInputRows"] == 0:
                        break
                    time.sleep(0.05)
        finally:
            query.stop()
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", previous)
    return rows
