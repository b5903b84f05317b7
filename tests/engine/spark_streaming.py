"""Spark Structured Streaming over the same input as the engine's epochs, the peer the
event-time tests compare with: one Parquet file per micro-batch, each followed by the no-data
batch a moved watermark asks for (so every data batch sees the watermark the previous input
moved, as an epoch applies its parent's)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd


def with_watermark(stream: Any, delay_ms: int) -> Any:
    """`stream` with ``t`` (the timestamp of the ``ts`` milliseconds) and its watermark."""
    from pyspark.sql import functions as F

    return stream.withColumn("t", F.timestamp_millis("ts")).withWatermark(
        "t", f"{delay_ms} milliseconds"
    )


def micro_batches(
    spark: Any,
    frames: list[pd.DataFrame],
    root: Path,
    query: Callable[[Any], Any],
    *,
    schema: str = "key string, value long, ts long",
    output_mode: str = "append",
) -> pd.DataFrame:
    """Every row `query(stream)` emitted, in append mode, over `frames` as micro-batches."""
    inp = root / "spark-in"
    inp.mkdir()
    stream = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(inp))
    batches = [{inp: frame} for frame in frames]
    rows = run_batches(spark, query(stream), root / "checkpoint", batches, output_mode)
    return pd.DataFrame(rows)


def run_batches(
    spark: Any,
    stream: Any,
    checkpoint: Path,
    batches: Sequence[Mapping[Path, pd.DataFrame]],
    output_mode: str = "append",
) -> list[dict[str, Any]]:
    """Run `stream` (a streaming DataFrame over one or more directories) with 2 shuffle
    partitions: before micro-batch i the frames of ``batches[i]`` appear atomically as file
    ``part-<i>`` in their directories; each batch is followed by the no-data batch a moved
    watermark asks for. Returns the rows the query emitted."""
    previous = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", "2")
    rows: list[dict[str, Any]] = []
    try:
        handle = (
            stream.writeStream.outputMode(output_mode)
            .foreachBatch(lambda df, _: rows.extend(r.asDict() for r in df.collect()))
            .option("checkpointLocation", str(checkpoint))
            .start()
        )
        try:
            for i, files in enumerate(batches):
                for directory, frame in files.items():
                    frame.to_parquet(directory / f".part-{i}", index=False)
                    os.rename(directory / f".part-{i}", directory / f"part-{i:05d}.parquet")
                handle.processAllAvailable()
                deadline = time.monotonic() + 5  # the no-data batch of the moved watermark
                while time.monotonic() < deadline:
                    progress = handle.recentProgress
                    if progress and progress[-1]["numInputRows"] == 0:
                        break
                    time.sleep(0.05)
        finally:
            handle.stop()
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", previous)
    return rows


def window_aggregates(grouped: Any, window: str) -> Any:
    """count, sum and max of ``value`` per key and window of a stream grouped by a window
    column named `window` (``window`` or ``session_window``) and ``key``, as the engine's
    windowed rows: key, window_start, window_end (milliseconds), count, sum_value, max_value."""
    from pyspark.sql import functions as F

    return grouped.agg(
        F.count("*").alias("count"),
        F.sum("value").alias("sum_value"),
        F.max("value").alias("max_value"),
    ).select(
        "key",
        F.unix_millis(f"{window}.start").alias("window_start"),
        F.unix_millis(f"{window}.end").alias("window_end"),
        "count",
        "sum_value",
        "max_value",
    )
