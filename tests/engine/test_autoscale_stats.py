"""Every committed epoch records the autoscaler's inputs: busy time per task and the backlog."""

from __future__ import annotations

from typing import Any

import pytest

from runners.engine import EpochRunner, sources
from runners.engine.runner import _backlog
from snapshots_store import Repository
from tests.engine.jobs import aggregate_job

pytestmark = pytest.mark.spark


@pytest.mark.parametrize("routing", ["scan", "shuffle"])
def test_epochs_record_busy_time_and_the_backlog_they_leave(
    spark: Any, repo: Repository, epochs_dir: str, routing: str
) -> None:
    job = aggregate_job(
        epochs_dir, source=sources.ParquetDirectory(epochs_dir, max_files_per_epoch=2)
    )
    results = EpochRunner(spark, job, repo=repo, parallelism=3, routing=routing).run()
    assert len(results) == 3  # 6 files, 2 per epoch
    backlogs = []
    for result in results:
        stats = repo.read_manifest(result.snapshot_id).stats
        assert 0 < stats["busy_max_s"] <= stats["busy_s"]
        # three tasks each kept a core busy; their sum is at least the busiest one
        assert stats["busy_s"] <= 3 * stats["process_s"] + 1e-6
        backlogs.append((stats["backlog_epochs"], stats["backlog_records"]))
    assert backlogs == [(2, 8000), (1, 4000), (0, 0)]  # 2,000 records per file, 2 per epoch


def test_backlog_hooks_of_the_sources(tmp_path: Any) -> None:
    gen = sources.Generator(keys=10, records_per_epoch=100, epochs=5)
    assert gen.backlog({"0": 200}) == 3
    assert gen.backlog_records({"0": 250}) == 250
    assert sources.Generator(keys=10, records_per_epoch=100, epochs=None).backlog({}) is None
    lines = tmp_path / "jsonl"
    for name in ("a", "b", "c"):
        sources.write_jsonl_file(str(lines), name, [{"key": "k", "value": 1}])
    jsonl = sources.JsonLinesDirectory(str(lines), schema={"key": "string"}, max_files_per_epoch=2)
    size = (lines / "a.jsonl").stat().st_size
    assert jsonl.backlog({}) == 2  # 3 files, 2 per epoch
    assert jsonl.backlog({"a.jsonl": size, "b.jsonl": size}) == 1

    class Broken:
        name = "broken"

        def backlog(self, offsets: Any) -> int:
            raise OSError("gone")

    assert _backlog(Broken(), {}) == {}  # a failing report never fails the epoch: no stat
