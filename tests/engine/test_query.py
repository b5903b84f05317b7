"""Queryable state at any epoch (docs/webs.md): a query at a committed epoch
always returns the same answer; an epoch not committed yet is "pending" (after waiting),
never partial; a cross-job query at "my epoch m" reflects exactly the mapped upstream epoch."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from runners.engine import EpochRunner, Job
from runners.engine.branch_source import BranchOutputSource, epoch_mapping
from runners.engine.keygroups import key_group_of
from runners.engine.query import (
    StateQueryError,
    epoch_snapshot,
    state_as_of,
    state_at,
    state_at_epoch,
)
from snapshots_store import Repository
from tests.engine.jobs import aggregate_job, running_total
from tests.engine.test_branch_source import downstream_job

pytestmark = pytest.mark.spark


def _reference(directory: str, epochs: int, key: str) -> dict[str, int]:
    values: list[int] = []
    for i in range(epochs):
        frame = pq.read_table(f"{directory}/part-{i:05d}.parquet").to_pandas()
        values.extend(frame[frame["key"] == key]["value"].tolist())
    return {"count": len(values), "sum_value": sum(values), "max_value": max(values)}


def test_a_committed_epoch_always_gives_the_same_answer(
    spark: Any, repo: Repository, epochs_dir: str
) -> None:
    runner = EpochRunner(spark, aggregate_job(epochs_dir), repo=repo, parallelism=2)
    runner.run(max_epochs=2)
    first = state_at_epoch(repo, "main", 2, key="key-7")
    assert first.status == "ok" and first.epoch == 2 and len(first.rows) == 1
    row = first.rows[0]
    assert {k: row[k] for k in ("count", "sum_value", "max_value")} == _reference(
        epochs_dir, 2, "key-7"
    )
    assert first.key_groups == [key_group_of("key-7", 128)]
    # an epoch not committed yet: pending after the timeout, never partial state
    pending = state_at_epoch(repo, "main", 3, key="key-7", timeout=0.3)
    assert pending.status == "pending" and not pending.rows and "epoch 2" in pending.detail
    # … and a waiting query gets the answer once the epoch commits
    got: list[Any] = []
    waiter = threading.Thread(
        target=lambda: got.append(state_at_epoch(repo, "main", 3, key="key-7", timeout=60))
    )
    waiter.start()
    runner.run(max_epochs=2)
    waiter.join(timeout=60)
    assert got and got[0].status == "ok" and got[0].epoch == 3
    # epoch 2 again, after later epochs, by snapshot id and from a cold cache: the same
    again = state_at_epoch(repo, "main", 2, key="key-7")
    assert again.to_dict() == first.to_dict()
    from runners.engine.state import memory_cache

    memory_cache.cache_clear()
    by_id = state_at(repo, epoch_snapshot(repo, "main", 2) or "", key="key-7", branch="main")
    assert by_id.to_dict() == first.to_dict()
    assert state_at_epoch(repo, "main", 2, key="no-such-key").rows == []


def test_key_group_pages_and_key_ranges(spark: Any, repo: Repository, epochs_dir: str) -> None:
    EpochRunner(spark, aggregate_job(epochs_dir), repo=repo, parallelism=2).run(max_epochs=1)
    kg = key_group_of("key-7", 128)
    pages, cursor = [], None
    while True:
        page = state_at(repo, "main", key_group=kg, limit=2, cursor=cursor)
        pages.extend(page.rows)
        cursor = page.next_cursor
        if cursor is None:
            break
    keys = [r["key"] for r in pages]
    assert "key-7" in keys and keys == sorted(keys)
    assert all(key_group_of(k, 128) == kg for k in keys)
    # a key range, paged across key groups
    seen: list[str] = []
    cursor = None
    while True:
        page = state_at(repo, "main", key_from="key-10", key_to="key-13", limit=5, cursor=cursor)
        seen.extend(r["key"] for r in page.rows)
        cursor = page.next_cursor
        if cursor is None:
            break
    frame = pq.read_table(f"{epochs_dir}/part-00000.parquet").to_pandas()
    expected = sorted(k for k in set(frame["key"]) if "key-10" <= k < "key-13")
    assert sorted(seen) == expected and len(seen) == len(set(seen))
    with pytest.raises(StateQueryError, match="key group"):
        state_at(repo, "main", key_group=999)
    summary = state_at(repo, "main")
    assert summary.rows == [] and kg in summary.key_groups and summary.epoch == 1


def test_per_key_function_state_is_decoded(spark: Any, repo: Repository, epochs_dir: str) -> None:
    job = aggregate_job(epochs_dir, aggregate=None, process=running_total)
    EpochRunner(spark, job, repo=repo, parallelism=2).run(max_epochs=2)
    answer = state_at_epoch(repo, "main", 2, key="key-7")
    state = answer.rows[0]["state"]
    ref = _reference(epochs_dir, 2, "key-7")
    assert state == {"count": ref["count"], "sum": ref["sum_value"], "max": ref["max_value"]}


def test_cross_job_query_as_of_my_epoch(spark: Any, tmp_path: Path, epochs_dir: str) -> None:
    url = f"file://{tmp_path}/store"
    up, down = Repository.open(url, "up"), Repository.open(url, "down")
    upstream = EpochRunner(spark, aggregate_job(epochs_dir), repo=up, parallelism=2)
    upstream.run(max_epochs=1)
    source = BranchOutputSource(url, "up", "main")
    job: Job = downstream_job(source)
    downstream = EpochRunner(spark, job, repo=down, parallelism=2)
    downstream.run()  # downstream epoch 1 = upstream epoch 1
    upstream.run(max_epochs=2)
    downstream.run()  # downstream epoch 2 = upstream epochs 2, 3
    assert [m.upstream_epochs for m in epoch_mapping(down, "main")] == [(1,), (2, 3)]
    for mine, theirs in ((1, 1), (2, 3)):
        answer = state_as_of(
            up, "main", caller=down, caller_branch="main", caller_epoch=mine, key="key-7"
        )
        assert answer.epoch == theirs
        assert answer.to_dict() == state_at_epoch(up, "main", theirs, key="key-7").to_dict()
    pending = state_as_of(
        up, "main", caller=down, caller_branch="main", caller_epoch=3, key="key-7", timeout=0.2
    )
    assert pending.status == "pending"
