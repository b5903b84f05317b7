"""Event time: watermarks carried by the snapshots and windowed aggregation, against an
independent pandas reference, across parallelism, live rescale, rollback, fork and a driver
SIGKILL mid-epoch, and against Spark Structured Streaming's own windowed aggregation."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest

from runners.engine import Job, JobError, read_dead_letters, sources
from runners.engine import aggregations as agg
from runners.engine.eventtime import EventTime, EventTimeError, sliding, tumbling
from runners.engine.eventtime.watermark import Watermark, advance
from snapshots_store import Repository
from tests.engine.event_runs import chain as _chain
from tests.engine.event_runs import (
    dead_letters,
    killed_and_restarted,
    late_per_epoch,
    output,
    replay_rolled_back_and_forked,
    run_rescaled,
)
from tests.engine.event_runs import ipc as _ipc
from tests.engine.event_runs import run as _run
from tests.engine.event_runs import watermarks as _watermarks
from tests.engine.spark_streaming import micro_batches, window_aggregates, with_watermark
from tests.engine.windows_data import (
    DELAY_MS,
    Layout,
    event_frames,
    reference,
    window_job,
)

pytestmark = pytest.mark.spark

LAYOUT = Layout()
SIZE, SLIDE = 10_000, 5_000
SORT = ["_epoch", "key", "window_start"]


# -- the watermark rule and declarations (no Spark) ---------------------------------------


def test_watermark_is_min_over_partitions_minus_delay_never_backwards_idle_left_out() -> None:
    spec = EventTime("ts", 100, idle_timeout_ms=3_000)
    wm, parts = advance(spec, Watermark(), {"a": 5_000, "b": 2_000}, now_ms=1_000)
    assert wm == 1_900 and parts == {"a": (5_000, 1_000), "b": (2_000, 1_000)}
    # b brings an older record: its maximum stays, the watermark does not move back
    wm, parts = advance(spec, Watermark(wm, partitions=parts), {"b": 1_000}, now_ms=2_000)
    assert wm == 1_900 and parts["b"] == (2_000, 2_000)
    # only a advances; b holds the watermark back until it has been idle for 3 s
    state = Watermark(wm, partitions=parts)
    wm, parts = advance(spec, state, {"a": 9_000}, now_ms=4_000)
    assert wm == 1_900
    wm, parts = advance(spec, Watermark(wm, partitions=parts), {"a": 9_500}, now_ms=5_000)
    assert wm == 9_400  # b idle since 2_000: left out
    # b comes back with old data: it counts again but cannot move the watermark backwards
    wm, _ = advance(spec, Watermark(wm, partitions=parts), {"b": 3_000}, now_ms=6_000)
    assert wm == 9_400


def test_bad_event_time_and_window_declarations_are_refused_naming_the_fix(tmp_path: Path) -> None:
    source = sources.ParquetDirectory(str(tmp_path))
    with pytest.raises(EventTimeError, match="delay_ms -1 must not be negative"):
        EventTime("ts", -1)
    with pytest.raises(EventTimeError, match="slide 20 ms exceeds its size 10 ms"):
        sliding(10, 20)
    with pytest.raises(EventTimeError, match="output_mode must be one of append, update"):
        tumbling(10, output_mode="complete")
    base: dict[str, Any] = {"name": "j", "source": source, "key": "key", "aggregate": [agg.count()]}
    with pytest.raises(JobError, match=r"a window needs event_time=EventTime\(column, delay_ms\)"):
        Job(**base, window=tumbling(10))
    with pytest.raises(JobError, match="aggregation 'last_value' cannot run in a window"):
        Job(**{**base, "aggregate": [agg.last("value")]}, event_time=EventTime("ts", 0),
            window=tumbling(10))  # fmt: skip


# -- runs on the shared SparkSession ------------------------------------------------------


def _output(repo: Repository, branch: str = "main") -> pd.DataFrame:
    return output(repo, SORT, branch)


@pytest.fixture(scope="module")
def sliding_run(spark: Any, event_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Repository:
    """Sliding windows (10 s every 5 s), append mode, p = 2: the run others compare with."""
    return _run(spark, window_job(event_dir), tmp_path_factory.mktemp("sliding"), "sliding")


def test_sliding_append_equals_pandas_reference_with_late_records(
    sliding_run: Repository,
) -> None:
    expected, late = reference(event_frames(LAYOUT), SIZE, SLIDE, DELAY_MS)
    got = _output(sliding_run)
    pd.testing.assert_frame_equal(got[expected.columns], expected, check_dtype=False)
    assert sum(late) > 20 and len(expected) > 500  # the data has late records and windows
    # late records: counted per epoch in the manifests and kept as dead letters
    assert [w[3] for w in _watermarks(sliding_run)] == late
    dead = read_dead_letters(sliding_run, "main").to_pandas()
    assert set(dead["reason"]) == {"late"}
    assert late_per_epoch(sliding_run, len(late)) == late
    # every epoch applied its parent's watermark; the last epoch had no input (it only closed
    # the windows the input's watermark passed), after it no open window is due
    marks = _watermarks(sliding_run)
    assert [a for _, a, _, _ in marks[1:]] == [w for _, _, w, _ in marks[:-1]]
    head = _chain(sliding_run)[-1].extra["event_time"]
    assert _chain(sliding_run)[-1].stats["records_in"] == 0
    assert head["watermark"] == max(f["ts"].max() for f in event_frames(LAYOUT)) - DELAY_MS
    assert head["due"] and min(head["due"].values()) > head["watermark"]


def test_tumbling_update_mode_equals_reference(spark: Any, event_dir: str, tmp_path: Path) -> None:
    job = window_job(event_dir, window=tumbling(SIZE, output_mode="update"))
    repo = _run(spark, job, tmp_path, "update")
    expected, late = reference(event_frames(LAYOUT), SIZE, SIZE, DELAY_MS, mode="update")
    got = _output(repo)
    pd.testing.assert_frame_equal(got[expected.columns], expected, check_dtype=False)
    assert [w[3] for w in _watermarks(repo)] == late


def test_parallelism_3_with_live_rescales_is_byte_identical(
    spark: Any, event_dir: str, sliding_run: Repository, tmp_path: Path
) -> None:
    repo = run_rescaled(spark, window_job(event_dir), tmp_path, "rescaled", (3, 3, 1, 3, 2, 3, 1))
    assert _ipc(_output(repo)) == _ipc(_output(sliding_run))
    assert _watermarks(repo) == _watermarks(sliding_run)
    assert dead_letters(repo) == dead_letters(sliding_run)


def test_rollback_and_fork_replay_the_same_watermarks_and_windows(
    spark: Any, event_dir: str, sliding_run: Repository, tmp_path: Path
) -> None:
    repo = _run(spark, window_job(event_dir), tmp_path, "rollback", p=1)
    replay_rolled_back_and_forked(spark, window_job(event_dir), repo)
    for branch in ("main", "fork"):
        assert _ipc(_output(repo, branch)) == _ipc(_output(sliding_run)), branch
        assert _watermarks(repo, branch) == _watermarks(sliding_run), branch


def test_watermark_partitions_and_idleness(spark: Any, tmp_path: Path) -> None:
    """Two partitions (files *-a and *-b, one each per epoch); b brings no event time after
    epoch 2: its maximum holds the watermark back until it has been idle for 2 s of logical time."""
    directory = tmp_path / "in"
    for i in range(4):
        for name, shift in (("a", 0), ("b", -3_000)):
            ts: list[int | None] = [i * 10_000 + shift + j * 1_000 for j in range(5)]
            if name == "b" and i >= 2:  # no event time: dead letters, nothing for the watermark
                ts = [None] * 5
            table = pa.table({"key": ["x", "y", "x", "y", "z"], "value": [1] * 5,
                              "ts": pa.array(ts, pa.int64())})  # fmt: skip
            sources.write_parquet_file(str(directory), f"{i}-{name}", table)

    @dataclasses.dataclass
    class TwoPartitions(sources.ParquetDirectory):
        def watermark_partition(self, partition: str) -> str:
            return partition.split("-")[1][0]

    job = window_job(
        str(directory),
        source=TwoPartitions(str(directory), max_files_per_epoch=2),
        event_time=EventTime("ts", 500, idle_timeout_ms=2_000),
        window=tumbling(10_000),
    )
    repo = _run(spark, job, tmp_path, "partitions")
    marks = [(e, w) for e, _, w, _ in _watermarks(repo)]
    dead = read_dead_letters(repo, "main").to_pandas()
    assert dead["reason"].tolist() == ["missing event time"] * 10
    # epoch 1: min(4000, 1000) - 500; epoch 2: min(14000, 11000) - 500; epoch 3 (b idle for
    # 1 s): still b's 11000 - 500; epoch 4 (b idle 2 s): a alone, 34000 - 500
    assert marks[:4] == [(1, 500), (2, 10_500), (3, 10_500), (4, 33_500)]


# -- a driver SIGKILL mid-epoch, restart ----------------------------------------------------


@pytest.mark.slow  # two job processes (JVM starts): ~45 s
def test_driver_sigkill_mid_epoch_then_restart_emits_the_same_windows(
    event_dir: str, sliding_run: Repository, tmp_path: Path
) -> None:
    repo = killed_and_restarted(tmp_path, event_dir, "window-job", 3)
    assert _ipc(_output(repo)) == _ipc(_output(sliding_run))
    assert _watermarks(repo) == _watermarks(sliding_run)


# -- Spark Structured Streaming's own windowed aggregation ---------------------------------


def _spark_windows(
    spark: Any, frames: list[pd.DataFrame], root: Path, slide_s: int
) -> pd.DataFrame:
    """Spark's groupBy(window(...)) + withWatermark in append mode over the same input."""
    from pyspark.sql import functions as F

    def query(stream: Any) -> Any:
        window = F.window("t", f"{SIZE // 1000} seconds", f"{slide_s} seconds")
        grouped = with_watermark(stream, DELAY_MS).groupBy(window, "key")
        return window_aggregates(grouped, "window")

    rows = micro_batches(spark, frames, root, query)
    return rows.sort_values(["key", "window_start"]).reset_index(drop=True)


@pytest.mark.parametrize(
    "slide_s", [5, pytest.param(10, marks=pytest.mark.slow)], ids=["sliding", "tumbling"]
)
def test_final_rows_equal_spark_structured_streaming(
    spark: Any, event_dir: str, sliding_run: Repository, tmp_path: Path, slide_s: int
) -> None:
    if slide_s == SLIDE // 1000:
        ours = _output(sliding_run)
    else:
        ours = _output(_run(spark, window_job(event_dir, window=tumbling(SIZE)), tmp_path, "t"))
    theirs = _spark_windows(spark, event_frames(LAYOUT), tmp_path, slide_s)
    ours = ours.drop(columns="_epoch").sort_values(["key", "window_start"]).reset_index(drop=True)
    assert len(ours) > 300
    pd.testing.assert_frame_equal(ours[theirs.columns], theirs, check_dtype=False)
