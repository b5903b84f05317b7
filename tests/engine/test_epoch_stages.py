"""The epoch's five stages (gate -> plan -> execute -> manifest -> commit) one at a time, the
run loop's events, and the optional capabilities of sources and sinks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runners.engine import EpochRunner
from runners.engine.branch_source import BranchOutputSource
from runners.engine.kafka_sink import KafkaSink
from runners.engine.runner import EngineError
from runners.engine.sinks import Closes, StartsEpochs
from runners.engine.sources import (
    CAPABILITIES,
    AdvancesOffsets,
    Divisible,
    Generator,
    JsonLinesDirectory,
    ParquetDirectory,
    PreparesEpochs,
    PropagatesWatermarks,
    RecordsLineage,
    ReportsBacklog,
    ReportsBacklogRecords,
)
from snapshots_store import Repository
from tests.engine.jobs import aggregate_job


def _capabilities(source: Any) -> set[str]:
    return {c.__name__ for c in CAPABILITIES if isinstance(source, c)}


def test_sources_and_sinks_declare_their_optional_capabilities(tmp_path: Path) -> None:
    assert _capabilities(ParquetDirectory(str(tmp_path))) == {
        ReportsBacklog.__name__,
        ReportsBacklogRecords.__name__,
        Divisible.__name__,
    }
    assert _capabilities(JsonLinesDirectory(str(tmp_path), {"key": "string"})) == {
        ReportsBacklog.__name__
    }
    branch = BranchOutputSource(f"file://{tmp_path}/store", "up", "main")
    assert _capabilities(branch) == {
        PreparesEpochs.__name__,
        AdvancesOffsets.__name__,
        RecordsLineage.__name__,
        PropagatesWatermarks.__name__,
    }
    assert not isinstance(Generator(keys=4, records_per_epoch=8, epochs=1), Divisible)
    sink = KafkaSink("127.0.0.1:9092", "t")
    assert isinstance(sink, StartsEpochs) and isinstance(sink, Closes)


def test_the_gate_stops_before_planning_and_names_why(
    spark: Any, epochs_dir: str, repo: Repository
) -> None:
    runner = EpochRunner(spark, aggregate_job(epochs_dir), repo=repo, parallelism=3)
    opening = runner.gate()
    assert opening is not None
    assert (opening.last_epoch, opening.parallelism, opening.max_parallelism) == (0, 3, 128)
    assert opening.expected is None and opening.parent is None and opening.committed == {}
    version = repo.write_control("main", {"paused": True}, None)
    assert runner.gate() is None and runner.stopped_reason == "paused"
    repo.write_control("main", {"parallelism": 0}, version)
    with pytest.raises(ValueError, match="parallelism"):
        runner.gate()
    runner.interrupt("SIGTERM")
    assert runner.gate() is None and runner.stopped_reason == "SIGTERM"
    assert repo.read_ref("heads/main") is None


def test_the_stages_one_by_one_commit_what_run_epoch_commits(
    spark: Any, epochs_dir: str, repo: Repository, tmp_path: Path
) -> None:
    runner = EpochRunner(spark, aggregate_job(epochs_dir), repo=repo, parallelism=2)
    opening = runner.gate()
    assert opening is not None
    planned = runner.plan(opening)
    assert planned is not None
    assert planned.tasks.epoch == 1 and planned.tasks.processing_time_ms == 1000
    assert [s.partition for s in planned.splits] == ["part-00000.parquet"] * 3
    executed = runner.execute(planned)
    assert executed is not None and [r.task for r in executed.results] == [0, 1]
    assert repo.read_ref("heads/main") is None  # chunks and outputs written, nothing committed
    staged = runner.manifest(planned, executed)
    assert staged.manifest.offsets == {"files": {"part-00000.parquet": 2000}}
    assert staged.manifest.stats["records_in"] == 2000
    assert repo.read_ref("heads/main") is None  # the manifest is written, not committed
    result = runner.commit(staged)
    assert repo.resolve("main") == result.snapshot_id and result.epoch == 1
    # the same epoch through run_epoch, on another namespace: the same state and outputs
    other = Repository.open(f"file://{tmp_path}/other", "other")
    whole = EpochRunner(spark, aggregate_job(epochs_dir), repo=other, parallelism=2).run_epoch()
    assert whole is not None
    ours, theirs = repo.read_manifest(result.snapshot_id), other.read_manifest(whole.snapshot_id)
    assert ours.key_groups == theirs.key_groups and ours.outputs == theirs.outputs
    # a staged epoch goes stale when another writer moves the branch: the commit refuses it
    again = runner.gate()
    late = None if again is None else runner.plan(again)
    ran = None if late is None else runner.execute(late)
    assert late is not None and ran is not None
    stale = runner.manifest(late, ran)
    rival = EpochRunner(spark, aggregate_job(epochs_dir), repo=repo, parallelism=1)
    assert rival.run_epoch() is not None
    with pytest.raises(EngineError, match="moved"):
        runner.commit(stale)
    assert repo.read_manifest(repo.resolve("main")).parallelism == 1


def test_run_tells_its_events(spark: Any, epochs_dir: str, repo: Repository) -> None:
    runner = EpochRunner(spark, aggregate_job(epochs_dir), repo=repo, parallelism=2)
    events: list[dict[str, Any]] = []
    results = runner.run(2, on_event=events.append)
    assert [(e["event"], e.get("n"), e.get("epoch")) for e in events] == [
        ("epoch_start", 1, None),
        ("committed", None, 1),
        ("epoch_start", 2, None),
        ("committed", None, 2),
        ("stopped", None, None),
    ]
    assert events[-1]["reason"] == "max epochs 2"
    assert events[1]["snapshot_id"] == results[0].snapshot_id
    events.clear()
    repo.write_control("main", {"stop_after_epoch": 3}, None)
    assert [r.epoch for r in runner.run(on_event=events.append)] == [3]
    assert [e["event"] for e in events] == ["epoch_start", "committed", "epoch_start", "stopped"]
    assert events[-2:] == [
        {"event": "epoch_start", "n": 2},  # counted per run: the run's second epoch
        {"event": "stopped", "reason": "stop_after_epoch 3"},
    ]
