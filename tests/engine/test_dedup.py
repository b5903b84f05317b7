"""Deduplication within the watermark: against an independent pandas reference (late
records, keys forgotten once the watermark passes their first record plus the delay), across
parallelism 1, 2 and 3 with live rescales, and against Spark Structured Streaming's own
``dropDuplicatesWithinWatermark`` on the same micro-batches."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest

from runners.engine import Job, JobError, sources
from runners.engine import aggregations as agg
from runners.engine.eventtime import EventTime, tumbling
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
from tests.engine.spark_streaming import micro_batches, with_watermark
from tests.engine.windows_data import (
    DELAY_MS,
    Layout,
    dedup_reference,
    event_frames,
)

LAYOUT = Layout()
COLUMNS = ["key", "value", "ts"]
BASE = 1_700_000_000_000


def dedup_job(directory: str, key: str | Sequence[str] = "key", delay_ms: int = DELAY_MS) -> Job:
    return Job(
        name="clicks",
        source=sources.ParquetDirectory(directory, max_files_per_epoch=1, rows_per_split=200),
        key=key,
        event_time=EventTime("ts", delay_ms),
        dedup_within_watermark=True,
        time_mode="logical",
    )


def test_bad_dedup_declarations_are_refused_naming_the_fix(tmp_path: Path) -> None:
    source = sources.ParquetDirectory(str(tmp_path))
    base: dict[str, Any] = {"name": "j", "source": source, "key": "key"}
    with pytest.raises(JobError, match=r"dedup_within_watermark needs event_time=EventTime"):
        Job(**base, dedup_within_watermark=True)
    with pytest.raises(JobError, match=r"give exactly one of aggregate=.*, process=fn or dedup"):
        Job(**base, aggregate=[agg.count()], event_time=EventTime("ts", 0),
            dedup_within_watermark=True)  # fmt: skip
    with pytest.raises(JobError, match="deduplicate in one job and window its output in another"):
        Job(**base, event_time=EventTime("ts", 0), window=tumbling(10),
            dedup_within_watermark=True)  # fmt: skip
    with pytest.raises(JobError, match="key column 'expires_at' clashes with the deduplication"):
        Job(**{**base, "key": ("expires_at",)}, event_time=EventTime("ts", 0),
            dedup_within_watermark=True)  # fmt: skip


# -- runs on the shared SparkSession ------------------------------------------------------


@pytest.fixture(scope="module")
def dedup_run(spark: Any, event_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Repository:
    """Deduplication by key, delay 5 s, p = 2: the run the others compare with."""
    return run(spark, dedup_job(event_dir), tmp_path_factory.mktemp("dedup"), "dedup")


@pytest.mark.spark
def test_dedup_equals_reference_with_late_records_and_forgotten_keys(
    dedup_run: Repository,
) -> None:
    expected, late = dedup_reference(event_frames(LAYOUT), ["key"], DELAY_MS)
    got = output(dedup_run, ["_epoch", "key"])
    pd.testing.assert_frame_equal(got[expected.columns], expected, check_dtype=False)
    # every key emitted again once forgotten, most records dropped as duplicates
    assert expected.groupby("key").size().min() > 1
    assert len(expected) < sum(len(f) for f in event_frames(LAYOUT)) // 5
    assert sum(late) > 20 and [w[3] for w in watermarks(dedup_run)] == late
    assert late_per_epoch(dedup_run, len(late)) == late
    # after the input, an epoch without records forgot the keys the watermark passed
    head = chain(dedup_run)[-1]
    assert head.stats["records_in"] == 0 and len(late) == LAYOUT.files + 1
    due = head.extra["event_time"]["due"]
    assert due and min(due.values()) > head.extra["event_time"]["watermark"]


@pytest.mark.spark
def test_parallelism_1_and_3_live_rescales_and_routings_are_byte_identical(
    spark: Any, event_dir: str, dedup_run: Repository, tmp_path: Path
) -> None:
    single = run(spark, dedup_job(event_dir), tmp_path, "single", p=1)
    rescaled = run_rescaled(spark, dedup_job(event_dir), tmp_path, "rescaled", (3, 1, 3, 2))
    shuffled = run(spark, dedup_job(event_dir), tmp_path, "shuffled", p=3, routing="shuffle")
    for repo in (single, rescaled, shuffled):
        assert ipc(output(repo, ["_epoch", "key"])) == ipc(output(dedup_run, ["_epoch", "key"]))
        assert watermarks(repo) == watermarks(dedup_run)
        assert dead_letters(repo) == dead_letters(dedup_run)


@pytest.mark.spark
def test_rollback_and_fork_remember_the_keys_of_their_epoch(
    spark: Any, event_dir: str, dedup_run: Repository, tmp_path: Path
) -> None:
    repo = run(spark, dedup_job(event_dir), tmp_path, "rollback", p=1)
    replay_rolled_back_and_forked(spark, dedup_job(event_dir), repo)
    for branch in ("main", "fork"):
        got = output(repo, ["_epoch", "key"], branch)
        assert ipc(got) == ipc(output(dedup_run, ["_epoch", "key"])), branch
        assert watermarks(repo, branch) == watermarks(dedup_run), branch


def _spark_dedup(
    spark: Any, frames: list[pd.DataFrame], root: Path, keys: list[str], delay: int
) -> pd.DataFrame:
    """Spark's withWatermark + dropDuplicatesWithinWatermark over the same input."""

    def query(stream: Any) -> Any:
        return with_watermark(stream, delay).dropDuplicatesWithinWatermark(keys).select(*COLUMNS)

    return micro_batches(spark, frames, root, query).sort_values(["key", "ts"])


def _records(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[COLUMNS].sort_values(["key", "ts"]).reset_index(drop=True)


@pytest.mark.spark
def test_emitted_records_equal_spark_structured_streaming(
    spark: Any, dedup_run: Repository, tmp_path: Path
) -> None:
    theirs = _spark_dedup(spark, event_frames(LAYOUT), tmp_path, ["key"], DELAY_MS)
    ours = _records(output(dedup_run, ["_epoch", "key"]))
    assert len(ours) > 150
    pd.testing.assert_frame_equal(ours, _records(theirs), check_dtype=False)


#: (key, value, seconds after BASE) per epoch, deduplicated by (key, value), delay 10 s
CRAFTED = [
    # W1 = 20: (a,1) remembered until 15, (b,1) until 30; the second (a,1) is a duplicate
    [("a", 1, 5), ("b", 1, 20), ("a", 1, 12), ("a", 2, 30)],
    # (a,1) forgotten (15 <= 20): emitted again, remembered until 31; (b,1) still a duplicate
    # though later in event time; (c,1) at 20 <= W1 is late; W2 = 35
    [("a", 1, 21), ("b", 1, 29), ("c", 1, 20), ("c", 1, 22), ("x", 1, 45)],
    # (b,1) forgotten (30 <= 35), (a,1) too (31 <= 35): both emitted again; W3 = 40, and an
    # epoch without input forgets (a,2) (40 <= 40)
    [("b", 1, 36), ("a", 1, 50), ("a", 1, 49)],
]


@pytest.mark.spark
def test_crafted_expiry_and_late_rule_equal_reference_and_spark(spark: Any, tmp_path: Path) -> None:
    frames = [
        pd.DataFrame([{"key": k, "value": v, "ts": BASE + s * 1000} for k, v, s in records])
        for records in CRAFTED
    ]
    directory = tmp_path / "in"
    for i, frame in enumerate(frames):
        table = pa.Table.from_pandas(frame, preserve_index=False)
        sources.write_parquet_file(str(directory), f"part-{i:05d}", table)
    repo = run(spark, dedup_job(str(directory), key=("key", "value"), delay_ms=10_000), tmp_path,
               "crafted", p=3)  # fmt: skip
    ours = output(repo, ["_epoch", "key", "value"])
    expected, late = dedup_reference(frames, ["key", "value"], 10_000)
    pd.testing.assert_frame_equal(
        ours[expected.columns], expected.sort_values(["_epoch", "key", "value"]).reset_index(
            drop=True), check_dtype=False)  # fmt: skip
    assert late == [0, 1, 0, 0]
    emitted = [(k, v, (t - BASE) // 1000, e) for k, v, t, e in
               ours[[*COLUMNS, "_epoch"]].itertuples(index=False)]  # fmt: skip
    assert emitted == [
        ("a", 1, 5, 1), ("a", 2, 30, 1), ("b", 1, 20, 1),  # the first of (a,1) only
        ("a", 1, 21, 2), ("c", 1, 22, 2), ("x", 1, 45, 2),
        ("a", 1, 50, 3), ("b", 1, 36, 3),
    ]  # fmt: skip
    theirs = _spark_dedup(spark, frames, tmp_path, ["key", "value"], 10_000)
    pd.testing.assert_frame_equal(_records(ours), _records(theirs), check_dtype=False)
