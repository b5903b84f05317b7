"""Kafka source against the real broker: partitions as splits, offsets in the snapshot,
per-epoch bounds, starting positions, retention-lost errors, topics by pattern with partitions
added at an epoch boundary, dead letters, read_committed and the backlog."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from runners.engine import EpochRunner, Job, read_dead_letters
from runners.engine import aggregations as agg
from runners.engine.kafka_client import (
    add_partitions,
    create_topic,
    delete_records,
    delete_topics,
    publish,
    settings,
)
from runners.engine.kafka_source import KafkaSource, parse_partition
from runners.engine.streams import SourceDataLostError
from snapshots_store import Repository
from tests.engine.stream_totals import expected as _expected
from tests.engine.stream_totals import records as _records
from tests.engine.stream_totals import totals as _totals

pytestmark = [pytest.mark.spark, pytest.mark.services]
SCHEMA = {"key": "string", "value": "int64"}
Topics = Callable[..., str]


@pytest.fixture
def topics(kafka_bootstrap: str) -> Iterator[Topics]:
    """topics(partitions=1, name=None, **config) -> a fresh topic, deleted after the test."""
    made: list[str] = []

    def make(partitions: int = 1, name: str | None = None, **config: str) -> str:
        topic = name or f"epochal-test-{uuid.uuid4().hex[:10]}"
        create_topic(kafka_bootstrap, topic, partitions, config)
        made.append(topic)
        return topic

    yield make
    delete_topics(kafka_bootstrap, made)


def _job(source: KafkaSource) -> Job:
    return Job(name="kafka", source=source, key="key",
               aggregate=[agg.count(), agg.sum("value")], time_mode="logical")  # fmt: skip


def _source(servers: str, topics: list[str], **kw: Any) -> KafkaSource:
    return KafkaSource(servers, topics, SCHEMA, required=("key",), **kw)


def test_bad_configuration_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match="bootstrap_servers 'localhost'"):
        KafkaSource("localhost", ["t"], SCHEMA)
    with pytest.raises(ValueError, match="exactly one of them"):
        KafkaSource("127.0.0.1:9092", ["t"], SCHEMA, pattern="t.*")
    with pytest.raises(ValueError, match="exactly one of them"):
        KafkaSource("127.0.0.1:9092", [], SCHEMA)
    with pytest.raises(ValueError, match="topic 'a/b'"):
        KafkaSource("127.0.0.1:9092", ["a/b"], SCHEMA)
    with pytest.raises(ValueError, match="start 'middle'"):
        KafkaSource("127.0.0.1:9092", ["t"], SCHEMA, start="middle")
    with pytest.raises(ValueError, match="start offset of t:0"):
        KafkaSource("127.0.0.1:9092", ["t"], SCHEMA, start={"t:0": -1})
    with pytest.raises(ValueError, match=r"config sets \['group.id'\]"):
        KafkaSource("127.0.0.1:9092", ["t"], SCHEMA, config={"group.id": "mine"})
    with pytest.raises(ValueError, match="pattern '\\(' is not a regular expression"):
        KafkaSource("127.0.0.1:9092", [], SCHEMA, pattern="(")
    with pytest.raises(ValueError, match="not a Kafka partition name"):
        parse_partition("clicks")


def test_partitions_are_splits_and_offsets_are_in_the_snapshot(
    spark: Any, repo: Repository, topics: Topics, kafka_bootstrap: str
) -> None:
    topic = topics(2)
    publish(kafka_bootstrap, topic, _records(120), partition=0)
    publish(kafka_bootstrap, topic, _records(30, first=1000), partition=1)
    source = _source(kafka_bootstrap, [topic], max_records_per_epoch=100, records_per_split=20)
    runner = EpochRunner(spark, _job(source), repo=repo, parallelism=2)
    first = runner.run_epoch()
    assert first is not None and first.records_in == 80  # 50 per partition, 1 has only 30
    manifest = repo.read_manifest(first.snapshot_id)
    assert manifest.offsets["kafka"] == {f"{topic}:0": 50, f"{topic}:1": 30}
    assert manifest.stats["splits"] == 5  # 50 = 20+20+10; 30 = 20+10
    assert manifest.stats["backlog_records"] == 70 and manifest.stats["backlog_epochs"] == 1
    results = runner.run()
    assert [r.records_in for r in results] == [50, 20]
    assert _totals(repo) == _expected(_records(120) + _records(30, first=1000))
    assert runner.run_epoch() is None and runner.stopped_reason == "no new data"
    publish(kafka_bootstrap, topic, _records(3, first=5000), partition=1)
    more = runner.run_epoch()
    assert more is not None and more.records_in == 3
    # the consumer group's offsets are never used: the source joins no group
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

    from runners.engine.kafka_client import admin

    futures = admin(kafka_bootstrap).list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions("epochal-unused", [TopicPartition(topic, 0)])]
    )
    (answer,) = [f.result() for f in futures.values()]
    assert answer.topic_partitions[0].offset < 0


def test_byte_bound(spark: Any, repo: Repository, topics: Topics, kafka_bootstrap: str) -> None:
    topic = topics()
    records = _records(40)
    publish(kafka_bootstrap, topic, records)
    size = len(json.dumps(records[0]))
    source = _source(kafka_bootstrap, [topic], max_records_per_epoch=None,
                     max_bytes_per_epoch=10 * size)  # fmt: skip
    results = EpochRunner(spark, _job(source), repo=repo).run()
    assert all(8 <= r.records_in <= 10 for r in results[:-1]), [r.records_in for r in results]
    assert sum(r.records_in for r in results) == 40
    assert _totals(repo) == _expected(records)


def test_starting_positions(
    spark: Any, tmp_path: Any, topics: Topics, kafka_bootstrap: str
) -> None:
    from confluent_kafka import Producer

    topic = topics()
    early = [{"key": "old", "value": i} for i in range(5)]
    late = [{"key": "new", "value": i} for i in range(4)]
    base = int(time.time() * 1000) - 600_000  # recent: retention would delete older records
    producer = Producer(settings(kafka_bootstrap))
    for i, r in enumerate(early):
        producer.produce(topic, json.dumps(r).encode(), timestamp=base + i)
    for i, r in enumerate(late):
        producer.produce(topic, json.dumps(r).encode(), timestamp=base + 100_000 + i)
    assert producer.flush(30) == 0

    def run(start: Any, name: str) -> tuple[Repository, EpochRunner]:
        repo = Repository.open(f"file://{tmp_path}/store", name)
        runner = EpochRunner(spark, _job(_source(kafka_bootstrap, [topic], start=start)), repo=repo)
        runner.run()
        return repo, runner

    repo, _ = run("earliest", "earliest")
    assert _totals(repo) == _expected(early + late)
    repo, _ = run(f"timestamp:{base + 100_001}", "timestamp")
    assert _totals(repo) == _expected(late[1:])
    repo, _ = run("offset:3", "offset")
    assert _totals(repo) == _expected(early[3:] + late)
    repo, _ = run({f"{topic}:0": 7}, "offsets")
    assert _totals(repo) == _expected(late[2:])
    repo, runner = run("latest", "latest")
    head = repo.read_manifest(repo.resolve("main"))
    assert head.epoch == 1 and head.stats["records_in"] == 0  # the start position is committed
    assert head.offsets["kafka"] == {f"{topic}:0": 9}
    publish(kafka_bootstrap, topic, [{"key": "newest", "value": 7}])
    runner.run()
    assert _totals(repo) == {"newest": (1, 7)}


def test_retention_that_deleted_unread_records_stops_the_job(
    spark: Any, repo: Repository, topics: Topics, kafka_bootstrap: str
) -> None:
    topic = topics()
    publish(kafka_bootstrap, topic, _records(30))
    source = _source(kafka_bootstrap, [topic], max_records_per_epoch=10)
    runner = EpochRunner(spark, _job(source), repo=repo)
    first = runner.run_epoch()
    assert first is not None and first.records_in == 10
    offsets = repo.read_manifest(first.snapshot_id).offsets["kafka"]
    assert source.retained(offsets) is None
    delete_records(kafka_bootstrap, topic, 0, 18)  # deletes 10 read and 8 unread records
    problem = source.retained(offsets)
    assert problem is not None
    assert (
        "retention deleted offsets 10 to 17 (8 records) that the snapshot had not read" in problem
    )
    with pytest.raises(SourceDataLostError, match=r"\(8 records\).*the job stops"):
        runner.run_epoch()
    assert repo.read_manifest(repo.resolve("main")).epoch == 1  # nothing committed
    # a branch that starts over at the oldest record left is the way on; deleting records
    # the snapshot read is no loss
    fresh = EpochRunner(spark, _job(_source(kafka_bootstrap, [topic])), repo=repo, branch="fresh")
    assert sum(r.records_in for r in fresh.run()) == 12
    delete_records(kafka_bootstrap, topic, 0, 30)
    assert source.retained(repo.read_manifest(repo.resolve("fresh")).offsets["kafka"]) is None
    # a deleted topic the snapshot had read from is reported too
    delete_topics(kafka_bootstrap, [topic])
    gone = source.retained(offsets)
    assert gone is not None and "no longer exists" in gone


def test_pattern_picks_up_new_topics_and_partitions_at_an_epoch_boundary(
    spark: Any, repo: Repository, topics: Topics, kafka_bootstrap: str
) -> None:
    prefix = f"epochal-test-{uuid.uuid4().hex[:8]}"
    first = topics(1, name=f"{prefix}-a")
    topics(1, name=f"{prefix}-unrelated-x")  # does not match the pattern
    publish(kafka_bootstrap, first, _records(10), partition=0)
    publish(kafka_bootstrap, f"{prefix}-unrelated-x", _records(5, first=900))
    source = KafkaSource(kafka_bootstrap, [], SCHEMA, required=("key",),
                         pattern=rf"{prefix}-[a-z]", start="latest")  # fmt: skip
    runner = EpochRunner(spark, _job(source), repo=repo, parallelism=2)
    start = runner.run_epoch()  # `latest`: commits the end of what exists at the first plan
    assert start is not None and start.records_in == 0
    publish(kafka_bootstrap, first, _records(4, first=10), partition=0)
    add_partitions(kafka_bootstrap, first, 2)
    publish(kafka_bootstrap, first, _records(6, first=20), partition=1)
    second = topics(2, name=f"{prefix}-b")
    publish(kafka_bootstrap, second, _records(8, first=30), partition=1)
    nxt = runner.run_epoch()
    assert nxt is not None and nxt.records_in == 4 + 6 + 8  # new partitions from their start
    offsets = repo.read_manifest(nxt.snapshot_id).offsets["kafka"]
    assert offsets == {f"{first}:0": 14, f"{first}:1": 6, f"{second}:0": 0, f"{second}:1": 8}
    assert _totals(repo) == _expected(_records(4, first=10) + _records(6, first=20)
                                      + _records(8, first=30))  # fmt: skip


def test_malformed_records_become_dead_letters(
    spark: Any, repo: Repository, topics: Topics, kafka_bootstrap: str
) -> None:
    topic = topics()
    publish(kafka_bootstrap, topic,
            [{"key": "a", "value": 1}, b"{not json", {"value": 2}, None, b"[1, 2]",
             {"key": "b", "value": "three"}])  # fmt: skip
    result = EpochRunner(spark, _job(_source(kafka_bootstrap, [topic])), repo=repo).run_epoch()
    assert result is not None and result.records_in == 6 and result.dead_letters == 5
    dead = read_dead_letters(repo, "main").to_pandas().sort_values("offset")
    assert list(dead["offset"]) == [1, 2, 3, 4, 5]
    assert set(dead["partition"]) == {f"{topic}:0"}
    reasons = list(dead["reason"])
    assert "missing field 'key'" in reasons[1] and "tombstone" in reasons[2]
    assert "JSON object" in reasons[3] and "field 'value'" in reasons[4]
    assert _totals(repo) == {"a": (1, 1)}


def test_records_of_aborted_and_open_transactions_are_not_read(
    spark: Any, repo: Repository, topics: Topics, kafka_bootstrap: str
) -> None:
    from confluent_kafka import Producer

    topic = topics()
    publish(kafka_bootstrap, topic, _records(5))
    producer = Producer(settings(kafka_bootstrap, transactional_id=f"{topic}-tx"))
    producer.init_transactions(30)
    producer.begin_transaction()
    for r in _records(3, first=100):
        producer.produce(topic, json.dumps(r).encode())
    producer.flush(30)
    producer.abort_transaction(30)
    producer.begin_transaction()
    for r in _records(4, first=200):
        producer.produce(topic, json.dumps(r).encode())
    producer.flush(30)  # open: beyond the last stable offset
    publish(kafka_bootstrap, topic, _records(2, first=300))  # after the open transaction
    runner = EpochRunner(spark, _job(_source(kafka_bootstrap, [topic])), repo=repo)
    first = runner.run_epoch()
    assert first is not None and first.records_in == 5  # stops before the open transaction
    producer.commit_transaction(30)
    read, deadline = 0, time.monotonic() + 30
    while read < 4 + 2 and time.monotonic() < deadline:  # the commit markers land shortly after
        read += sum(r.records_in for r in runner.run())
        time.sleep(0.05)
    assert read == 4 + 2
    assert _totals(repo) == _expected(_records(5) + _records(4, first=200) + _records(2, first=300))


def test_job_entry_point_stops_with_status_3_saying_what_was_lost(
    spark: Any, tmp_path: Any, topics: Topics, kafka_bootstrap: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    from tests.engine.crash_harness import run_job
    from tests.engine.jobs import STREAM_ENV, stream_job

    topic = topics()
    publish(kafka_bootstrap, topic, _records(1000))
    spec = f"kafka:{kafka_bootstrap}|{topic}"
    monkeypatch.setenv(STREAM_ENV, spec)
    store = f"file://{tmp_path}/store"
    first = EpochRunner(spark, stream_job(), repo=Repository.open(store, "lost")).run_epoch()
    assert first is not None and first.records_in == 400
    delete_records(kafka_bootstrap, topic, 0, 900)  # 400 read and 500 unread records go
    run = run_job(store=store, namespace="lost", data="", job="stream-job",
                  extra_env={STREAM_ENV: spec})  # fmt: skip
    assert run.returncode == 3, run.events
    last = run.events[-1]
    assert last["event"] == "stopped" and str(last["reason"]).startswith("data lost: ")
    assert "retention deleted offsets 400 to 899 (500 records)" in str(last["reason"])
    assert run.committed == [] and run.head_epoch == 1


def test_values_parsed_at_once_equal_the_record_by_record_decoder() -> None:
    from runners.engine.kafka_source import decode_values
    from runners.engine.sources import decode_json_records

    schema = {"key": "string", "value": "int64", "price": "float64", "ok": "bool"}
    good = [
        {"key": "a", "value": 1, "price": 0.1, "ok": True},
        {"key": 'é\\n"q"', "value": -(2**62), "price": 3, "extra": {"nested": [1]}},
        {"key": "c", "value": None, "price": 1e308, "ok": False},
        {"value": 5, "key": "d"},
    ]
    records = [(i, json.dumps(r).encode()) for i, r in enumerate(good)]
    fast = decode_values(records, schema, ("key",), "kafka", "t:0")
    slow = decode_json_records(records, schema, ("key",), "kafka", "t:0")
    assert fast.table.equals(slow.table) and fast.dead_letters == slow.dead_letters == []
    # one bad record anywhere: every record is decoded on its own, the bad one is named
    for bad, reason in [(b'{"key": "x", "value": 1.5}', "field 'value'"),
                        (b'{"value": 2}', "missing field 'key'"),
                        (b'{"key": "y"}\n{"key": "z"}', "Extra data"),
                        (b"", "Expecting value")]:  # fmt: skip
        mixed = [*records[:2], (2, bad), *records[2:]]
        data = decode_values(mixed, schema, ("key",), "kafka", "t:0")
        assert data.table.num_rows == 4 and [d.offset for d in data.dead_letters] == [2]
        assert reason in data.dead_letters[0].reason
