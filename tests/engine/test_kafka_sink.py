"""The exactly-once Kafka sink against the real broker: an epoch's records are staged in open
transactions during the epoch (invisible to read_committed consumers), committed after the
snapshot's CAS together with a marker naming the snapshot, and a run that finds the head's
publication unfinished repeats exactly what the topic lacks."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest

from runners.engine import EngineError, EpochRunner, Job, JobError, read_output
from runners.engine.kafka_client import create_topic, delete_topics, read_topic
from runners.engine.kafka_sink import EPOCH_HEADER, KafkaSink
from runners.engine.sinks import SINKS, Held, output_of
from snapshots_store import Repository
from tests.engine.jobs import aggregate_job

pytestmark = [pytest.mark.spark, pytest.mark.services]


@pytest.fixture
def sink_topic(kafka_bootstrap: str) -> Iterator[str]:
    import uuid

    topic = f"epochal-test-sink-{uuid.uuid4().hex[:10]}"
    create_topic(kafka_bootstrap, topic, 2)
    yield topic
    delete_topics(kafka_bootstrap, [topic])


def by_epoch(servers: str, topic: str, level: str = "read_committed") -> dict[int, list[str]]:
    """The topic's records per epoch header, each epoch's rows as sorted JSON texts."""
    epochs: dict[int, list[str]] = defaultdict(list)
    for record in read_topic(servers, topic, isolation_level=level):
        row = json.loads(record.value or b"null")
        assert record.key == row["key"].encode()
        epochs[int(record.headers[EPOCH_HEADER])].append(json.dumps(row, sort_keys=True))
    return {e: sorted(rows) for e, rows in epochs.items()}


def output_by_epoch(repo: Repository, branch: str = "main") -> dict[int, list[str]]:
    """The branch's output per epoch in the same form."""
    epochs: dict[int, list[str]] = defaultdict(list)
    for row in read_output(repo, branch).to_pylist():
        epoch = row.pop("_epoch")
        epochs[int(epoch)].append(json.dumps(row, sort_keys=True))
    return {e: sorted(rows) for e, rows in epochs.items()}


def _job(epochs_dir: str, sink: Any) -> Job:
    return aggregate_job(epochs_dir, sinks=[sink])


def test_bad_configuration_is_refused_naming_the_field(epochs_dir: str) -> None:
    with pytest.raises(ValueError, match="topic 'a/b'"):
        KafkaSink("127.0.0.1:9092", "a/b")
    with pytest.raises(ValueError, match=r"config sets \['transactional.id'\]"):
        KafkaSink("127.0.0.1:9092", "t", config={"transactional.id": "x"})
    with pytest.raises(ValueError, match="transaction_timeout_ms"):
        KafkaSink("127.0.0.1:9092", "t", transaction_timeout_ms=5)
    with pytest.raises(JobError, match="lacks prepare/commit/committed"):
        _job(epochs_dir, object())
    with pytest.raises(JobError, match="share a name"):
        aggregate_job(epochs_dir, sinks=[KafkaSink("127.0.0.1:9092", "t"),
                                         KafkaSink("127.0.0.1:9092", "u")])  # fmt: skip


def test_a_missing_topic_stops_the_epoch_before_its_commit(
    spark: Any, repo: Repository, epochs_dir: str, kafka_bootstrap: str
) -> None:
    sink = KafkaSink(kafka_bootstrap, "epochal-test-no-such-topic")
    runner = EpochRunner(spark, _job(epochs_dir, sink), repo=repo)
    with pytest.raises(EngineError, match="topic 'epochal-test-no-such-topic' does not exist"):
        runner.run_epoch()
    assert repo.read_ref("heads/main") is None


def test_every_epoch_reaches_the_topic_once_after_its_snapshot(
    spark: Any, repo: Repository, epochs_dir: str, kafka_bootstrap: str, sink_topic: str
) -> None:
    sink = KafkaSink(kafka_bootstrap, sink_topic)
    results = EpochRunner(spark, _job(epochs_dir, sink), repo=repo, parallelism=2).run()
    assert len(results) == 6
    expected = output_by_epoch(repo)
    assert by_epoch(kafka_bootstrap, sink_topic) == expected
    assert sum(len(rows) for rows in expected.values()) == sum(r.output_rows for r in results)
    head = repo.read_manifest(results[-1].snapshot_id)
    pending = head.extra[SINKS]["kafka"]
    assert pending["epoch"] == 6 and len(pending["parts"]) == 2  # a part per task
    ids = [t["id"] for t in pending["staged"]["transactions"]]
    assert ids[0].endswith(".main.kafka.kg0-63.e6") and ids[1].endswith(".kg64-127.e6")
    assert sink.committed(pending["staged"]) == Held(6, results[-1].snapshot_id)
    # a restart finds the head's epoch in the topic and publishes nothing again
    again = EpochRunner(spark, _job(epochs_dir, KafkaSink(kafka_bootstrap, sink_topic)),
                        repo=repo)  # fmt: skip
    assert again.run() == []
    assert by_epoch(kafka_bootstrap, sink_topic) == expected


def test_staged_records_are_invisible_until_the_commit_and_a_new_process_repeats_it(
    spark: Any, repo: Repository, epochs_dir: str, kafka_bootstrap: str, sink_topic: str
) -> None:
    sink = KafkaSink(kafka_bootstrap, sink_topic)
    runner = EpochRunner(spark, _job(epochs_dir, sink), repo=repo, parallelism=2)
    first = runner.run_epoch()
    assert first is not None
    # stage epoch 1 again as a new transaction of the same ids, as a killed run would have
    head = repo.read_manifest(first.snapshot_id)
    entry = head.extra[SINKS]["kafka"]
    staged = KafkaSink(kafka_bootstrap, sink_topic)
    output = output_of(repo, repo_namespace(repo), head, first.snapshot_id, entry)
    record = staged.prepare(output)
    assert [t["records"] for t in record["transactions"]] == [
        t["records"] for t in entry["staged"]["transactions"]
    ]
    assert by_epoch(kafka_bootstrap, sink_topic) == output_by_epoch(repo)  # not visible
    uncommitted = by_epoch(kafka_bootstrap, sink_topic, "read_uncommitted")
    assert len(uncommitted[1]) == 2 * len(output_by_epoch(repo)[1])  # in the log, though
    # a new process (another sink object) whose head is already held does nothing; the
    # staged transactions are aborted when the same ids start again
    fresh = KafkaSink(kafka_bootstrap, sink_topic)
    fresh.commit(output, entry["staged"])
    staged.close()
    assert by_epoch(kafka_bootstrap, sink_topic) == output_by_epoch(repo)
    # a marker that does not name the head makes a restart publish the epoch again, once
    fake = KafkaSink(kafka_bootstrap, sink_topic, id_prefix="other")
    fake_output = output_of(repo, repo_namespace(repo), head, first.snapshot_id, entry)
    fake_entry = fake_output.pending(fake.prepare(fake_output))
    fake.runtime.open.clear()  # the "process" dies after the CAS, before its commit
    assert fake.committed(fake_entry["staged"]) is None
    fake.commit(fake_output, fake_entry["staged"])  # repeats it from the snapshot
    # the broker writes a commit's markers after answering it: the last stable offset (what a
    # read_committed reader sees) reaches the records a moment later
    twice = sorted(output_by_epoch(repo)[1] * 2)
    deadline = time.monotonic() + 15
    while (epochs := by_epoch(kafka_bootstrap, sink_topic))[1] != twice:
        if time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert epochs[1] == twice  # the other sink's copy, once
    assert fake.committed(fake_entry["staged"]) == Held(1, first.snapshot_id)


def repo_namespace(repo: Repository) -> str:
    from runners.engine.runner import _store_location

    return _store_location(repo)[1]
