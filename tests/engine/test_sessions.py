"""Session windows: merging intervals (no Spark), then runs against an independent pandas
reference (out of order, late records, sessions bridged across epochs), across parallelism 1,
2 and 3 with live rescales, and against Spark Structured Streaming's own
``groupBy(session_window(...))`` with ``withWatermark`` on the same micro-batches."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from runners.engine import Job, JobError, read_dead_letters, sources
from runners.engine import aggregations as agg
from runners.engine.eventtime import EventTime, EventTimeError, session
from runners.engine.eventtime.grouping import sessions
from snapshots_store import Repository
from tests.engine.event_runs import (
    chain,
    dead_letters,
    ipc,
    late_per_epoch,
    output,
    replay_rolled_back_and_forked,
    run,
    run_rescaled,
    watermarks,
)
from tests.engine.spark_streaming import micro_batches, window_aggregates, with_watermark
from tests.engine.windows_data import (
    DELAY_MS,
    Layout,
    event_frames,
    session_reference,
    window_job,
)

LAYOUT = Layout()
GAP = 2_000
SORT = ["_epoch", "key", "window_start"]
COLUMNS = ["key", "window_start", "window_end", "count", "sum_value", "max_value"]
BASE = 1_700_000_000_000

# -- merging intervals and declarations (no Spark) ----------------------------------------


def test_intervals_that_overlap_or_touch_merge_per_key_whatever_their_order() -> None:
    codes = np.array([1, 0, 0, 1, 0, 0, 0])
    starts = np.array([5, 0, 25, 20, 10, 40, 33])
    ends = starts + 10
    ones = pa.array(np.ones(len(codes), dtype=np.int64))
    new = np.array([0, 0, 0, 0, 0, 0, 1], dtype=np.int8)
    groups = sessions(codes, starts, ends, new, {"count": (ones, "sum")})
    # key 0: [0,10) touches [10,20); [25,35) and [40,50) are bridged by [33,43)
    assert groups.codes.tolist() == [0, 0, 1, 1]
    assert groups.starts.tolist() == [0, 25, 5, 20]
    assert groups.ends.tolist() == [20, 50, 15, 30]
    assert groups.values["count"].to_pylist() == [2, 3, 1, 1]
    assert groups.changed.tolist() == [False, True, False, False]
    assert groups.firsts.tolist() == [1, 2, 0, 3]  # the first row (input order) of each
    shuffled = np.random.default_rng(1).permutation(len(codes))
    again = sessions(codes[shuffled], starts[shuffled], ends[shuffled], new[shuffled],
                     {"count": (ones.take(pa.array(shuffled)), "sum")})  # fmt: skip
    assert again.starts.tolist() == groups.starts.tolist()
    assert again.ends.tolist() == groups.ends.tolist()


def test_bad_session_declarations_are_refused_naming_the_fix(tmp_path: Path) -> None:
    with pytest.raises(EventTimeError, match="session gap_ms must be a positive int, not 0"):
        session(0)
    with pytest.raises(EventTimeError, match="output_mode must be one of append, update"):
        session(10, output_mode="complete")
    source = sources.ParquetDirectory(str(tmp_path))
    with pytest.raises(JobError, match="aggregation 'last_value' cannot run in a window"):
        Job(name="j", source=source, key="key", aggregate=[agg.last("value")],
            event_time=EventTime("ts", 0), window=session(10))  # fmt: skip
    with pytest.raises(JobError, match=r"key columns \['window_end'\] clash with a window"):
        Job(name="j", source=source, key="window_end", aggregate=[agg.count()],
            event_time=EventTime("ts", 0), window=session(10))  # fmt: skip


# -- runs on the shared SparkSession ------------------------------------------------------


@pytest.fixture(scope="module")
def session_run(spark: Any, event_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Repository:
    """Sessions (gap 2 s), append mode, p = 2: the run the others compare with."""
    job = window_job(event_dir, window=session(GAP))
    return run(spark, job, tmp_path_factory.mktemp("sessions"), "sessions")


@pytest.mark.spark
def test_sessions_append_equal_reference_with_late_records(session_run: Repository) -> None:
    expected, late = session_reference(event_frames(LAYOUT), GAP, DELAY_MS)
    got = output(session_run, SORT)
    pd.testing.assert_frame_equal(got[expected.columns], expected, check_dtype=False)
    assert sum(late) > 20 and len(expected) > 400 and expected["count"].max() > 10
    # sessions spanning epochs: the records of one session arrived in several files
    assert (expected["window_end"] - expected["window_start"] > 10_000).any()
    assert [w[3] for w in watermarks(session_run)] == late
    assert late_per_epoch(session_run, len(late)) == late
    head = chain(session_run)[-1]
    assert head.stats["records_in"] == 0  # the last epoch only closed sessions
    due = head.extra["event_time"]["due"]
    assert due and min(due.values()) > head.extra["event_time"]["watermark"]


@pytest.mark.spark
def test_sessions_update_mode_equal_reference(spark: Any, event_dir: str, tmp_path: Path) -> None:
    job = window_job(event_dir, window=session(GAP, output_mode="update"))
    repo = run(spark, job, tmp_path, "update")
    expected, late = session_reference(event_frames(LAYOUT), GAP, DELAY_MS, mode="update")
    got = output(repo, SORT)
    pd.testing.assert_frame_equal(got[expected.columns], expected, check_dtype=False)
    assert [w[3] for w in watermarks(repo)] == late


@pytest.mark.spark
def test_parallelism_1_and_3_live_rescales_and_routings_are_byte_identical(
    spark: Any, event_dir: str, session_run: Repository, tmp_path: Path
) -> None:
    job = window_job(event_dir, window=session(GAP))
    single = run(spark, job, tmp_path, "single", p=1)
    rescaled = run_rescaled(spark, job, tmp_path, "rescaled", (3, 3, 1, 3, 2))
    # the shuffle routing: sessions merged per split by the map tasks, again by the reducers
    shuffled = run(spark, job, tmp_path, "shuffled", p=3, routing="shuffle")
    for repo in (single, rescaled, shuffled):
        assert ipc(output(repo, SORT)) == ipc(output(session_run, SORT))
        assert watermarks(repo) == watermarks(session_run)
        assert dead_letters(repo) == dead_letters(session_run)


@pytest.mark.spark
def test_rollback_and_fork_replay_the_same_sessions(
    spark: Any, event_dir: str, session_run: Repository, tmp_path: Path
) -> None:
    job = window_job(event_dir, window=session(GAP))
    repo = run(spark, job, tmp_path, "rollback", p=1)
    replay_rolled_back_and_forked(spark, job, repo)
    for branch in ("main", "fork"):
        assert ipc(output(repo, SORT, branch)) == ipc(output(session_run, SORT)), branch
        assert watermarks(repo, branch) == watermarks(session_run), branch


# -- a crafted stream: a bridge across epochs, a late record that touches an open session --

#: seconds after BASE, one list per epoch (gap 10 s, delay 10 s)
CRAFTED = [
    # a: [18,28) and [31,41); b: [12,38); c: [10,20); x: [35,45); W1 = 25
    [("a", 18), ("a", 31), ("b", 12), ("b", 20), ("b", 28), ("c", 10), ("x", 35)],
    # c's [10,20) closes first; a@22 (before W1, its own end 32 after it) bridges a's
    # sessions; b@4 ends at 14 <= W1: late, though b's open [12,38) starts before 14; c@18
    # overlaps the closed [10,20): a new session; x@45 touches [35,45); W2 = 35
    [("a", 22), ("b", 4), ("c", 18), ("d", 26), ("x", 45)],
    # d@36 touches d's [26,36); W3 = 50
    [("d", 36), ("x", 60)],
    [("x", 75)],  # W4 = 65; then an epoch without input closes x's [35,55)
]
#: the final sessions: key, start, end, count (seconds after BASE)
CRAFTED_SESSIONS = [
    ("a", 18, 41, 3), ("b", 12, 38, 3), ("c", 10, 20, 1), ("c", 18, 28, 1), ("d", 26, 46, 2),
    ("x", 35, 55, 2),
]  # fmt: skip


def _crafted_frames() -> list[pd.DataFrame]:
    frames = []
    for i, records in enumerate(CRAFTED):
        keys = [k for k, _ in records]
        ts = [BASE + s * 1000 for _, s in records]
        values = [100 * i + j for j in range(len(records))]
        frames.append(pd.DataFrame({"key": keys, "value": values, "ts": ts}))
    return frames


def _spark_sessions(
    spark: Any, frames: list[pd.DataFrame], root: Path, gap: int, delay: int
) -> pd.DataFrame:
    """Spark's groupBy(session_window(...)) + withWatermark in append mode."""
    from pyspark.sql import functions as F

    def query(stream: Any) -> Any:
        window = F.session_window("t", f"{gap} milliseconds")
        grouped = with_watermark(stream, delay).groupBy(window, "key")
        return window_aggregates(grouped, "session_window")

    rows = micro_batches(spark, frames, root, query)
    return rows.sort_values(["key", "window_start"]).reset_index(drop=True)


def _final(frame: pd.DataFrame) -> pd.DataFrame:
    rows = frame.drop(columns="_epoch", errors="ignore")[COLUMNS]
    return rows.sort_values(["key", "window_start"]).reset_index(drop=True)


@pytest.mark.spark
def test_crafted_bridge_and_late_rule_equal_reference_and_spark(spark: Any, tmp_path: Path) -> None:
    frames = _crafted_frames()
    directory = tmp_path / "in"
    for i, frame in enumerate(frames):
        table = pa.Table.from_pandas(frame, preserve_index=False)
        sources.write_parquet_file(str(directory), f"part-{i:05d}", table)
    job = window_job(str(directory), window=session(10_000), event_time=EventTime("ts", 10_000))
    repo = run(spark, job, tmp_path, "crafted")
    ours = output(repo, SORT)
    expected, late = session_reference(frames, 10_000, 10_000)
    pd.testing.assert_frame_equal(ours[expected.columns], expected, check_dtype=False)
    assert late == [0, 1, 0, 0, 0]
    dead = read_dead_letters(repo, "main").to_pandas()
    assert dead["reason"].tolist() == ["late"] and '"key": "b"' in dead["raw"][0]
    final = _final(ours)[["key", "window_start", "window_end", "count"]]
    got = [(k, (s - BASE) // 1000, (e - BASE) // 1000, c)
           for k, s, e, c in final.itertuples(index=False)]  # fmt: skip
    assert got == CRAFTED_SESSIONS
    # c's first session is emitted by epoch 2, the bridged a by epoch 4, x's by epoch 5
    assert ours.groupby("_epoch").size().to_dict() == {2: 1, 3: 1, 4: 3, 5: 1}
    theirs = _spark_sessions(spark, frames, tmp_path, 10_000, 10_000)
    pd.testing.assert_frame_equal(_final(ours), theirs[COLUMNS], check_dtype=False)
    # update mode: epoch 2 emits a's bridged session with its running values
    update = window_job(str(directory), window=session(10_000, output_mode="update"),
                        event_time=EventTime("ts", 10_000))  # fmt: skip
    updated = output(run(spark, update, tmp_path, "crafted-update"), SORT)
    expected, _ = session_reference(frames, 10_000, 10_000, mode="update")
    pd.testing.assert_frame_equal(updated[expected.columns], expected, check_dtype=False)
    bridged = updated[(updated["_epoch"] == 2) & (updated["key"] == "a")]
    assert bridged[["window_start", "window_end", "count"]].values.tolist() == [
        [BASE + 18_000, BASE + 41_000, 3]
    ]


@pytest.mark.spark
def test_final_sessions_equal_spark_structured_streaming(
    spark: Any, session_run: Repository, tmp_path: Path
) -> None:
    ours = _final(output(session_run, SORT))
    theirs = _spark_sessions(spark, event_frames(LAYOUT), tmp_path, GAP, DELAY_MS)
    assert len(ours) > 400
    pd.testing.assert_frame_equal(ours, theirs[COLUMNS], check_dtype=False)
