"""Timers in per-key functions: event-time and processing-time timers against an independent
reference (out-of-order and late data), identical across parallelism 1, 2 and 3, live
rescales, a rollback and a fork replaying; and the errors that name the fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from runners.engine import EpochRunner, Job, JobError, read_output, sources
from runners.engine import aggregations as agg
from runners.engine.state.timers import TimerError, Timers
from runners.engine.state_ops import new_branch_commit, rehash
from snapshots_store import Repository
from tests.engine.event_runs import chain as _chain
from tests.engine.event_runs import ipc as _ipc
from tests.engine.event_runs import killed_and_restarted
from tests.engine.event_runs import run as _run
from tests.engine.timers_data import COLUMNS, LAYOUT, on_timer, process, reference, timer_job
from tests.engine.windows_data import event_frames, write_event_files

pytestmark = pytest.mark.spark


# -- declarations and the timer API (no Spark) --------------------------------------------


def test_bad_timer_declarations_and_timestamps_are_refused_naming_the_fix(tmp_path: Path) -> None:
    source = sources.ParquetDirectory(str(tmp_path))
    with pytest.raises(JobError, match="on_timer runs with a per-key function: give process=fn"):
        Job(name="j", source=source, key="k", aggregate=[agg.count()], on_timer=on_timer)
    with pytest.raises(JobError, match="on_timer must be a function"):
        Job(name="j", source=source, key="k", process=process, on_timer=5)  # type: ignore[arg-type]
    timers = Timers(job="j", on_timer=True, event_time=False)
    with pytest.raises(TimerError, match=r"event-time timer needs a watermark: declare event_ti"):
        timers.register_event_time(1_000)
    timers = Timers(job="j", on_timer=True, event_time=True)
    for bad in (1.5, "1000", True, None):
        with pytest.raises(TimerError, match="must be an int of milliseconds"):
            timers.register_event_time(bad)  # type: ignore[arg-type]
    with pytest.raises(TimerError, match="does not fit in int64"):
        timers.register_processing_time(2**63)
    with pytest.raises(TimerError, match=r"a timer needs Job\(on_timer=fn\)"):
        Timers(job="j", on_timer=False, event_time=True).register_processing_time(1)


def test_timer_api_registers_deletes_and_lists_in_timestamp_order() -> None:
    timers = Timers(job="j", on_timer=True, event_time=True)
    timers.register_processing_time(np.int64(300))  # numpy integers are ints
    timers.register_event_time(300)
    timers.register_event_time(100)
    timers.register_event_time(100)  # once per (domain, timestamp)
    assert timers.list() == [("event", 100), ("event", 300), ("processing", 300)]
    timers.delete_event_time(300)
    timers.delete_processing_time(999)  # absent: nothing
    assert timers.list() == [("event", 100), ("processing", 300)] and len(timers) == 2
    assert ("event", 100) in timers and ("event", 300) not in timers


# -- runs on the shared SparkSession ------------------------------------------------------


@pytest.fixture(scope="module")
def timer_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    directory = tmp_path_factory.mktemp("timer-events") / "in"
    write_event_files(str(directory), LAYOUT, row_group_size=100)
    return str(directory)


def _output(repo: Repository, branch: str = "main") -> pd.DataFrame:
    table = read_output(repo, branch).to_pandas()
    return table[COLUMNS].sort_values(COLUMNS).reset_index(drop=True)


def _timer_docs(repo: Repository, branch: str = "main") -> list[tuple[Any, ...]]:
    """(epoch, applied watermark, timers fired, timers pending, extra.timers) per epoch."""
    return [
        (m.epoch, m.extra["event_time"]["applied"], m.stats["timers_fired"],
         m.stats["timers_pending"], m.extra["timers"])
        for m in _chain(repo, branch)
        if m.kind in ("epoch", "rescale")
    ]  # fmt: skip


@pytest.fixture(scope="module")
def timer_run(spark: Any, timer_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Repository:
    """The job at p = 2: the run the others compare with."""
    return _run(spark, timer_job(timer_dir), tmp_path_factory.mktemp("timers"), "timers")


def test_timers_fire_as_the_reference_with_out_of_order_and_late_data(
    timer_run: Repository,
) -> None:
    expected, fired = reference(event_frames(LAYOUT))
    got = _output(timer_run)
    pd.testing.assert_frame_equal(got, expected, check_dtype=False)
    kinds = got["kind"].value_counts()
    assert kinds["late"] > 20 and kinds["window"] > 500 and kinds["echo"] > 20, kinds
    assert kinds["tick"] > 200, kinds
    docs = _timer_docs(timer_run)
    assert [d[2] for d in docs] == fired
    # the input ended at epoch 7; the epochs after it had no input: they fired the windows
    # the last watermark passed, then the echoes registered by those timers
    chain = _chain(timer_run)
    assert len(docs) > LAYOUT.files
    assert all(m.stats["records_in"] == 0 for m in chain[LAYOUT.files :])
    # pending timers per key group, as the state holds them
    head = docs[-1][4]
    assert head["max_parallelism"] == chain[-1].max_parallelism
    assert sum(head["pending"].values()) == docs[-1][3] > 0
    assert set(head["event"]) | set(head["processing"]) == set(head["pending"])


def test_parallelism_1_and_3_and_live_rescales_fire_identically(
    spark: Any, timer_dir: str, timer_run: Repository, tmp_path: Path
) -> None:
    for p in (1, 3):
        repo = _run(spark, timer_job(timer_dir), tmp_path / f"p{p}", f"timers-p{p}", p=p)
        assert _ipc(_output(repo)) == _ipc(_output(timer_run)), p
        assert _timer_docs(repo) == _timer_docs(timer_run), p
    repo = Repository.open(f"file://{tmp_path}/store", "rescaled")
    runner = EpochRunner(spark, timer_job(timer_dir), repo=repo, parallelism=3)
    version = None
    for p in (3, 1, 3, 2, 3, 1, 2, 3, 1, 2):
        version = repo.write_control("main", {"parallelism": p}, version)
        result = runner.run_epoch()
        if result is None:
            break
        assert result.parallelism == p
    assert runner.run_epoch() is None and runner.stopped_reason == "no new data"
    assert _ipc(_output(repo)) == _ipc(_output(timer_run))
    assert _timer_docs(repo) == _timer_docs(timer_run)


def test_rollback_and_fork_replay_the_same_timers(
    spark: Any, timer_dir: str, timer_run: Repository, tmp_path: Path
) -> None:
    repo = _run(spark, timer_job(timer_dir), tmp_path, "rollback", p=1)
    ids = {m.epoch: sid for sid, m in repo.log("heads/main", first_parent=True)}
    chain = _chain(repo)
    head = repo.resolve("main")
    new_branch_commit(repo, ids[4], "main", kind="rollback", operation_id="op-rb",
                      provenance={"reason": "test"}, expected_head=head)  # fmt: skip
    rolled = repo.read_manifest(repo.resolve("main"))
    assert rolled.extra["timers"] == chain[3].extra["timers"]  # carried by the commit
    new_branch_commit(repo, ids[2], "fork", kind="fork", operation_id="op-fork",
                      provenance={"reason": "test"})  # fmt: skip
    EpochRunner(spark, timer_job(timer_dir), repo=repo, parallelism=2).run()
    EpochRunner(spark, timer_job(timer_dir), repo=repo, branch="fork", parallelism=3).run()
    for branch in ("main", "fork"):
        assert _ipc(_output(repo, branch)) == _ipc(_output(timer_run)), branch
        assert _timer_docs(repo, branch) == _timer_docs(timer_run), branch


def test_rehash_to_another_max_parallelism_moves_the_timers_with_their_keys(
    spark: Any, timer_dir: str, timer_run: Repository, tmp_path: Path
) -> None:
    repo = Repository.open(f"file://{tmp_path}/store", "rehashed")
    EpochRunner(spark, timer_job(timer_dir), repo=repo, parallelism=2).run(max_epochs=3)
    head = repo.resolve("main")
    before = repo.read_manifest(head).extra["timers"]
    new = rehash(repo, head, 64, branch="main", operation_id="op-rh", reason="test")
    moved = repo.read_manifest(new)
    assert moved.kind == "migration" and moved.extra["timers"] == before  # carried as it was
    EpochRunner(spark, timer_job(timer_dir), repo=repo, parallelism=3).run()
    assert _ipc(_output(repo)) == _ipc(_output(timer_run))
    # the same timers fired and stayed pending, epoch by epoch; the document is now M = 64's
    assert [d[:4] for d in _timer_docs(repo)] == [d[:4] for d in _timer_docs(timer_run)]
    assert _chain(repo)[-1].extra["timers"]["max_parallelism"] == 64


@pytest.mark.slow  # two job processes (JVM starts): ~45 s
def test_driver_sigkill_mid_epoch_then_restart_fires_the_same_timers(
    timer_dir: str, timer_run: Repository, tmp_path: Path
) -> None:
    repo = killed_and_restarted(tmp_path, timer_dir, "timer-job", 4)
    assert _ipc(_output(repo)) == _ipc(_output(timer_run))
    assert _timer_docs(repo) == _timer_docs(timer_run)


def _tick(key: str, records: list[dict[str, Any]], state: Any, ctx: Any) -> list[dict[str, Any]]:
    ctx.timers.register_processing_time(ctx.processing_time_ms + 1_500)
    return []


def _ticked(key: str, timestamp_ms: int, state: Any, ctx: Any) -> list[dict[str, Any]]:
    return [{"key": key, "at": timestamp_ms, "domain": ctx.timer_domain}]


def test_processing_time_timers_without_event_time_fire_in_epochs_without_input(
    spark: Any, tmp_path: Path
) -> None:
    directory = tmp_path / "in"
    for i in range(2):
        table = pa.table({"key": [f"k{i}", "both"], "value": [1, 2]})
        sources.write_parquet_file(str(directory), f"part-{i}", table)
    job = Job(name="ticks", source=sources.ParquetDirectory(str(directory)), key="key",
              process=_tick, on_timer=_ticked, time_mode="logical")  # fmt: skip
    repo = _run(spark, job, tmp_path, "ticks")
    rows = read_output(repo, "main").to_pandas().sort_values(["_epoch", "key"])
    # epoch 1 (t = 1 s) registers 2.5 s, epoch 2 registers 3.5 s ("both" keeps both timers);
    # epochs 3 and 4 have no input: each fires the timers its processing time reached
    assert rows.values.tolist() == [
        ["both", 2_500, "processing", 3], ["k0", 2_500, "processing", 3],
        ["both", 3_500, "processing", 4], ["k1", 3_500, "processing", 4],
    ]  # fmt: skip
    chain = _chain(repo)
    assert [m.stats["records_in"] for m in chain] == [2, 2, 0, 0]
    assert [m.stats["timers_fired"] for m in chain] == [0, 0, 2, 2]
    assert chain[-1].extra["timers"]["pending"] == {} and "event_time" not in chain[-1].extra
    # the keys whose only state was a timer are gone from the state
    assert chain[-1].stats["timers_pending"] == 0


def _event_timer(key: str, records: list[dict[str, Any]], state: Any, ctx: Any) -> list[Any]:
    ctx.timers.register_event_time(records[0]["value"])
    return []


def test_an_event_time_timer_without_event_time_fails_the_epoch_naming_the_fix(
    spark: Any, tmp_path: Path
) -> None:
    directory = tmp_path / "in"
    sources.write_parquet_file(str(directory), "part-0", pa.table({"key": ["a"], "value": [5]}))
    job = Job(name="no-watermark", source=sources.ParquetDirectory(str(directory)), key="key",
              process=_event_timer, on_timer=_ticked)  # fmt: skip
    repo = Repository.open(f"file://{tmp_path}/store", "no-watermark")
    with pytest.raises(Exception, match=r"an event-time timer needs a watermark: declare"):
        EpochRunner(spark, job, repo=repo, parallelism=1).run()
    assert repo.read_ref("heads/main") is None  # nothing committed
