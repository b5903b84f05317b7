"""Branch outputs as sources (docs/webs.md): a downstream epoch reads exactly the
records of the upstream commits it maps to; nothing uncommitted, nothing twice; racing
commits leave one mapping; an upstream crash stalls the downstream, which resumes without
duplicates; an upstream rollback invalidates the mapping after the rollback point and the
downstream re-derives it."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest

from runners.engine import EngineError, EpochContext, EpochRunner, Job, KeyedState, read_output
from runners.engine import aggregations as agg
from runners.engine.branch_source import (
    BranchOutputSource,
    UpstreamRewoundError,
    epoch_mapping,
    rewind,
    rewind_point,
    upstream_epoch_at,
    upstream_epochs,
)
from runners.engine.state_ops import new_branch_commit
from snapshots_store import Repository
from tests.engine.jobs import aggregate_job

pytestmark = pytest.mark.spark

_ids = itertools.count()
COLUMNS = ["key", "count", "sum_value", "max_value", "min_value", "last_value"]


def echo(
    key: Any, records: list[dict[str, Any]], state: KeyedState, ctx: EpochContext
) -> Iterable[dict[str, Any]]:
    """Emit every input record unchanged (the downstream's output is its per-epoch input)."""
    seen = state.value("n")
    seen.set(seen.get(0) + len(records))
    yield from records


def downstream_job(source: BranchOutputSource) -> Job:
    return Job(name="echo", source=source, key="key", process=echo, time_mode="logical")


def _rows(table: pa.Table) -> list[tuple[Any, ...]]:
    """The multiset of rows (as sorted tuples over COLUMNS)."""
    frame = table.to_pandas()[COLUMNS]
    return sorted(map(tuple, frame.itertuples(index=False)))


def _by_epoch(table: pa.Table) -> dict[int, list[tuple[Any, ...]]]:
    frame = table.to_pandas()
    return {
        int(e): _rows(pa.Table.from_pandas(g.reset_index(drop=True)))
        for e, g in frame.groupby("_epoch")
    }


@pytest.fixture
def web(tmp_path: Path, epochs_dir: str) -> dict[str, Any]:
    url = f"file://{tmp_path}/store"
    n = next(_ids)
    up = Repository.open(url, f"up{n}")
    down = Repository.open(url, f"down{n}")
    source = BranchOutputSource(url, f"up{n}", "main")
    return {"url": url, "up": up, "down": down, "source": source, "dir": epochs_dir}


def test_each_downstream_epoch_reads_exactly_its_upstream_epochs(
    spark: Any, web: dict[str, Any]
) -> None:
    up, down, source = web["up"], web["down"], web["source"]
    upstream = EpochRunner(spark, aggregate_job(web["dir"]), repo=up, parallelism=2)
    assert len(upstream.run(max_epochs=3)) == 3
    one_by_one = BranchOutputSource(web["url"], source.namespace, "main", max_epochs_per_epoch=1)
    downstream = EpochRunner(spark, downstream_job(one_by_one), repo=down, parallelism=2)
    assert [r.epoch for r in downstream.run()] == [1, 2, 3]
    # per-epoch input multiset == the upstream epoch's output multiset
    up_out, down_out = _by_epoch(read_output(up, "main")), _by_epoch(read_output(down, "main"))
    assert down_out == up_out
    # three more upstream epochs: one downstream epoch reads all of them (unbounded source)
    assert len(upstream.run()) == 3
    catch_up = EpochRunner(spark, downstream_job(source), repo=down, parallelism=3)
    results = catch_up.run()
    assert [r.epoch for r in results] == [4]
    assert _rows(read_output(down, "main")) == _rows(read_output(up, "main"))
    # the mapping, recorded in each manifest, read back as the lineage
    ups = upstream_epochs(up, "main")
    mapping = epoch_mapping(down, "main")
    assert [(m.epoch, m.upstream_epochs) for m in mapping] == [
        (1, (1,)),
        (2, (2,)),
        (3, (3,)),
        (4, (4, 5, 6)),
    ]
    assert mapping[3].upstream_snapshots == tuple(e.snapshot_id for e in ups[3:])
    assert mapping[0].namespace == source.namespace and mapping[0].branch == "main"
    head = down.read_manifest(down.resolve("main"))
    assert head.offsets["upstream"]["epoch"] == 6
    assert upstream_epoch_at(down, "main", 2, "upstream") == 2
    assert upstream_epoch_at(down, "main", 4, "upstream") == 6
    # nothing twice: a further run finds nothing new
    assert catch_up.run_epoch() is None and catch_up.stopped_reason == "no new data"
    assert source.retained(dict(head.offsets["upstream"])) is None


def test_uncommitted_upstream_epochs_are_never_read(
    spark: Any, web: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    up, down, source = web["up"], web["down"], web["source"]
    upstream = EpochRunner(spark, aggregate_job(web["dir"]), repo=up, parallelism=2)
    upstream.run(max_epochs=1)
    # epoch 2 writes chunks, outputs and its manifest, then dies before the CAS
    monkeypatch.setattr(up, "commit", lambda *a, **k: (_ for _ in ()).throw(OSError("killed")))
    with pytest.raises(OSError, match="killed"):
        upstream.run_epoch()
    monkeypatch.undo()
    downstream = EpochRunner(spark, downstream_job(source), repo=down, parallelism=2)
    assert [r.epoch for r in downstream.run()] == [1]
    assert _rows(read_output(down, "main")) == _rows(read_output(up, "main"))
    # the upstream stalls, then resumes: the downstream stalls, then resumes, no duplicates
    assert downstream.run_epoch() is None and downstream.stopped_reason == "no new data"
    EpochRunner(spark, aggregate_job(web["dir"]), repo=up, parallelism=2).run(max_epochs=2)
    assert [r.epoch for r in downstream.run()] == [2]
    assert _rows(read_output(down, "main")) == _rows(read_output(up, "main"))
    assert [m.upstream_epochs for m in epoch_mapping(down, "main")] == [(1,), (2, 3)]


def test_racing_downstream_commits_leave_one_mapping(spark: Any, web: dict[str, Any]) -> None:
    up, down, source = web["up"], web["down"], web["source"]
    EpochRunner(spark, aggregate_job(web["dir"]), repo=up, parallelism=2).run(max_epochs=2)
    a = EpochRunner(spark, downstream_job(source), repo=down, parallelism=2)
    b = EpochRunner(spark, downstream_job(source), repo=down, parallelism=1)
    stale = b._parent()  # b planned from the same (empty) parent …
    assert a.run_epoch() is not None  # … but a committed first
    b._parent = lambda: stale  # type: ignore[method-assign]
    with pytest.raises(EngineError, match="moved"):
        b.run_epoch()
    mapping = epoch_mapping(down, "main")
    assert [(m.epoch, m.upstream_epochs) for m in mapping] == [(1, (1, 2))]
    assert _rows(read_output(down, "main")) == _rows(read_output(up, "main"))


def test_upstream_rollback_invalidates_and_rederives_the_mapping(
    spark: Any, web: dict[str, Any]
) -> None:
    up, down, source = web["up"], web["down"], web["source"]
    upstream = EpochRunner(spark, aggregate_job(web["dir"]), repo=up, parallelism=2)
    upstream.run(max_epochs=4)
    one = BranchOutputSource(web["url"], source.namespace, "main", max_epochs_per_epoch=1)
    downstream = EpochRunner(spark, downstream_job(one), repo=down, parallelism=2)
    assert len(downstream.run()) == 4
    before = {m.epoch: m.upstream_snapshots for m in epoch_mapping(down, "main")}
    # the upstream rolls back to epoch 2 and re-runs epochs 3.. on other input
    head = up.resolve("main")
    new_branch_commit(
        up, "main~2", "main", kind="rollback", operation_id="op-up-rb",
        provenance={"reason": "test"}, expected_head=head,
    )  # fmt: skip
    # the same job resumes from the rollback commit: epochs 3.. again, as new commits
    EpochRunner(spark, aggregate_job(web["dir"]), repo=up, parallelism=3).run(max_epochs=3)
    assert [e.epoch for e in upstream_epochs(up, "main")] == [1, 2, 3, 4, 5]
    # the downstream sees it and refuses to read a different history
    with pytest.raises(UpstreamRewoundError, match="rolled back"):
        downstream.run_epoch()
    offsets = down.read_manifest(down.resolve("main")).offsets["upstream"]
    assert one.retained(dict(offsets)) is not None
    point = rewind_point(down, "main", one)
    assert point is not None and down.read_manifest(point).epoch == 2
    new_head = rewind(down, "main", one, operation_id="op-down-rb")
    assert new_head is not None and down.read_manifest(new_head).kind == "rollback"
    assert rewind(down, "main", one) is None  # idempotent: nothing left to invalidate
    assert [r.epoch for r in downstream.run()] == [3, 4, 5]
    after = {m.epoch: m.upstream_snapshots for m in epoch_mapping(down, "main")}
    assert after[1] == before[1] and after[2] == before[2]
    ups = upstream_epochs(up, "main")
    assert [after[e] for e in (3, 4, 5)] == [(u.snapshot_id,) for u in ups[2:]]
    assert not set(after[3] + after[4]) & set(before[3] + before[4])
    assert _by_epoch(read_output(down, "main")) == _by_epoch(read_output(up, "main"))


def test_aggregating_downstream_equals_a_same_process_computation(
    spark: Any, web: dict[str, Any]
) -> None:
    """A downstream aggregation over the upstream's output equals pandas over it."""
    up, down, source = web["up"], web["down"], web["source"]
    EpochRunner(spark, aggregate_job(web["dir"]), repo=up, parallelism=2).run(max_epochs=3)
    job = Job(
        name="totals",
        source=source,
        key="key",
        aggregate=[agg.count(), agg.sum("count")],
        time_mode="logical",
    )
    EpochRunner(spark, job, repo=down, parallelism=2).run()
    got = read_output(down, "main").to_pandas().set_index("key").sort_index()
    frame = read_output(up, "main").to_pandas()
    ref = frame.groupby("key").agg(count=("count", "size"), sum_count=("count", "sum"))
    pd.testing.assert_frame_equal(
        got[["count", "sum_count"]], ref.sort_index(), check_dtype=False, check_names=False
    )


def test_upstream_epochs_without_records_are_read_as_empty_tables(
    spark: Any, tmp_path: Path
) -> None:
    """The clickstream example closes no session in its first epoch: the downstream reads it
    as an empty table with the declared columns (no dead letters), then the rest."""
    from runners.engine import read_dead_letters
    from runners.jobs import clickstream, web_totals

    data = str(tmp_path / "clicks")
    clickstream.generate(data, files=6, clicks=120, users=12)
    url = f"file://{tmp_path}/store"
    up, down = Repository.open(url, "clicks"), Repository.open(url, "totals")
    EpochRunner(spark, clickstream.job(data), repo=up, parallelism=2).run()
    assert read_output(up, "main").to_pandas()["_epoch"].min() > 1  # epoch 1: no records
    job = web_totals.job(url, "clicks")
    job.source.max_epochs_per_epoch = 1  # type: ignore[attr-defined]
    assert [r.epoch for r in EpochRunner(spark, job, repo=down, parallelism=2).run()] == [
        *range(1, 7)
    ]
    assert read_dead_letters(down, "main").num_rows == 0
    sessions = read_output(up, "main").to_pandas()
    totals = read_output(down, "main").to_pandas().groupby("user").last()
    expected = sessions.groupby("user")["clicks"].agg(["size", "sum"])
    assert totals["count"].to_dict() == expected["size"].to_dict()
    assert totals["sum_clicks"].to_dict() == expected["sum"].to_dict()
