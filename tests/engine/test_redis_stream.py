"""Redis Streams source against the real Redis: offsets in the snapshot, per-epoch bounds,
starting positions, retention-lost errors, dead letters, fork and rollback resume."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from runners.engine import EpochRunner, Job, read_dead_letters
from runners.engine import aggregations as agg
from runners.engine.redis_stream import COUNT_SUFFIX, RedisStreamSource, decode_id, encode_id
from runners.engine.state_ops import new_branch_commit
from runners.engine.streams import SourceDataLostError
from snapshots_store import Repository
from tests.engine.stream_totals import expected as _expected
from tests.engine.stream_totals import records as _records
from tests.engine.stream_totals import totals as _totals

pytestmark = [pytest.mark.spark, pytest.mark.services]
SCHEMA = {"key": "string", "value": "int64"}


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[Any]:
    import redis

    client = redis.Redis.from_url(redis_url)
    names: list[str] = []
    client.test_names = names  # type: ignore[attr-defined]
    yield client
    if names:
        client.delete(*names)


def _streams(client: Any, n: int) -> list[str]:
    names = [f"epochal-test-{uuid.uuid4().hex[:8]}-{i}" for i in range(n)]
    client.test_names.extend(names)
    return names


def _publish(client: Any, stream: str, records: list[dict[str, Any]], **kw: Any) -> list[bytes]:
    return [client.xadd(stream, {"data": json.dumps(r)}, **kw) for r in records]


def _job(source: RedisStreamSource) -> Job:
    return Job(name="redis", source=source, key="key",
               aggregate=[agg.count(), agg.sum("value")], time_mode="logical")  # fmt: skip


def _source(url: str, streams: list[str], **kw: Any) -> RedisStreamSource:
    return RedisStreamSource(url, streams, SCHEMA, required=("key",), **kw)


def test_entry_ids_map_to_ordered_offsets() -> None:
    assert encode_id(b"1700000000000-5") == 1700000000000_000005
    assert decode_id(encode_id("12-999999") + 1) == "13-0"
    with pytest.raises(ValueError, match="sequence numbers"):
        encode_id("1-1000000")
    with pytest.raises(ValueError, match="start 'middle'"):
        RedisStreamSource("redis://x", ["s"], SCHEMA, start="middle")
    with pytest.raises(ValueError, match="names a stream twice"):
        RedisStreamSource("redis://x", ["s", "s"], SCHEMA)


def test_offsets_and_record_bound_are_in_the_snapshot(
    spark: Any, repo: Repository, redis_client: Any, redis_url: str
) -> None:
    a, b = _streams(redis_client, 2)
    ids_a = _publish(redis_client, a, _records(120))
    _publish(redis_client, b, _records(30, first=1000))
    source = _source(redis_url, [a, b], max_records_per_epoch=100, records_per_split=20)
    runner = EpochRunner(spark, _job(source), repo=repo, parallelism=2)
    first = runner.run_epoch()
    assert first is not None and first.records_in == 80  # 50 per stream, b has only 30
    offsets = repo.read_manifest(first.snapshot_id).offsets["redis"]
    stats = repo.read_manifest(first.snapshot_id).stats  # the autoscaler's backlog inputs
    assert stats["backlog_records"] == 70 and stats["backlog_epochs"] == 1
    assert offsets[a] == encode_id(ids_a[49]) + 1 and offsets[a + COUNT_SUFFIX] == 50
    assert offsets[b + COUNT_SUFFIX] == 30
    assert repo.read_manifest(first.snapshot_id).stats["splits"] == 5  # 50 = 20+20+10; 30 = 20+10
    results = runner.run()
    assert [r.records_in for r in results] == [50, 20]
    assert _totals(repo) == _expected(_records(120) + _records(30, first=1000))
    assert runner.run_epoch() is None and runner.stopped_reason == "no new data"
    _publish(redis_client, b, _records(3, first=5000))
    more = runner.run_epoch()
    assert more is not None and more.records_in == 3


def test_byte_bound(spark: Any, repo: Repository, redis_client: Any, redis_url: str) -> None:
    (a,) = _streams(redis_client, 1)
    records = _records(40)
    _publish(redis_client, a, records)
    size = len(json.dumps(records[0]))
    source = _source(redis_url, [a], max_records_per_epoch=None, max_bytes_per_epoch=10 * size)
    results = EpochRunner(spark, _job(source), repo=repo).run()
    assert all(8 <= r.records_in <= 10 for r in results[:-1]), [r.records_in for r in results]
    assert sum(r.records_in for r in results) == 40
    assert _totals(repo) == _expected(records)


def test_starting_positions(spark: Any, tmp_path: Any, redis_client: Any, redis_url: str) -> None:
    (a,) = _streams(redis_client, 1)
    early = [{"key": "old", "value": i} for i in range(5)]
    for i, r in enumerate(early):
        redis_client.xadd(a, {"data": json.dumps(r)}, id=f"{1000 + i}-0")
    late = [{"key": "new", "value": i} for i in range(4)]
    for i, r in enumerate(late):
        redis_client.xadd(a, {"data": json.dumps(r)}, id=f"{2000 + i}-0")

    def run(start: str, name: str) -> tuple[Repository, EpochRunner]:
        repo = Repository.open(f"file://{tmp_path}/store", name)
        runner = EpochRunner(spark, _job(_source(redis_url, [a], start=start)), repo=repo)
        runner.run()
        return repo, runner

    repo, _ = run("earliest", "earliest")
    assert _totals(repo) == _expected(early + late)
    repo, _ = run("timestamp:2001", "timestamp")
    assert _totals(repo) == _expected(late[1:])
    repo, _ = run("offset:1003-0", "offset")
    assert _totals(repo) == _expected(early[3:] + late)
    repo, runner = run("latest", "latest")
    head = repo.read_manifest(repo.resolve("main"))
    assert head.epoch == 1 and head.stats["records_in"] == 0  # the start position is committed
    assert head.offsets["redis"][a] == encode_id("2003-0") + 1
    redis_client.xadd(a, {"data": json.dumps({"key": "newest", "value": 7})}, id="3000-0")
    runner.run()
    assert _totals(repo) == {"newest": (1, 7)}


def test_retention_that_deleted_unread_entries_stops_the_job(
    spark: Any, repo: Repository, redis_client: Any, redis_url: str
) -> None:
    (a,) = _streams(redis_client, 1)
    _publish(redis_client, a, _records(30))
    source = _source(redis_url, [a], max_records_per_epoch=10)
    runner = EpochRunner(spark, _job(source), repo=repo)
    first = runner.run_epoch()
    assert first is not None and first.records_in == 10
    offsets = repo.read_manifest(first.snapshot_id).offsets["redis"]
    assert source.retained(offsets) is None
    redis_client.xtrim(a, maxlen=12, approximate=False)  # deletes 10 read and 8 unread entries
    problem = source.retained(offsets)
    assert problem is not None
    assert "retention deleted 8 entries the snapshot had not read" in problem
    with pytest.raises(SourceDataLostError, match=r"deleted 8 entries.*the job stops"):
        runner.run_epoch()
    assert repo.read_manifest(repo.resolve("main")).epoch == 1  # nothing committed
    # A fork that starts over at the oldest entry left is the way on; trimming read entries
    # alone is no loss.
    fork = EpochRunner(spark, _job(_source(redis_url, [a])), repo=repo, branch="fresh")
    fork.run()
    redis_client.xtrim(a, maxlen=3, approximate=False)
    assert source.retained(repo.read_manifest(repo.resolve("fresh")).offsets["redis"]) is None
    # XDEL of an entry not read yet is a loss too.
    new = _publish(redis_client, a, _records(2, first=100))
    redis_client.xdel(a, new[0])
    with pytest.raises(SourceDataLostError, match=r"was deleted \(XDEL\)"):
        fork.run_epoch()


def test_malformed_entries_become_dead_letters(
    spark: Any, repo: Repository, redis_client: Any, redis_url: str
) -> None:
    (a,) = _streams(redis_client, 1)
    good = redis_client.xadd(a, {"data": json.dumps({"key": "a", "value": 1})})
    bad_json = redis_client.xadd(a, {"data": b"{not json"})
    no_key = redis_client.xadd(a, {"data": json.dumps({"value": 2})})
    no_field = redis_client.xadd(a, {"other": b"x"})
    runner = EpochRunner(spark, _job(_source(redis_url, [a])), repo=repo)
    result = runner.run_epoch()
    assert result is not None and result.records_in == 4 and result.dead_letters == 3
    dead = read_dead_letters(repo, "main").to_pandas().sort_values("offset")
    assert list(dead["offset"]) == [encode_id(i) for i in (bad_json, no_key, no_field)]
    assert "missing field 'key'" in dead["reason"].iloc[1]
    assert "no field 'data'" in dead["reason"].iloc[2]
    assert _totals(repo) == {"a": (1, 1)} and good


def test_fork_and_rollback_resume_where_the_snapshot_stopped(
    spark: Any, repo: Repository, redis_client: Any, redis_url: str
) -> None:
    a, b = _streams(redis_client, 2)
    records = _records(60)
    _publish(redis_client, a, records[:30])
    _publish(redis_client, b, records[30:])
    source = _source(redis_url, [a, b], max_records_per_epoch=20)
    runner = EpochRunner(spark, _job(source), repo=repo, parallelism=2)
    results = runner.run()
    assert len(results) == 3
    expected = _expected(records)
    assert _totals(repo) == expected
    first = results[0].snapshot_id
    # fork from epoch 1 at another parallelism: reads exactly what epoch 1 had not read
    EpochRunner(spark, _job(source), repo=repo, branch="fork", base=first, parallelism=3).run()
    assert _totals(repo, "fork") == expected
    # roll main back to epoch 1; the engine resumes from the rollback commit's offsets
    head = repo.resolve("main")
    new_branch_commit(repo, first, "main", kind="rollback", operation_id=None,
                      provenance={"reason": "test"}, expected_head=head)  # fmt: skip
    again = EpochRunner(spark, _job(source), repo=repo, parallelism=1).run()
    assert sum(r.records_in for r in again) == 40
    assert _totals(repo) == expected


def test_job_entry_point_stops_with_status_3_saying_what_was_lost(
    spark: Any,
    tmp_path: Any,
    redis_client: Any,
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tests.engine.crash_harness import run_job
    from tests.engine.jobs import STREAM_ENV, stream_job

    (a,) = _streams(redis_client, 1)
    _publish(redis_client, a, _records(1000))
    spec = f"redis:{redis_url}|{a}"
    monkeypatch.setenv(STREAM_ENV, spec)
    store = f"file://{tmp_path}/store"
    first = EpochRunner(spark, stream_job(), repo=Repository.open(store, "lost")).run_epoch()
    assert first is not None and first.records_in == 400
    redis_client.xtrim(a, maxlen=100, approximate=False)  # 400 read and 500 unread entries go
    run = run_job(store=store, namespace="lost", data="", job="stream-job",
                  extra_env={STREAM_ENV: spec})  # fmt: skip
    assert run.returncode == 3, run.events
    last = run.events[-1]
    assert last["event"] == "stopped" and str(last["reason"]).startswith("data lost: ")
    assert "retention deleted 500 entries the snapshot had not read" in str(last["reason"])
    assert run.committed == [] and run.head_epoch == 1
