"""Rollback with each destination, and a downstream job reading the output streams.

After three epochs the branch is rolled back to epoch 1: the Iceberg table goes back with it
when the job goes on (the sink finds epoch 2 held from the abandoned snapshot and commits one
overwrite snapshot removing epochs 2 and 3), the logs refuse to unpublish. Once the
operator confirmed (the store's branch moved back), the job goes on with another epoch size:
the table equals the new first-parent chain's output, and the logs hold the abandoned epochs
followed by the new ones under ids of the next generation, so a downstream job reading each
stream gets every published record once."""

from __future__ import annotations

from typing import Any

import pytest

from runners.engine import EpochRunner, Job, sources
from runners.engine import aggregations as agg
from runners.engine.destinations import build
from runners.engine.destinations.iceberg import EPOCH, EPOCH_COLUMN, ROLLBACK, SNAPSHOT
from runners.engine.destinations.log_records import SLOT, CannotUnpublishError
from runners.engine.rabbitmq_stream import RabbitMQStreamSource
from runners.engine.redis_stream import RedisStreamSource, encode_id
from runners.engine.sinks import SINKS, Held
from snapshots_store import Repository
from tests.engine.destinations.support import contents
from tests.engine.jobs import aggregate_job
from tests.engine.test_kafka_sink import output_by_epoch

pytestmark = [pytest.mark.spark, pytest.mark.services]


def test_rollback_takes_the_table_back_and_logs_publish_the_new_line_after_the_old(
    spark: Any, tmp_path: Any, epochs_dir: str, destinations: list[dict[str, Any]]
) -> None:
    repo = Repository.open(f"file://{tmp_path}/store", "rollback")
    sinks = [build(s["name"], s["kind"], s["config"]) for s in destinations]
    runner = EpochRunner(spark, aggregate_job(epochs_dir, sinks=sinks), repo=repo)
    assert len(runner.run(max_epochs=3)) == 3
    old = output_by_epoch(repo)
    chain = dict((m.epoch, sid) for sid, m in repo.log("heads/main", first_parent=True))
    iceberg, redis_sink, rabbit = sinks
    staged = repo.read_manifest(chain[1]).extra[SINKS]["iceberg"]["staged"]

    assert iceberg.committed(staged) == Held(3, chain[3])
    for log in (redis_sink, rabbit):
        with pytest.raises(CannotUnpublishError, match="epochs after 1 stay in the log"):
            log.rollback_to(1, namespace="rollback", branch="main")
    for sink in sinks:
        sink.close()

    # confirmed: the branch goes back to epoch 1 and the job goes on, two files per epoch
    repo.cas_ref("heads/main", chain[3], chain[1], reason="rollback to epoch 1")
    sinks = [build(s["name"], s["kind"], s["config"]) for s in destinations]
    source = sources.ParquetDirectory(epochs_dir, max_files_per_epoch=2, rows_per_split=700)
    job = aggregate_job(epochs_dir, source=source, sinks=sinks)
    assert len(EpochRunner(spark, job, repo=repo).run()) == 3  # epochs 2 to 4: files 2 to 6
    new = output_by_epoch(repo)
    assert new[1] == old[1] and new[2] != old[2]
    iceberg, redis_sink, rabbit = sinks
    # the table went back by itself (the sink found epoch 2 held from the abandoned snapshot)
    assert contents(iceberg) == new  # the table is the branch's first-parent chain
    # its history keeps the rollback: one overwrite snapshot naming epoch 1 of the chain again,
    # as of which the table held epoch 1 alone (time travel still reads the abandoned epochs)
    table = iceberg.load()
    marks = [s for s in table.snapshots() if s.summary and s.summary.get(ROLLBACK) == "true"]
    assert [(m.summary.get(EPOCH), m.summary.get(SNAPSHOT)) for m in marks] == [("1", chain[1])]
    at_rollback = table.scan(snapshot_id=marks[0].snapshot_id).to_arrow()
    assert set(at_rollback.column(EPOCH_COLUMN).to_pylist()) == {1}
    before = table.scan(snapshot_id=marks[0].parent_snapshot_id).to_arrow()
    assert set(before.column(EPOCH_COLUMN).to_pylist()) == {1, 2, 3}
    head = repo.read_manifest(repo.resolve("main"))
    assert {name: head.extra[SINKS][name]["staged"].get("generation") for name in
            ("redis", "rabbitmq")} == {"redis": 2, "rabbitmq": 2}  # fmt: skip
    published = {e: sorted(old.get(e, []) + (new[e] if e > 1 else [])) for e in new}
    for log in (redis_sink, rabbit):
        assert contents(log) == published, log.name  # old epochs 2-3 stay, new ones follow
    ids = [encode_id(i) for i, _ in redis_sink.redis().xrange(redis_sink.stream, "-", "+")]
    assert ids == sorted(ids) and ids[-1] // SLOT == 2 + 4  # generation 2, epoch 4

    # a downstream job reading each stream gets every published record once
    rows = sum(len(r) for r in published.values())
    schema = {"key": "string", "count": "int64"}
    for name, log, stream in (
        ("redis", redis_sink, RedisStreamSource(redis_sink.url, [redis_sink.stream], schema)),
        ("rabbitmq", rabbit, RabbitMQStreamSource(rabbit.url, [rabbit.stream], schema)),
    ):
        downstream = Job(name=f"downstream-{name}", source=stream, key="key",
                         aggregate=[agg.count()])  # fmt: skip
        down = Repository.open(f"file://{tmp_path}/downstream", name)
        results = EpochRunner(spark, downstream, repo=down).run()
        assert sum(r.records_in for r in results) == rows, name
        log.close()
    iceberg.close()
