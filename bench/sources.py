"""Log-source benchmark: ``python -m bench.sources [--quick] [--records N] [--sources …]``.

One SparkSession (``local[2]``) runs the same keyed running aggregate (count, sum and max of
``value`` per ``key``, committed every epoch, p=2) over the same JSON records read

- from JSON-lines files (`JsonLinesDirectory`, one file per epoch): the baseline;
- from a Redis stream (`RedisStreamSource`, ``--redis-url``);
- from a RabbitMQ stream (`RabbitMQStreamSource`, ``--rabbitmq-url``; AMQP 1.0 messages),
- from a Kafka topic of one partition (`KafkaSource`, ``--kafka-servers``),

each with the same records per epoch. Records are published before the timed run, so the
rates (``records_per_s``) measure reading and processing, not the producer;
``ratio_stream_vs_files`` is each stream source's rate over the files' rate in the same run.
Every run's final state (per-key count, sum and max) must equal a numpy reference.

Lag: a producer then publishes ``--lag-records`` records at ``--lag-rate`` per second while
the job runs epochs back to back; a message's lag is the time from its publication (the
producer's clock before sending) to the commit of the epoch that read it (``lag_ms`` p50/p99).

Two Kafka parts follow (``--parts``, bench/sources_kafka.py): ``sink`` runs the Kafka job again
with the exactly-once Kafka sink (``ratio_with_sink``, ``exactly_once_checked``), and
``spark_kafka`` runs Spark Structured Streaming's own Kafka source with the built-in streaming
aggregation on the same topic in the same session (``ratio_vs_spark_kafka``: our rate over
Spark's, with per-epoch checksums equal). Exit status 1 when a result, a checksum or the
sink's exactly-once check is wrong (the JSON is printed anyway, ``checks`` says which).

Progress goes to stderr; the last stdout line is one JSON object with the load average
(``os.getloadavg()``) at the start and beside every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

SOURCES = ("redis", "rabbitmq", "kafka")
PARTS = ("sink", "spark_kafka")
SCHEMA = {"key": "string", "value": "int64"}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def records(n: int, keys: int, seed: int = 19) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    ks, vs = rng.integers(0, keys, n), rng.integers(0, 1000, n)
    return [
        {"key": f"key-{k}", "value": int(v)} for k, v in zip(ks.tolist(), vs.tolist(), strict=True)
    ]


def reference(rows: Sequence[dict[str, Any]]) -> dict[str, tuple[int, int, int]]:
    out: dict[str, tuple[int, int, int]] = {}
    for r in rows:
        c, s, m = out.get(r["key"], (0, 0, -1))
        out[r["key"]] = (c + 1, s + r["value"], max(m, r["value"]))
    return out


def final_state(repo: Any) -> dict[str, tuple[int, int, int]]:
    from runners.engine import read_output

    frame = read_output(repo, "main").to_pandas().sort_values("_epoch").groupby("key").last()
    return {
        str(k): (int(r["count"]), int(r["sum_value"]), int(r["max_value"]))
        for k, r in frame.iterrows()
    }


class Log:
    """A fresh stream of one broker: publish to it, a source over it, clean it up."""

    def __init__(self, kind: str, url: str) -> None:
        self.kind, self.url = kind, url
        self.stream = f"epochal-bench-{uuid.uuid4().hex[:8]}"
        self.published: list[tuple[int, float]] = []  # (offset, publication time)
        self.partition = self.stream  # the partition name in the offsets
        if kind == "redis":
            import redis

            self.client = redis.Redis.from_url(url)
        elif kind == "kafka":
            from runners.engine.kafka_client import create_topic

            create_topic(url, self.stream, 1)
            self.partition, self.count = f"{self.stream}:0", 0
        else:
            from runners.engine.rabbitmq_stream import create_stream

            create_stream(url, self.stream)
            self.count = 0

    def publish(self, rows: Sequence[dict[str, Any]]) -> None:
        now = time.time()
        if self.kind == "redis":
            from runners.engine.redis_stream import encode_id

            for i in range(0, len(rows), 1000):
                pipe = self.client.pipeline(transaction=False)
                for r in rows[i : i + 1000]:
                    pipe.xadd(self.stream, {"data": json.dumps(r)})
                ids = pipe.execute()
                self.published.extend((encode_id(x), now) for x in ids)
        elif self.kind == "kafka":
            from runners.engine.kafka_client import publish as send

            send(self.url, self.stream, rows)
            self.published.extend((self.count + i, now) for i in range(len(rows)))
            self.count += len(rows)
        else:
            from runners.engine.rabbitmq_stream import publish

            publish(self.url, self.stream, rows)
            self.published.extend((self.count + i, now) for i in range(len(rows)))
            self.count += len(rows)

    def source(self, per_epoch: int) -> Any:
        from runners.engine.kafka_source import KafkaSource
        from runners.engine.rabbitmq_stream import RabbitMQStreamSource
        from runners.engine.redis_stream import RedisStreamSource

        cls = {"redis": RedisStreamSource, "kafka": KafkaSource}.get(
            self.kind, RabbitMQStreamSource
        )
        return cls(self.url, [self.stream], SCHEMA, required=("key",),
                   max_records_per_epoch=per_epoch, records_per_split=per_epoch)  # fmt: skip

    def close(self) -> None:
        if self.kind == "redis":
            self.client.delete(self.stream)
        elif self.kind == "kafka":
            from runners.engine.kafka_client import delete_topics

            delete_topics(self.url, [self.stream])
        else:
            from runners.engine.rabbitmq_stream import delete_stream

            delete_stream(self.url, self.stream)


def job(source: Any, sinks: Sequence[Any] = ()) -> Any:
    from runners.engine import Job
    from runners.engine import aggregations as agg

    return Job(name="bench-sources", source=source, key="key", time_mode="logical",
               aggregate=[agg.count(), agg.sum("value"), agg.max("value")],
               sinks=list(sinks))  # fmt: skip


def timed_run(
    spark: Any, source: Any, store: str, sinks: Sequence[Any] = ()
) -> tuple[float, Any, list[Any]]:
    from runners.engine import EpochRunner
    from snapshots_store import Repository

    repo = Repository.open(store, uuid.uuid4().hex[:12])
    runner = EpochRunner(spark, job(source, sinks), repo=repo, parallelism=2)
    started = time.perf_counter()
    results = runner.run()
    return time.perf_counter() - started, repo, results


def lag(spark: Any, broker: Log, store: str, n: int, rate: float, per_epoch: int) -> dict[str, Any]:
    """Publication-to-commit lag of `n` records published at `rate` per second."""
    from runners.engine import EpochRunner
    from snapshots_store import Repository

    rows = records(n, keys=1000, seed=7)
    broker.published.clear()
    batch = max(1, int(rate / 10))
    repo = Repository.open(store, uuid.uuid4().hex[:12])
    runner = EpochRunner(spark, job(broker.source(per_epoch)), repo=repo, parallelism=2)
    commits: list[tuple[dict[str, int], float]] = []

    def produce() -> None:
        started = time.perf_counter()
        for i in range(0, n, batch):
            delay = started + i / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            broker.publish(rows[i : i + batch])

    producer = threading.Thread(target=produce, name="bench-producer")
    producer.start()
    read = 0
    deadline = time.time() + 120 + n / rate
    while read < n and time.time() < deadline:
        result = runner.run_epoch()
        if result is None:
            time.sleep(0.05)
            continue
        offsets = repo.read_manifest(result.snapshot_id).offsets[broker.source(1).name]
        commits.append((dict(offsets), time.time()))
        read += result.records_in
    producer.join()
    ends = [(int(o[broker.partition]), t) for o, t in commits]
    lags: list[float] = []
    for offset, published in broker.published:
        committed = next((t for end, t in ends if offset < end), None)
        if committed is not None:
            lags.append((committed - published) * 1000)
    if len(lags) != n:
        raise RuntimeError(f"lag run read {len(lags)} of {n} records")
    p50, p99 = np.percentile(lags, [50, 99])
    return {
        "p50": round(float(p50), 1),
        "p99": round(float(p99), 1),
        "records": n,
        "rate_per_s": rate,
        "epochs": len(commits),
        "loadavg": list(os.getloadavg()),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.sources", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes for a smoke run")
    p.add_argument("--records", type=int, default=200_000, help="records per source")
    p.add_argument("--epochs", type=int, default=4, help="epochs the records are cut into")
    p.add_argument("--keys", type=int, default=20_000)
    p.add_argument("--lag-records", type=int, default=20_000)
    p.add_argument("--lag-rate", type=float, default=4000.0, help="records per second")
    p.add_argument(
        "--sources", default=",".join(SOURCES), help="comma list of redis, rabbitmq, kafka"
    )
    p.add_argument(
        "--parts", default=",".join(PARTS),
        help="Kafka parts after the sources (with kafka among them): sink, spark_kafka; '' none",
    )  # fmt: skip
    p.add_argument(
        "--kafka-servers",
        default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"),
        help="Kafka bootstrap servers (default $KAFKA_BOOTSTRAP_SERVERS or 127.0.0.1:9092)",
    )
    p.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    p.add_argument(
        "--rabbitmq-url",
        default=os.environ.get(
            "RABBITMQ_STREAM_URL", "rabbitmq-stream://guest:guest@127.0.0.1:5552/%2F"
        ),
    )
    args = p.parse_args(argv)
    if args.quick:
        args.records, args.epochs, args.keys = 4000, 2, 500
        args.lag_records, args.lag_rate = 300, 600.0
    chosen = [s for s in args.sources.split(",") if s]
    unknown = sorted(set(chosen) - set(SOURCES))
    if unknown:
        p.error(f"--sources: unknown {unknown}; choose from {', '.join(SOURCES)}")
    if args.records < args.epochs or args.epochs < 1:
        p.error("--records must be at least --epochs, and --epochs at least 1")
    args.sources = chosen
    parts = [s for s in args.parts.split(",") if s]
    if sorted(set(parts) - set(PARTS)):
        p.error(f"--parts: unknown {sorted(set(parts) - set(PARTS))}; choose from {PARTS}")
    args.parts = parts if "kafka" in chosen else []
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from runners.engine.session import build_spark_session
    from runners.engine.sources import JsonLinesDirectory, write_jsonl_file

    load_start = list(os.getloadavg())
    work = Path(tempfile.mkdtemp(prefix="epochal-bench-sources-"))
    store = f"file://{work}/store"
    rows = records(args.records, args.keys)
    per_epoch = args.records // args.epochs
    expected = reference(rows[: per_epoch * args.epochs])
    conf: dict[str, str] = {}
    connector = None
    if "spark_kafka" in args.parts:  # Spark's Kafka connector joins the session at its start
        from bench.sources_kafka import fetch_connector

        connector, jars = fetch_connector(log)
        conf["spark.jars"] = ",".join(jars)
    spark = build_spark_session(master="local[2]", app_name="bench-sources", conf=conf)
    rates: dict[str, float] = {}
    repos: dict[str, Any] = {}
    kafka: dict[str, Any] = {}
    checks: dict[str, bool] = {}
    loads: dict[str, list[float]] = {}
    lags: dict[str, Any] = {}
    correct = True
    brokers: list[Log] = []
    try:
        data = work / "files"
        for e in range(args.epochs):
            write_jsonl_file(str(data), f"part-{e:05d}", rows[e * per_epoch : (e + 1) * per_epoch])
        files = JsonLinesDirectory(str(data), SCHEMA, required=("key",))
        # warm the JVM, the Python workers and the code paths once on a tiny set
        warm = work / "warm"
        write_jsonl_file(str(warm), "part-00000", rows[:200])
        timed_run(spark, JsonLinesDirectory(str(warm), SCHEMA), store)
        runs: list[tuple[str, Callable[[], Any]]] = [("files", lambda: files)]
        for kind in args.sources:
            url = {"redis": args.redis_url, "kafka": args.kafka_servers}.get(
                kind, args.rabbitmq_url
            )
            broker = Log(kind, url)
            brokers.append(broker)
            log(f"publishing {len(rows)} records to {kind} stream {broker.stream}")
            broker.publish(rows[: per_epoch * args.epochs])
            runs.append((kind, lambda b=broker: b.source(per_epoch)))
        for name, make in runs:
            seconds, repo, results = timed_run(spark, make(), store)
            repos[name] = repo
            rates[name] = round(per_epoch * args.epochs / seconds, 1)
            loads[name] = list(os.getloadavg())
            ok = final_state(repo) == expected and len(results) == args.epochs
            correct = correct and ok
            log(f"{name}: {rates[name]:.0f} records/s over {len(results)} epochs"
                f"{'' if ok else ' — WRONG RESULT'}")  # fmt: skip
        for broker in list(brokers):
            lag_broker = Log(broker.kind, broker.url)
            brokers.append(lag_broker)
            lags[broker.kind] = lag(spark, lag_broker, store, args.lag_records, args.lag_rate,
                                    per_epoch)  # fmt: skip
            log(f"{broker.kind} lag: {lags[broker.kind]}")
        topic = next((b for b in brokers if b.kind == "kafka"), None)
        if topic is not None and args.parts:
            kafka = kafka_parts(spark, args, topic, per_epoch, store, work, rates, repos, loads)
            kafka["connector"] = connector
            checks.update(kafka.pop("checks"))
    finally:
        for broker in brokers:
            try:
                broker.close()
            except Exception as exc:  # a cleanup failure must not hide the figures
                log(f"could not delete {broker.kind} stream {broker.stream}: {exc}")
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    checks["results_match"] = correct
    report = {
        "bench": "sources",
        "records": per_epoch * args.epochs,
        "epochs": args.epochs,
        "keys": args.keys,
        "records_per_s": rates,
        "ratio_stream_vs_files": {k: round(rates[k] / rates["files"], 3) for k in args.sources},
        "lag_ms": lags,
        **kafka_report(kafka),
        "results_match": correct,
        "checks": checks,
        "loadavg": {"start": load_start, **loads, "end": list(os.getloadavg())},
        "cpus": os.cpu_count(),
    }
    print(json.dumps(report))
    return 0 if all(checks.values()) else 1


def kafka_parts(
    spark: Any, args: argparse.Namespace, topic: Log, per_epoch: int, store: str, work: Path,
    rates: dict[str, float], repos: dict[str, Any], loads: dict[str, list[float]],
) -> dict[str, Any]:  # fmt: skip
    """The sink and spark_kafka parts over the Kafka source's topic (bench/sources_kafka.py)."""
    from bench import sources_kafka as parts

    out: dict[str, Any] = {"checks": {}}
    engine = parts.engine_checksums(repos["kafka"], args.epochs)
    if "sink" in args.parts:
        sink_topic = parts.SinkTopic(args.kafka_servers)
        try:
            # the baseline again right before, so both runs see the same machine
            seconds, _, _ = timed_run(spark, topic.source(per_epoch), store)
            rates["kafka_without_sink"] = round(per_epoch * args.epochs / seconds, 1)
            loads["kafka_without_sink"] = list(os.getloadavg())
            seconds, repo, _ = timed_run(
                spark, topic.source(per_epoch), store, sinks=[sink_topic.sink()]
            )
            rates["kafka_with_sink"] = round(per_epoch * args.epochs / seconds, 1)
            loads["kafka_with_sink"] = list(os.getloadavg())
            stored = parts.engine_checksums(repo, args.epochs)
            published = parts.topic_checksums(args.kafka_servers, sink_topic.topic)
            exact = published == {e + 1: c for e, c in enumerate(stored)} and stored == engine
            out["checks"]["exactly_once_checked"] = exact
            out["ratio_with_sink"] = round(
                rates["kafka_with_sink"] / rates["kafka_without_sink"], 3
            )
            log(f"kafka with the Kafka sink: {rates['kafka_with_sink']:.0f} records/s "
                f"({out['ratio_with_sink']} of without), exactly once: {exact}")  # fmt: skip
        finally:
            sink_topic.close()
    if "spark_kafka" in args.parts:
        # each side warmed on a small topic first, then measured back to back on the same one
        warm = Log("kafka", args.kafka_servers)
        try:
            warm.publish(records(2 * 1000, 100, seed=3))
            parts.run_spark_kafka(spark, args.kafka_servers, warm.stream, 1000, 2, work)
        finally:
            warm.close()
        seconds, repo, _ = timed_run(spark, topic.source(per_epoch), store)
        rates["kafka_before_spark"] = round(per_epoch * args.epochs / seconds, 1)
        loads["kafka_before_spark"] = list(os.getloadavg())
        spark_run = parts.run_spark_kafka(
            spark, args.kafka_servers, topic.stream, per_epoch, args.epochs, work
        )
        rates["spark_kafka"] = spark_run.pop("records_per_s")
        loads["spark_kafka"] = spark_run.pop("loadavg")
        engine_now = parts.engine_checksums(repo, args.epochs)
        equal = spark_run.pop("checksums") == engine_now == engine
        out["checks"]["checksums_equal"] = equal
        out["ratio_vs_spark_kafka"] = round(rates["kafka_before_spark"] / rates["spark_kafka"], 3)
        out["spark_kafka"] = spark_run
        log(f"Spark's Kafka source + streaming aggregation: {rates['spark_kafka']:.0f} records/s;"
            f" ours {out['ratio_vs_spark_kafka']}x, checksums equal: {equal}")  # fmt: skip
    out["peer_settings"] = {
        "spark.driver.memory": spark.conf.get("spark.driver.memory", "1g (default)"),
        "spark.sql.shuffle.partitions": spark.conf.get("spark.sql.shuffle.partitions"),
        "master": spark.sparkContext.master,
        "jvm": "defaults (no extraJavaOptions)",
        "state_store": "default (HDFS-backed)",
        "maxOffsetsPerTrigger": per_epoch,
        "engine_parallelism": 2,
    }
    return out


def kafka_report(kafka: dict[str, Any]) -> dict[str, Any]:
    """The Kafka parts' fields of the report, with their targets."""
    if not kafka:
        return {}
    report = {k: v for k, v in kafka.items() if k not in ("connector",)}
    report["spark_kafka_connector"] = kafka.get("connector")
    targets = {}
    if "ratio_with_sink" in kafka:
        targets["ratio_with_sink >= 0.5"] = kafka["ratio_with_sink"] >= 0.5
    if "ratio_vs_spark_kafka" in kafka:
        targets["ratio_vs_spark_kafka >= 3"] = kafka["ratio_vs_spark_kafka"] >= 3
    report["targets_met"] = targets
    return report


if __name__ == "__main__":
    sys.exit(main())
