"""Fan-in (docs/webs.md): a job reading two upstream jobs that commit at different rates
commits each epoch over aligned upstream commits — the merged marker — reads every upstream
epoch exactly once and waits for the slower upstream instead of running ahead of it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runners.engine import EpochRunner, Job
from runners.engine import aggregations as agg
from runners.engine.branch_source import BranchOutputSource
from runners.engine.fan_in import FanInSource, flatten_inputs
from snapshots_store import Repository
from tests.engine.jobs import aggregate_job, write_epochs

pytestmark = pytest.mark.spark


def fan_in_job(store: str) -> Job:
    source = FanInSource(
        [BranchOutputSource(store, "fast", "main", name="fast"),
         BranchOutputSource(store, "slow", "main", name="slow")]
    )  # fmt: skip
    return Job(name="merged", source=source, key="key", aggregate=[agg.count(), agg.sum("count")])


def test_a_fan_in_commits_over_the_merged_marker_of_upstreams_at_different_rates(
    spark: Any, tmp_path: Path
) -> None:
    store = f"file://{tmp_path}/store"
    data = str(tmp_path / "in")
    write_epochs(data, files=9, keys=30, records=100)
    fast_repo, slow_repo = Repository.open(store, "fast"), Repository.open(store, "slow")
    down_repo = Repository.open(store, "down")
    # fast: an epoch per logical second; slow: one per three seconds (the same files)
    fast = EpochRunner(spark, aggregate_job(data), repo=fast_repo)
    slow = EpochRunner(spark, aggregate_job(data, logical_epoch_ms=3000), repo=slow_repo)
    down = EpochRunner(spark, fan_in_job(store), repo=down_repo)

    assert down.run_epoch() is None  # no upstream has committed: nothing to merge
    fast.run(max_epochs=3)  # t = 1, 2, 3 s
    assert down.run_epoch() is None  # the slow upstream has no epoch yet: wait, no empty epoch
    slow.run(max_epochs=1)  # t = 3 s
    first = down.run_epoch()  # marker 3 s: fast 1-3, slow 1
    fast.run(max_epochs=2)  # t = 4, 5 s
    assert down.run_epoch() is None  # marker still 3 s: the fast epochs after it wait
    slow.run(max_epochs=1)  # t = 6 s
    second = down.run_epoch()  # marker 5 s: fast 4-5, slow's epoch 2 (6 s) waits
    fast.run(max_epochs=3)  # t = 6, 7, 8 s
    third = down.run_epoch()  # marker 6 s: fast 6, slow 2
    assert first and second and third

    mapping = []
    for sid in (first.snapshot_id, second.snapshot_id, third.snapshot_id):
        doc = down_repo.read_manifest(sid).extra["inputs"]["inputs"]
        assert doc["kind"] == "fan_in"
        mapping.append((doc["marker_ms"], {n: d["epochs"] for n, d in doc["inputs"].items()}))
    assert mapping == [
        (3000, {"fast": [1, 2, 3], "slow": [1]}),
        (5000, {"fast": [4, 5], "slow": []}),
        (6000, {"fast": [6], "slow": [2]}),
    ]
    # each downstream epoch read exactly the upstream records of its epochs
    stats = [
        down_repo.read_manifest(r.snapshot_id).stats["records_in"] for r in (first, second, third)
    ]
    out_rows = {
        name: {
            m.epoch: m.stats["output_rows"] for _, m in repo.log("heads/main", first_parent=True)
        }
        for name, repo in (("fast", fast_repo), ("slow", slow_repo))
    }
    assert stats == [
        sum(out_rows["fast"][e] for e in (1, 2, 3)) + out_rows["slow"][1],
        sum(out_rows["fast"][e] for e in (4, 5)),
        out_rows["fast"][6] + out_rows["slow"][2],
    ]
    # a restarted downstream continues from its offsets; the web sees two edges
    again = EpochRunner(spark, fan_in_job(store), repo=down_repo)
    assert again.run_epoch() is None  # marker 6 s: fast 7-8 wait for the slow upstream
    head = down_repo.read_manifest(down_repo.resolve("heads/main"))
    edges = dict(flatten_inputs(head.extra["inputs"]))
    assert {k: (v["namespace"], v["marker_ms"]) for k, v in edges.items()} == {
        "inputs/fast": ("fast", 6000),
        "inputs/slow": ("slow", 6000),
    }
    assert again.job.source.retained(head.offsets["inputs"]) is None


def test_a_fan_in_needs_two_distinct_upstreams(tmp_path: Path) -> None:
    one = BranchOutputSource("file:///x", "a", "main", name="a")
    with pytest.raises(ValueError, match="two or more upstreams"):
        FanInSource([one])
    with pytest.raises(ValueError, match="distinct names"):
        FanInSource([one, BranchOutputSource("file:///x", "b", "main", name="a")])
