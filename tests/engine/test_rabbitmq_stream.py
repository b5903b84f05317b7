"""RabbitMQ Streams source against the real broker (stream plugin): offsets in the snapshot,
per-epoch bounds, starting positions, retention-lost errors, dead letters, fork and
rollback resume."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from runners.engine import EpochRunner, Job, read_dead_letters
from runners.engine import aggregations as agg
from runners.engine.rabbitmq_stream import (
    RabbitMQStreamSource,
    create_stream,
    delete_stream,
    publish,
)
from runners.engine.state_ops import new_branch_commit
from runners.engine.streams import SourceDataLostError
from snapshots_store import Repository
from tests.engine.stream_totals import expected as _expected
from tests.engine.stream_totals import records as _records
from tests.engine.stream_totals import totals as _totals

pytestmark = [pytest.mark.spark, pytest.mark.services]
SCHEMA = {"key": "string", "value": "int64"}


@pytest.fixture
def streams(rabbitmq_stream_url: str) -> Iterator[list[str]]:
    names: list[str] = []
    yield names
    for name in names:
        delete_stream(rabbitmq_stream_url, name)


def _new(url: str, names: list[str], n: int, **arguments: Any) -> list[str]:
    new = [f"epochal-test-{uuid.uuid4().hex[:8]}-{i}" for i in range(n)]
    for name in new:
        create_stream(url, name, **arguments)
    names.extend(new)
    return new


def _job(source: RabbitMQStreamSource) -> Job:
    return Job(name="rabbitmq", source=source, key="key",
               aggregate=[agg.count(), agg.sum("value")], time_mode="logical")  # fmt: skip


def _source(url: str, streams: list[str], **kw: Any) -> RabbitMQStreamSource:
    return RabbitMQStreamSource(url, streams, SCHEMA, required=("key",), **kw)


def test_options_are_checked() -> None:
    with pytest.raises(ValueError, match="rabbitmq-stream://"):
        RabbitMQStreamSource("amqp://localhost", ["s"], SCHEMA)
    with pytest.raises(ValueError, match="offset:<n> needs a non-negative integer"):
        RabbitMQStreamSource("rabbitmq-stream://h:5552/%2F", ["s"], SCHEMA, start="offset:x")
    with pytest.raises(ValueError, match="max_records_per_epoch"):
        RabbitMQStreamSource("rabbitmq-stream://h/", ["s"], SCHEMA, max_records_per_epoch=0)


def test_offsets_and_bounds_are_in_the_snapshot(
    spark: Any, repo: Repository, streams: list[str], rabbitmq_stream_url: str
) -> None:
    url = rabbitmq_stream_url
    a, b = _new(url, streams, 2)
    publish(url, a, _records(120))
    publish(url, b, _records(30, first=1000))
    source = _source(url, [a, b], max_records_per_epoch=100, records_per_split=20)
    runner = EpochRunner(spark, _job(source), repo=repo, parallelism=2)
    first = runner.run_epoch()
    assert first is not None and first.records_in == 80  # 50 of a, all 30 of b
    manifest = repo.read_manifest(first.snapshot_id)
    stats = repo.read_manifest(first.snapshot_id).stats  # the autoscaler's backlog inputs
    assert stats["backlog_records"] == 70 and stats["backlog_epochs"] == 1
    assert manifest.offsets["rabbitmq"] == {a: 50, b: 30}
    assert manifest.stats["splits"] == 5
    assert [r.records_in for r in runner.run()] == [50, 20]
    assert _totals(repo) == _expected(_records(120) + _records(30, first=1000))
    assert runner.run_epoch() is None and runner.stopped_reason == "no new data"
    # a byte bound
    (c,) = _new(url, streams, 1)
    records = _records(40)
    publish(url, c, records)
    size = len(json.dumps(records[0]))
    by_bytes = _source(url, [c], max_records_per_epoch=None, max_bytes_per_epoch=10 * size)
    results = EpochRunner(spark, _job(by_bytes), repo=repo, branch="bytes").run()
    assert all(8 <= r.records_in <= 10 for r in results[:-1]), [r.records_in for r in results]
    assert sum(r.records_in for r in results) == 40
    assert _totals(repo, "bytes") == _expected(records)


def test_starting_positions(
    spark: Any, tmp_path: Any, streams: list[str], rabbitmq_stream_url: str
) -> None:
    url = rabbitmq_stream_url
    (a,) = _new(url, streams, 1)
    early = [{"key": "old", "value": i} for i in range(5)]
    publish(url, a, early)
    time.sleep(0.05)
    middle_ms = int(time.time() * 1000)
    time.sleep(0.05)
    late = [{"key": "new", "value": i} for i in range(4)]
    publish(url, a, late)

    def run(start: str, name: str) -> tuple[Repository, EpochRunner]:
        repo = Repository.open(f"file://{tmp_path}/store", name)
        runner = EpochRunner(spark, _job(_source(url, [a], start=start)), repo=repo)
        runner.run()
        return repo, runner

    repo, _ = run("earliest", "earliest")
    assert _totals(repo) == _expected(early + late)
    repo, _ = run(f"timestamp:{middle_ms}", "timestamp")
    assert _totals(repo) == _expected(late)
    repo, _ = run("offset:3", "offset")
    assert _totals(repo) == _expected(early[3:] + late)
    repo, runner = run("latest", "latest")
    head = repo.read_manifest(repo.resolve("main"))
    assert head.epoch == 1 and head.stats["records_in"] == 0  # the start position is committed
    assert head.offsets["rabbitmq"] == {a: 9}
    publish(url, a, [{"key": "newest", "value": 7}])
    runner.run()
    assert _totals(repo) == {"newest": (1, 7)}


def test_retention_that_deleted_unread_offsets_stops_the_job(
    spark: Any, repo: Repository, streams: list[str], rabbitmq_stream_url: str
) -> None:
    url = rabbitmq_stream_url
    (a,) = _new(url, streams, 1, max_length_bytes=4000, stream_max_segment_size_bytes=1000)
    publish(url, a, _records(30))
    source = _source(url, [a], max_records_per_epoch=10)
    runner = EpochRunner(spark, _job(source), repo=repo)
    first = runner.run_epoch()
    assert first is not None and first.records_in == 10
    offsets = repo.read_manifest(first.snapshot_id).offsets["rabbitmq"]
    assert source.retained(offsets) is None
    for i in range(10):  # segments roll over; retention deletes the oldest ones
        publish(url, a, _records(30, first=100 + 30 * i))
    problem = source.retained(offsets)
    assert problem is not None
    assert f"RabbitMQ stream {a!r}: retention deleted offsets 10 to " in problem
    with pytest.raises(SourceDataLostError, match=r"that the snapshot had not read .* stops"):
        runner.run_epoch()
    assert repo.read_manifest(repo.resolve("main")).epoch == 1  # nothing committed


def test_malformed_messages_become_dead_letters(
    spark: Any, repo: Repository, streams: list[str], rabbitmq_stream_url: str
) -> None:
    url = rabbitmq_stream_url
    (a,) = _new(url, streams, 1)
    publish(url, a, [{"key": "a", "value": 1}, b"{not json", {"value": 2}])
    publish(url, a, [b"\x00\x53raw, not AMQP"], amqp=False)
    result = EpochRunner(spark, _job(_source(url, [a])), repo=repo).run_epoch()
    assert result is not None and result.records_in == 4 and result.dead_letters == 3
    dead = read_dead_letters(repo, "main").to_pandas().sort_values("offset")
    assert list(dead["offset"]) == [1, 2, 3]
    assert "missing field 'key'" in dead["reason"].iloc[1]
    assert "not an AMQP 1.0 message" in dead["reason"].iloc[2]
    assert _totals(repo) == {"a": (1, 1)}


def test_fork_and_rollback_resume_where_the_snapshot_stopped(
    spark: Any, repo: Repository, streams: list[str], rabbitmq_stream_url: str
) -> None:
    url = rabbitmq_stream_url
    a, b = _new(url, streams, 2)
    records = _records(60)
    publish(url, a, records[:30])
    publish(url, b, records[30:])
    source = _source(url, [a, b], max_records_per_epoch=20)
    results = EpochRunner(spark, _job(source), repo=repo, parallelism=2).run()
    assert len(results) == 3
    expected = _expected(records)
    assert _totals(repo) == expected
    first = results[0].snapshot_id
    EpochRunner(spark, _job(source), repo=repo, branch="fork", base=first, parallelism=3).run()
    assert _totals(repo, "fork") == expected
    head = repo.resolve("main")
    new_branch_commit(repo, first, "main", kind="rollback", operation_id=None,
                      provenance={"reason": "test"}, expected_head=head)  # fmt: skip
    again = EpochRunner(spark, _job(source), repo=repo, parallelism=1).run()
    assert sum(r.records_in for r in again) == 40
    assert _totals(repo) == expected
