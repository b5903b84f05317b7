"""The Kafka parts of `python -m bench.sources`: the exactly-once Kafka sink's cost, and our
engine reading Kafka beside Spark Structured Streaming's own Kafka source.

- **sink**: the same job over the same topic with ``sinks=[KafkaSink(…)]``; its rate over the
  rate without the sink in the same process is ``ratio_with_sink``. The sink topic is then read
  with ``read_committed`` and every epoch's rows must have the checksum of the epoch's output
  in the store (``exactly_once_checked``).
- **spark_kafka**: after one warm-up run of each on a small topic, our engine over the topic
  again and right after it ``spark.readStream.format("kafka")`` on the same topic (one
  micro-batch per epoch: ``maxOffsetsPerTrigger`` = records per epoch,
  ``trigger(availableNow=True)``), JSON values parsed with ``from_json``, the built-in
  streaming ``groupBy("key").agg(count, sum, max)`` in update mode on the default state store,
  each batch's rows written to Parquet by ``foreachBatch`` — in the same SparkSession (JVM
  defaults, the same driver memory) as our engine. Per-batch checksums (bench/checksum.py)
  must equal our engine's per-epoch ones; ``ratio_vs_spark_kafka`` is our rate over Spark's.

Spark's connector (``org.apache.spark:spark-sql-kafka-0-10_2.13``) comes from Maven Central
into ``var/cache/spark-kafka/<version>/`` before the SparkSession starts (`fetch_connector`;
the jars Spark already ships are not added again). The version is pyspark's own when Maven
Central has it, else `FALLBACK_VERSION`, and the report says which.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "var" / "cache" / "spark-kafka"
ARTIFACT = "spark-sql-kafka-0-10_2.13"
#: the newest spark-sql-kafka-0-10 release on Maven Central when pyspark's is not there
FALLBACK_VERSION = "4.2.0"
VALUE_DDL = "key STRING, value BIGINT"


def _pom(version: str) -> str:
    return (
        '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
        "<groupId>epochal</groupId><artifactId>bench-spark-kafka</artifactId><version>1</version>"
        "<dependencies><dependency><groupId>org.apache.spark</groupId>"
        f"<artifactId>{ARTIFACT}</artifactId><version>{version}</version>"
        "</dependency></dependencies></project>\n"
    )


def _artifact(jar: str) -> str:
    """``kafka-clients`` of ``kafka-clients-3.9.2.jar``."""
    parts = jar.removesuffix(".jar").split("-")
    while parts and parts[-1][:1].isdigit():
        parts.pop()
    return "-".join(parts)


def fetch_connector(log: Any) -> tuple[str, list[str]]:
    """(connector version, jars to add to Spark): pyspark's version of the connector if Maven
    Central has it, else `FALLBACK_VERSION`; cached under var/cache/spark-kafka/."""
    import pyspark

    shipped = {_artifact(j) for j in os.listdir(Path(pyspark.__file__).parent / "jars")}
    for version in dict.fromkeys([pyspark.__version__, FALLBACK_VERSION]):
        home = CACHE / version
        lib = home / "lib"
        missing = home / "not-on-maven-central"
        if missing.exists() and time.time() - missing.stat().st_mtime < 86_400:
            continue  # asked within a day: do not wait for Maven again
        if not (lib.is_dir() and any(lib.glob(f"{ARTIFACT}-*.jar"))):
            home.mkdir(parents=True, exist_ok=True)
            (home / "pom.xml").write_text(_pom(version))
            log(f"fetching {ARTIFACT} {version} and its dependencies from Maven Central")
            done = subprocess.run(
                ["mvn", "-q", "-B", "-U", "dependency:copy-dependencies",
                 f"-DoutputDirectory={lib}", "-DincludeScope=runtime"],
                cwd=home, capture_output=True, text=True, timeout=600,
            )  # fmt: skip
            if done.returncode != 0:
                log(f"{ARTIFACT} {version} is not available: {done.stdout[-300:]}")
                shutil.rmtree(lib, ignore_errors=True)
                missing.write_text(done.stdout[-2000:])
                continue
        jars = sorted(str(j) for j in lib.glob("*.jar") if _artifact(j.name) not in shipped)
        return version, jars
    raise RuntimeError(f"{ARTIFACT} could not be fetched from Maven Central (mvn)")


def run_spark_kafka(
    spark: Any, servers: str, topic: str, per_epoch: int, epochs: int, work: Path
) -> dict[str, Any]:
    """Spark's Kafka source + built-in streaming aggregation over `topic`: rate, per-batch
    checksums, load average."""
    from pyspark.sql import functions as F

    from bench.spark_peers import written_checksums

    checkpoint, out = work / "spark-kafka-checkpoint", work / "spark-kafka-out"
    for path in (checkpoint, out):
        shutil.rmtree(path, ignore_errors=True)

    def sink(batch: Any, batch_id: int) -> None:
        batch.write.mode("overwrite").parquet(str(out / str(batch_id)))

    source = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", servers)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", per_epoch)
        .load()
    )
    rows = source.select(F.from_json(F.col("value").cast("string"), VALUE_DDL).alias("r"))
    aggregate = (
        rows.select("r.*")
        .groupBy("key")
        .agg(
            F.count(F.lit(1)).alias("count"),
            F.sum("value").alias("sum_value"),
            F.max("value").alias("max_value"),
        )
    )
    started = time.perf_counter()
    query = (
        aggregate.writeStream.outputMode("update")
        .foreachBatch(sink)
        .trigger(availableNow=True)
        .option("checkpointLocation", str(checkpoint))
        .queryName("bench_spark_kafka")
        .start()
    )
    query.awaitTermination()
    seconds = time.perf_counter() - started
    if query.exception() is not None:
        raise RuntimeError(f"Spark's Kafka query failed: {query.exception()}")
    read = sum(int(p.get("numInputRows", 0)) for p in query.recentProgress)
    if read != per_epoch * epochs:
        raise RuntimeError(
            f"Spark's Kafka query read {read} records, expected {per_epoch * epochs}"
        )
    checksums = written_checksums(out)  # after the timed window
    for path in (checkpoint, out):
        shutil.rmtree(path, ignore_errors=True)
    return {
        "records_per_s": round(read / seconds, 1),
        "seconds": round(seconds, 3),
        "batches": len(checksums),
        "checksums": checksums,
        "loadavg": list(os.getloadavg()),
    }


def engine_checksums(repo: Any, epochs: int) -> list[Any]:
    """Per-epoch checksums of the engine's output on `repo`'s main branch."""
    from bench.engine import engine_checksums as split_checksums
    from runners.engine import read_output

    return list(split_checksums(read_output(repo, "main"), epochs))


def topic_checksums(servers: str, topic: str) -> dict[int, Any]:
    """Per-epoch checksums of a sink topic read with read_committed (epoch header)."""
    import pyarrow as pa

    from bench.checksum import checksum_arrow
    from runners.engine.kafka_client import read_topic
    from runners.engine.kafka_sink import EPOCH_HEADER

    rows: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for record in read_topic(servers, topic):
        rows[int(record.headers[EPOCH_HEADER])].append(json.loads(record.value or b"{}"))
    return {epoch: checksum_arrow(pa.Table.from_pylist(r)) for epoch, r in sorted(rows.items())}


class SinkTopic:
    """A fresh sink topic (2 partitions), deleted by `close`."""

    def __init__(self, servers: str) -> None:
        from runners.engine.kafka_client import create_topic

        self.servers = servers
        self.topic = f"epochal-bench-sink-{uuid.uuid4().hex[:8]}"
        create_topic(servers, self.topic, 2)

    def sink(self) -> Any:
        from runners.engine.kafka_sink import KafkaSink

        return KafkaSink(self.servers, self.topic, id_prefix=f"epochal-bench-{self.topic}")

    def close(self) -> None:
        from runners.engine.kafka_client import delete_topics

        delete_topics(self.servers, [self.topic])


__all__ = [
    "SinkTopic",
    "engine_checksums",
    "fetch_connector",
    "run_spark_kafka",
    "topic_checksums",
]
