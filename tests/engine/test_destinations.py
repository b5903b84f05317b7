"""Delta Lake and PostgreSQL sinks in-process against the real things: a job's branch lands in
the destinations exactly once, the config is refused with the sink and the field named, a
rollback makes the destinations go back, a fork refuses its parent's table."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from runners.engine import EpochRunner
from runners.engine.destinations import build
from runners.engine.sink_catchup import SinkRefused
from runners.engine.sinks import EpochOutput, OutputPart
from snapshots_store import Repository
from tests.engine.destination_checks import (
    chain_output,
    database_url,
    delta_rows,
    latest_per_key,
    postgres_rows,
    unique_table,
)
from tests.engine.jobs import aggregate_job, write_epochs

pytestmark = [pytest.mark.spark, pytest.mark.services]


def _sinks(tmp_path: Path, sink_tables: list[str]) -> list[Any]:
    append, upsert = unique_table("sink_append"), unique_table("sink_upsert")
    sink_tables += [append, upsert]
    return [
        build("lake", "delta", {"path": str(tmp_path / "lake"), "partition_by": ["_epoch"]}),
        build("rows", "postgres", {"url": database_url(), "table": append}),
        build("latest", "postgres", {"url": database_url(), "table": upsert, "mode": "upsert"}),
    ]


def test_delta_and_postgres_hold_the_branch_output_once(
    spark: Any, tmp_path: Path, sink_tables: list[str]
) -> None:
    data = tmp_path / "data"
    write_epochs(str(data), files=3, keys=40, records=300)
    lake, rows, latest = _sinks(tmp_path, sink_tables)
    job = dataclasses.replace(aggregate_job(str(data)), sinks=[lake, rows, latest])
    repo = Repository.open(f"file://{tmp_path}/store", "sinks")
    results = EpochRunner(spark, job, repo=repo, parallelism=2).run()
    assert len(results) == 3
    expected = chain_output(repo)
    assert len(expected) > 40
    assert delta_rows(lake.path).equals(expected)
    assert postgres_rows(rows.table).equals(expected)
    assert postgres_rows(latest.table).equals(latest_per_key(expected))
    head = repo.read_manifest(repo.resolve("main"))
    assert head.stats["sink_lag_epochs"] == 0
    assert all(head.stats[f"sink_lag_epochs.{s.name}"] == 0 for s in (lake, rows, latest))
    assert head.extra["sinks"]["lake"]["staged"]["destination"] == lake.path
    # what the lineage index keeps of it: each chain sink held the chain up to the parent
    from controlplane.lineage.sink_facts import sink_facts

    facts = sink_facts(head)
    assert {f["role"] for f in facts.values()} == {"chain"}
    assert {f["held"] for f in facts.values()} == {head.epoch - 1}
    # a second commit of a held epoch changes nothing (the destination's own marks)
    chain = list(repo.log("heads/main", first_parent=True))
    from runners.engine.sink_catchup import ChainEpoch, epoch_output

    sid, manifest = chain[0]
    again = epoch_output(repo, "sinks", ChainEpoch(manifest.epoch, sid, manifest))
    pending = lake.prepare(again)
    lake.commit(again, pending)
    rows.commit(again, rows.prepare(again))
    assert delta_rows(lake.path).equals(expected)
    assert postgres_rows(rows.table).equals(expected)

    # rollback to epoch 1: the destinations go back, then the job goes on from there
    first = chain[-1][0]
    from snapshots_store import Manifest

    target = repo.read_manifest(first)
    rolled = dataclasses.replace(target, parents=(first,), kind="rollback", outputs=[],
                                 stats={}, extra={})  # fmt: skip
    repo.write_manifest(rolled)
    repo.commit(rolled, "main", expected_head=sid, reason="test rollback")
    assert isinstance(rolled, Manifest)
    runner = EpochRunner(spark, job, repo=repo, parallelism=3)
    runner.follower.follow(repo.resolve("main"), force=True)  # what a restart does first
    expected = chain_output(repo)
    assert set(expected["_epoch"]) == {1}
    assert delta_rows(lake.path).equals(expected)
    assert postgres_rows(rows.table).equals(expected)
    assert postgres_rows(latest.table).equals(latest_per_key(expected))
    # the job goes on from epoch 1 at another parallelism: epochs 2 and 3 again, once
    assert len(runner.run()) == 2
    expected = chain_output(repo)
    assert sorted(set(expected["_epoch"])) == [1, 2, 3]
    assert delta_rows(lake.path).equals(expected)
    assert postgres_rows(rows.table).equals(expected)
    assert postgres_rows(latest.table).equals(latest_per_key(expected))


def test_a_fork_never_writes_into_its_parents_destination(
    spark: Any, tmp_path: Path, sink_tables: list[str]
) -> None:
    data = tmp_path / "data"
    write_epochs(str(data), files=1, keys=10, records=50)
    lake, rows, _ = _sinks(tmp_path, sink_tables)
    job = dataclasses.replace(aggregate_job(str(data)), sinks=[lake, rows])
    repo = Repository.open(f"file://{tmp_path}/store", "sinks")
    EpochRunner(spark, job, repo=repo, parallelism=1).run()
    sid = repo.resolve("main")
    forked = dataclasses.replace(repo.read_manifest(sid), branch="fork", parents=(sid,),
                                 kind="fork", outputs=[], stats={}, extra={})  # fmt: skip
    repo.write_manifest(forked)
    repo.commit(forked, "fork", expected_head=None, reason="test fork")
    fork = EpochRunner(spark, job, repo=repo, branch="fork", parallelism=1)
    with pytest.raises(
        SinkRefused, match=r"sink .lake.: path: .* is written by epochal/sinks/main"
    ):
        fork.run_epoch()


@pytest.mark.parametrize(
    ("kind", "config", "message"),
    [
        ("delta", {}, "sink 's': path: required"),
        ("delta", {"path": "rel/dir"}, "sink 's': path: 'rel/dir' is relative"),
        ("delta", {"path": "/x", "schema_evolution": "yes"}, "sink 's': schema_evolution"),
        ("delta", {"path": "/x", "partition_by": [1]}, "sink 's': partition_by"),
        (
            "delta",
            {"path": "/x", "storage_options": {"AWS_SECRET_ACCESS_KEY": "k"}},
            "sink 's': storage_options: no secrets",
        ),
        ("postgres", {"url": "postgresql://u:pw@h/db", "table": "t"}, "sink 's': url: no password"),
        ("postgres", {"url": "postgresql://h/db", "table": "a;b"}, "sink 's': table"),
        ("postgres", {"url": "postgresql://h/db", "table": "t", "mode": "merge"}, "sink 's': mode"),
        ("postgres", {"url": "postgresql://h/db", "table": "t", "extra": 1}, "sink 's': extra"),
        ("iceberg-x", {}, "sink 's': kind"),
    ],
)
def test_bad_config_names_the_sink_and_the_field(
    kind: str, config: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        build("s", kind, config)


def test_a_table_that_refuses_the_output_stops_the_job_naming_the_sink_and_field(
    spark: Any, tmp_path: Path, sink_tables: list[str]
) -> None:
    import psycopg

    data = tmp_path / "data"
    write_epochs(str(data), files=1, keys=10, records=50)
    table = unique_table("narrow")
    sink_tables.append(table)
    with psycopg.connect(database_url(), autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (key text, _epoch bigint)")
    rows = build("rows", "postgres", {"url": database_url(), "table": table, "create": False})
    job = dataclasses.replace(aggregate_job(str(data)), sinks=[rows])
    repo = Repository.open(f"file://{tmp_path}/store", "narrow")
    with pytest.raises(SinkRefused, match=f"sink 'rows': table: {table} has no column 'count'"):
        EpochRunner(spark, job, repo=repo, parallelism=1).run()
    assert postgres_rows(table).empty  # nothing half-written


@dataclasses.dataclass(frozen=True)
class _Rows(EpochOutput):
    """An epoch's output given as a table (the destination's side alone, no Spark job)."""

    rows: pa.Table | None = None

    def tables(self, part: OutputPart) -> Iterator[pa.Table]:
        assert self.rows is not None
        yield self.rows


def _epoch(epoch: int, table: pa.Table) -> EpochOutput:
    part = OutputPart(0, 127, ())
    repo = Repository.open("file:///nonexistent-unused", "ns")
    return _Rows(repo, "ns", "main", epoch, ("key",), (part,), f"s{epoch}", rows=table)


def test_a_delta_table_refuses_a_schema_it_lacks_unless_it_evolves(tmp_path: Path) -> None:
    first = pa.table({"key": ["a"], "n": [1]})
    wider = pa.table({"key": ["b"], "n": [2], "extra": ["x"]})
    strict = build("lake", "delta", {"path": str(tmp_path / "strict")})
    strict.write("w", _epoch(1, first))
    with pytest.raises(SinkRefused, match=r"sink .lake.: schema_evolution: .* refuses epoch 2"):
        strict.write("w", _epoch(2, wider))
    assert strict.held("w").epoch == 1  # nothing of epoch 2
    merging = build("lake", "delta", {"path": str(tmp_path / "merge"), "schema_evolution": "merge"})
    merging.write("w", _epoch(1, first))
    merging.write("w", _epoch(2, wider))
    merging.write("w", _epoch(2, wider))  # a retry: held already
    rows = delta_rows(merging.path)
    assert list(rows["key"]) == ["a", "b"] and list(rows["extra"].fillna("-")) == ["-", "x"]
