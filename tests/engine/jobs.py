"""Jobs and data used by the engine tests (importable by the job entry point subprocess)."""

from __future__ import annotations

import dataclasses
import os
import pickle
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from runners.engine import EpochContext, Job, KeyedState, sources
from runners.engine import aggregations as agg
from runners.engine.sources import Generator, Split, SplitData, write_parquet_file

DATA_ENV = "EPOCHAL_TEST_DATA"
SLOW_ENV = "EPOCHAL_TEST_SLOW_S"
AGGREGATES = [agg.count(), agg.sum("value"), agg.max("value"), agg.min("value"), agg.last("value")]


def write_epochs(directory: str, *, files: int, keys: int, records: int, seed: int = 3) -> None:
    """`files` Parquet files of `records` uniform records over `keys` keys (one per epoch)."""
    gen = Generator(keys=keys, records_per_epoch=records, seed=seed)
    for i in range(files):
        write_parquet_file(directory, f"part-{i:05d}", gen.block(i))


def aggregate_job(directory: str, **overrides: Any) -> Job:
    options: dict[str, Any] = {
        "name": "clicks",
        "source": sources.ParquetDirectory(directory, max_files_per_epoch=1, rows_per_split=700),
        "key": "key",
        "aggregate": AGGREGATES,
        "time_mode": "logical",
    }
    options.update(overrides)
    return Job(**options)


STREAM_ENV = "EPOCHAL_TEST_STREAM"  # "redis:<url>|<stream>,<stream>", "rabbitmq:<url>|…", "kafka:…"


def stream_source(spec: str, **options: Any) -> Any:
    """A Redis Streams, RabbitMQ Streams or Kafka source of `{key, value}` JSON records from a
    spec ``<kind>:<url>|<stream>,<stream>`` (Kafka: bootstrap servers and topics)."""
    from runners.engine.kafka_source import KafkaSource
    from runners.engine.rabbitmq_stream import RabbitMQStreamSource
    from runners.engine.redis_stream import RedisStreamSource

    kind, _, rest = spec.partition(":")
    url, _, names = rest.rpartition("|")
    cls = {"redis": RedisStreamSource, "rabbitmq": RabbitMQStreamSource, "kafka": KafkaSource}[kind]
    schema = {"key": "string", "value": "int64"}
    return cls(url, names.split(","), schema, required=("key",), **options)


def stream_job() -> Job:
    """The crash-matrix job over a log source named by $EPOCHAL_TEST_STREAM (bounded epochs of
    at most 400 records in splits of 100)."""
    source = stream_source(os.environ[STREAM_ENV], max_records_per_epoch=400, records_per_split=100)
    return aggregate_job("", name="stream-crash", source=source)


SINK_ENV = "EPOCHAL_TEST_SINK"  # "<bootstrap servers>|<topic>"


def stream_sink_job() -> Job:
    """`stream_job` whose output also goes to a Kafka topic through the exactly-once Kafka
    sink named by $EPOCHAL_TEST_SINK (`<bootstrap servers>|<topic>`)."""
    from runners.engine.kafka_sink import KafkaSink

    servers, _, topic = os.environ[SINK_ENV].partition("|")
    sink = KafkaSink(servers, topic, transaction_timeout_ms=10_000)
    return dataclasses.replace(stream_job(), sinks=[sink])


def crash_job() -> Job:
    """The crash-matrix job: its input directory comes from the environment, and each split
    read takes $EPOCHAL_TEST_SLOW_S longer (0 when unset) so that a kill can land mid-epoch."""
    directory = os.environ[DATA_ENV]
    source = SlowParquet(
        directory, rows_per_split=700, delay_s=float(os.environ.get(SLOW_ENV, "0"))
    )
    return aggregate_job(directory, source=source)


@dataclass
class SlowParquet(sources.ParquetDirectory):
    """A Parquet directory whose reads take `delay_s` longer (to signal a job mid-epoch)."""

    delay_s: float = 0.0

    def read(self, split: Split) -> SplitData:
        time.sleep(self.delay_s)
        return super().read(split)


def slow_job() -> Job:
    """The crash job reading through `SlowParquet` (delay from $EPOCHAL_TEST_SLOW_S)."""
    directory = os.environ[DATA_ENV]
    source = SlowParquet(
        directory, rows_per_split=700, delay_s=float(os.environ.get(SLOW_ENV, "0"))
    )
    return aggregate_job(directory, source=source)


def running_total(
    key: Any, records: list[dict[str, Any]], state: KeyedState, ctx: EpochContext
) -> Iterable[dict[str, Any]]:
    """The aggregate job's count/sum/max written as a per-key Python function."""
    count = state.value("count")
    total = state.value("sum")
    high = state.value("max")
    values = [r["value"] for r in records]
    count.set(count.get(0) + len(values))
    total.set(total.get(0) + sum(values))
    high.set(max([high.get(values[0]), *values]))
    yield {"key": key, "count": count.get(), "sum_value": total.get(), "max_value": high.get()}


def running_total_v2(
    key: Any, records: list[dict[str, Any]], state: KeyedState, ctx: EpochContext
) -> Iterable[dict[str, Any]]:
    """`running_total` after a state migration renamed its state "sum" to "total"."""
    count = state.value("count")
    total = state.value("total")
    high = state.value("max")
    values = [r["value"] for r in records]
    count.set(count.get(0) + len(values))
    total.set(total.get(0) + sum(values))
    high.set(max([high.get(values[0]), *values]))
    yield {"key": key, "count": count.get(), "sum_value": total.get(), "max_value": high.get()}


def rename_sum_to_total(table: pa.Table) -> pa.Table:
    """State migration for `running_total` -> `running_total_v2` (pickled per-key states)."""
    payloads = []
    for raw in table.column("_state").to_pylist():
        entries = pickle.loads(raw)
        entries["total"] = entries.pop("sum")
        payloads.append(pickle.dumps(entries, protocol=5))
    index = table.schema.get_field_index("_state")
    return table.set_column(index, "_state", pa.array(payloads, pa.binary()))


def add_note(table: pa.Table) -> pa.Table:
    """State migration adding a constant column."""
    return table.append_column("note", pa.array(["migrated"] * table.num_rows, pa.string()))


def reference_output(directory: str) -> pd.DataFrame:
    """Running count/sum/max/min/last per key after each file, for keys the file touched."""
    frames = []
    seen: pd.DataFrame | None = None
    files = sorted(f for f in os.listdir(directory) if f.endswith(".parquet"))
    for epoch, name in enumerate(files, start=1):
        df = pq.read_table(os.path.join(directory, name)).to_pandas()
        seen = df if seen is None else pd.concat([seen, df], ignore_index=True)
        grouped = seen.groupby("key")["value"]
        ref = pd.DataFrame(
            {
                "count": grouped.count(),
                "sum_value": grouped.sum(),
                "max_value": grouped.max(),
                "min_value": grouped.min(),
                "last_value": grouped.last(),
            }
        ).reset_index()
        ref = ref[ref["key"].isin(set(df["key"]))].copy()
        ref["_epoch"] = epoch
        frames.append(ref)
    out = pd.concat(frames, ignore_index=True)
    return out.sort_values(["_epoch", "key"]).reset_index(drop=True)


def branch_totals_job(store: str) -> Job:
    """The hot-swap web's downstream: counts and sums of the `up` application's main branch
    output (re-pointed to the new job's branch by the swap)."""
    from runners.engine.branch_source import BranchOutputSource

    return Job(
        name="totals",
        source=BranchOutputSource(store, "up", "main", schema={"key": "string", "count": "int64"}),
        key="key",
        aggregate=[agg.count(), agg.sum("count")],
    )
