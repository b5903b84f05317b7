"""The Spark peers the engine is measured against, on a session with the JVM's defaults.

- `run_spark_builtin`: Structured Streaming ``groupBy("key").agg(count, sum, max)`` in update
  mode with the default (HDFS-backed) state store; ``maxFilesPerTrigger=1`` so every epoch file
  is one micro-batch, ``trigger(availableNow=True)``, a fresh checkpoint location, and a
  ``foreachBatch`` sink writing each batch's output rows to Parquet.
- `run_stateless`: ``spark.read.parquet(file).groupBy("key").agg(...)`` per epoch file, written
  to Parquet. No state: its outputs are per-epoch partials, so its checksums are compared with
  `checksum.reference_per_epoch`, not with the stateful variants.
- `run_spark_tws`: ``transformWithStateInPandas`` with a ``ValueState`` of (count, sum, max) per
  key on the RocksDB state store, update mode, the same sink.
- `run_spark_tws_row`: the Row-based ``transformWithState`` (one Python ``Row`` at a time
  instead of pandas frames), otherwise the same as `run_spark_tws`.

Same work in every timed window: each variant, the engine too, writes its output rows durably
inside the window (the engine commits them to its store) and nothing else; the checksums of
every variant are computed after the window ends, from what was written.

Rate = records ÷ wall time from ``start()`` until ``awaitTermination()`` returns (stateless:
the sum of the per-file jobs). Per-epoch seconds come from each micro-batch's
``durationMs.triggerExecution``.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import pyarrow as pa

from bench.checksum import Checksum, checksum_arrow
from bench.datagen import SPARK_SCHEMA_DDL, EpochSet
from bench.timing import VariantResult

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

try:  # the StatefulProcessor base class; pyspark is always installed where the bench runs
    from pyspark.sql.streaming.stateful_processor import (
        StatefulProcessor,
        StatefulProcessorHandle,
    )
except ImportError:  # pragma: no cover
    StatefulProcessor = object  # type: ignore[assignment,misc]
    StatefulProcessorHandle = Any  # type: ignore[assignment,misc]

PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
OUTPUT_DDL = "key STRING, count BIGINT, sum_value BIGINT, max_value BIGINT"
STATE_DDL = "count BIGINT, sum_value BIGINT, max_value BIGINT"
#: the rows bench.windows' variants emit (key, window start ms, count, sum)
WINDOW_ROWS = pa.schema(
    [("key", pa.string()), ("window_start", pa.int64()), ("count", pa.int64()),
     ("sum_value", pa.int64())]
)  # fmt: skip

# Spark 4.3 logs a WARN line for every ValueState.get() on a key that has no value yet (once per
# new key: hundreds of thousands of lines on a first batch). These are the loggers to silence.
NOISY_LOGGERS = (
    "org.apache.spark.sql.execution.streaming.state",
    "org.apache.spark.sql.execution.streaming.operators.stateful.transformwithstate",
    "org.apache.spark.sql.execution.streaming.TransformWithStateInPandasStateServer",
    "org.apache.spark.sql.execution.python.streaming",
)


def _aggregate(df: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    return df.groupBy("key").agg(
        F.count(F.lit(1)).alias("count"),
        F.sum("value").alias("sum_value"),
        F.max("value").alias("max_value"),
    )


def _silence_loggers(spark: SparkSession) -> None:
    """Set the state-store / TWS JVM loggers to ERROR (log4j2 via Spark's Configurator)."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    configurator = jvm.org.apache.logging.log4j.core.config.Configurator
    level = jvm.org.apache.logging.log4j.Level.ERROR
    for name in NOISY_LOGGERS:
        configurator.setLevel(name, level)


def written_checksums(out: Path) -> list[Checksum]:
    """Checksums of the batches a peer wrote under `out` (``<n>/`` folders, in order), computed
    after its timed window."""
    import pyarrow.parquet as pq

    batches = sorted((int(p.name), p) for p in out.iterdir() if p.name.isdigit())
    return [checksum_arrow(pq.read_table(str(path))) for _, path in batches]


def _run_query(
    stream: DataFrame, mode: str, checkpoint: Path, out: Path, name: str
) -> tuple[float, Any]:
    """Start `stream` afresh (`checkpoint`, `out` emptied) with ``trigger(availableNow=True)``
    and a ``foreachBatch`` sink writing batch n to ``out/n`` as Parquet; wait for its end:
    (wall seconds from start(), the query). A failed query raises."""
    for path in (checkpoint, out):
        shutil.rmtree(path, ignore_errors=True)

    def sink(batch: DataFrame, batch_id: int) -> None:
        batch.write.mode("overwrite").parquet(str(out / str(batch_id)))

    t0 = time.perf_counter()
    query = (
        stream.writeStream.outputMode(mode)
        .foreachBatch(sink)
        .trigger(availableNow=True)
        .option("checkpointLocation", str(checkpoint))
        .queryName(f"bench_{name}")
        .start()
    )
    query.awaitTermination()
    seconds = time.perf_counter() - t0
    if query.exception() is not None:
        raise RuntimeError(f"{name} failed: {query.exception()}")
    return seconds, query


def _stream(
    spark: SparkSession,
    epochs: EpochSet,
    name: str,
    build: Any,
    checkpoint: Path,
) -> VariantResult:
    """Run one availableNow streaming query over `epochs`, one file per micro-batch."""
    out = checkpoint.with_name(checkpoint.name + "-out")
    source = (
        spark.readStream.schema(SPARK_SCHEMA_DDL)
        .option("maxFilesPerTrigger", 1)
        .parquet(str(epochs.directory))
    )
    seconds, query = _run_query(build(source), "update", checkpoint, out, name)
    progress = sorted(
        (p for p in query.recentProgress if p.get("numInputRows", 0) > 0),
        key=lambda p: p["batchId"],
    )
    epoch_seconds = [p["durationMs"]["triggerExecution"] / 1000 for p in progress]
    rows_in = sum(int(p["numInputRows"]) for p in progress)
    if rows_in != epochs.total_records:
        raise RuntimeError(f"{name} read {rows_in} records, expected {epochs.total_records}")
    checksums = written_checksums(out)  # after the timed window
    shutil.rmtree(checkpoint, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    return VariantResult(name, rows_in, seconds, epoch_seconds, checksums)


def run_spark_builtin(spark: SparkSession, epochs: EpochSet, checkpoint: Path) -> VariantResult:
    """Streaming groupBy().agg() in update mode on the default (HDFS-backed) state store."""
    spark.conf.unset(PROVIDER_CONF)
    return _stream(spark, epochs, "spark_builtin", _aggregate, checkpoint)


def run_stateless(spark: SparkSession, epochs: EpochSet, out: Path) -> VariantResult:
    """spark.read.parquet(file).groupBy().agg() per epoch file, written to Parquet: no state."""
    shutil.rmtree(out, ignore_errors=True)
    epoch_seconds = []
    for n, path in enumerate(epochs.files()):
        t0 = time.perf_counter()
        _aggregate(spark.read.parquet(str(path))).write.parquet(str(out / str(n)))
        epoch_seconds.append(time.perf_counter() - t0)
    checksums = written_checksums(out)  # after the timed window
    shutil.rmtree(out, ignore_errors=True)
    return VariantResult(
        "stateless", epochs.total_records, sum(epoch_seconds), epoch_seconds, checksums
    )


class RunningAggregate(StatefulProcessor):  # type: ignore[misc,valid-type]
    """count / sum / max of `value` per key in one ValueState; one output row per key per batch."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.state = handle.getValueState("agg", STATE_DDL)

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
    ) -> Iterator[pd.DataFrame]:
        previous = self.state.get()
        if previous is None:
            count, total, maximum = 0, 0, None
        else:
            count, total, maximum = int(previous[0]), int(previous[1]), int(previous[2])
        for pdf in rows:
            values = pdf["value"]
            count += len(values)
            total += int(values.sum())
            batch_max = int(values.max())
            maximum = batch_max if maximum is None else max(maximum, batch_max)
        self.state.update((count, total, maximum))
        yield pd.DataFrame(
            {"key": [key[0]], "count": [count], "sum_value": [total], "max_value": [maximum]}
        )

    def close(self) -> None:
        pass


class RunningAggregateRows(StatefulProcessor):  # type: ignore[misc,valid-type]
    """`RunningAggregate` for the Row-based ``transformWithState``: rows one at a time."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.state = handle.getValueState("agg", STATE_DDL)

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any = None) -> Iterator:
        from pyspark.sql import Row

        previous = self.state.get()
        if previous is None:
            count, total, maximum = 0, 0, None
        else:
            count, total, maximum = int(previous[0]), int(previous[1]), int(previous[2])
        for row in rows:
            value = row.value
            count += 1
            total += value
            if maximum is None or value > maximum:
                maximum = value
        self.state.update((count, total, maximum))
        yield Row(key=key[0], count=count, sum_value=total, max_value=maximum)

    def close(self) -> None:
        pass


def _tws_row(df: DataFrame) -> DataFrame:
    return df.groupBy("key").transformWithState(
        statefulProcessor=RunningAggregateRows(),
        outputStructType=OUTPUT_DDL,
        outputMode="Update",
        timeMode="None",
    )


def _tws(df: DataFrame) -> DataFrame:
    return df.groupBy("key").transformWithStateInPandas(
        statefulProcessor=RunningAggregate(),
        outputStructType=OUTPUT_DDL,
        outputMode="Update",
        timeMode="None",
    )


def run_spark_tws(spark: SparkSession, epochs: EpochSet, checkpoint: Path) -> VariantResult:
    """transformWithStateInPandas on the RocksDB state store (it requires that provider)."""
    _silence_loggers(spark)
    spark.conf.set(PROVIDER_CONF, ROCKSDB_PROVIDER)
    try:
        return _stream(spark, epochs, "spark_tws", _tws, checkpoint)
    finally:
        spark.conf.unset(PROVIDER_CONF)


def run_spark_tws_row(spark: SparkSession, epochs: EpochSet, checkpoint: Path) -> VariantResult:
    """The Row-based transformWithState on the RocksDB state store."""
    _silence_loggers(spark)
    spark.conf.set(PROVIDER_CONF, ROCKSDB_PROVIDER)
    try:
        return _stream(spark, epochs, "spark_tws_row", _tws_row, checkpoint)
    finally:
        spark.conf.unset(PROVIDER_CONF)


def watermarked_source(spark: SparkSession, directory: Path, delay_ms: int) -> DataFrame:
    """The event-time input of bench.windows: one Parquet file per micro-batch, ``t`` the
    timestamp of ``ts`` (ms) with a watermark `delay_ms` behind."""
    from pyspark.sql import functions as F

    return (
        spark.readStream.schema("key STRING, value BIGINT, ts BIGINT")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(directory))
        .withColumn("t", F.timestamp_millis("ts"))
        .withWatermark("t", f"{delay_ms // 1000} seconds")
    )


def run_append_stream(
    stream: DataFrame, work: Path, name: str, schema: pa.Schema
) -> tuple[float, pa.Table, dict[str, Any]]:
    """Run an append-mode query ``trigger(availableNow=True)`` with a ``foreachBatch`` sink
    writing each batch to Parquet under `work`: (wall seconds from start() to its end, the rows
    written as a pyarrow table of `schema`, the batches' figures)."""
    import pyarrow.parquet as pq

    checkpoint, out = work / f"{name}-checkpoint", work / f"{name}-out"
    seconds, query = _run_query(stream, "append", checkpoint, out, name)
    progress = sorted(query.recentProgress, key=lambda p: p["batchId"])
    detail = {
        "batches": len(progress),
        "batch_s": [round(p["durationMs"]["triggerExecution"] / 1000, 3) for p in progress],
        "rows_in": sum(int(p["numInputRows"]) for p in progress),
    }
    batches = [p for p in out.iterdir() if p.name.isdigit()] if out.exists() else []
    tables = [pq.read_table(str(p)).select(schema.names).cast(schema) for p in batches]
    table = pa.concat_tables(tables) if tables else schema.empty_table()
    shutil.rmtree(checkpoint, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    return seconds, table, detail
