"""Interval joins (docs/engine.md "Interval joins"): inner and left outer stream-stream joins
within a time bound, against an independent pandas reference over out-of-order input with
late rows — the rows, their epochs, the late counts and the buffered state after every epoch
(cleaned once the watermark passes what can still match) — at parallelism 1 and 2, across
live rescales and a fork; against Spark's own stream-stream join; declarations the engine
cannot run are refused naming the fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from runners.engine import EpochRunner, Job, JobError, read_dead_letters, read_output, sources
from runners.engine import aggregations as agg
from runners.engine.eventtime import EventTime, EventTimeError, IntervalJoin
from runners.engine.state.restore import load_key_groups
from runners.engine.state_ops import new_branch_commit
from snapshots_store import Repository
from tests.engine.event_runs import chain as _chain
from tests.engine.event_runs import ipc as _ipc
from tests.engine.event_runs import watermarks as _watermarks
from tests.engine.spark_streaming import run_batches

pytestmark = pytest.mark.spark

FILES, KEYS = 5, 40
LOWER, UPPER, DELAY = 2_000, 6_000, 3_000
T0 = 1_700_000_000_000
COLUMNS = ["ad", "left_ts", "left_value", "right_ts", "right_value"]


def side_frames(
    seed: int, rows: int, shift_ms: int, late_share: float = 0.05
) -> list[pd.DataFrame]:
    """One frame per epoch: ``ad``, ``ts`` (ms, ~10 s per file, out of order by up to 4 s,
    shifted by up to `shift_ms`), ``value``; `late_share` of the rows 15 to 30 s old (late
    once the watermark passed them)."""
    rng = np.random.default_rng(seed)
    frames = []
    for i in range(FILES):
        ts = i * 10_000 + rng.integers(0, 10_000, rows) - rng.integers(0, 4_000, rows)
        ts += rng.integers(0, shift_ms + 1, rows)
        late = rng.random(rows) < late_share
        ts[late] -= rng.integers(15_000, 30_000, int(late.sum()))
        frames.append(pd.DataFrame({
            "ad": [f"ad{k:02d}" for k in rng.integers(0, KEYS, rows)],
            "ts": (ts + T0).astype(np.int64),
            "value": rng.integers(0, 1_000, rows).astype(np.int64),
        }))  # fmt: skip
    return frames


LEFT = side_frames(5, 60, 0)


def right_frames(seed: int, late_share: float = 0.05) -> list[pd.DataFrame]:
    """The right side: 80 rows per file, up to 5 s later; its value is a float (each side
    keeps its own type under its prefix)."""
    return [f.assign(value=f["value"] / 10) for f in side_frames(seed, 80, 5_000, late_share)]


RIGHT = right_frames(6)


def reference(how: str) -> tuple[pd.DataFrame, list[int], list[int]]:
    """(joined rows with `_epoch`, late rows per epoch, buffered rows after each epoch) by
    the join's rules, computed with pandas over the whole input: epoch e reads file e - 1 of
    both sides and applies the watermark after epoch e - 1 (the minimum over both sides of
    their largest event time, minus the delay); a row at or below it is late; a left row
    leaves the state once ``ts + upper <= W``, a right row once ``ts + lower <= W``; one that
    matched nothing is emitted then, null-padded; one epoch without input follows the last
    file to expire what the last watermark passed."""
    applied, after, highs = [], None, {}
    kept: dict[str, list[pd.DataFrame]] = {"left": [], "right": []}
    late = []
    for e in range(1, FILES + 1):
        applied.append(after)
        n = 0
        for side, frames in (("left", LEFT), ("right", RIGHT)):
            frame = frames[e - 1]
            ok = frame if after is None else frame[frame["ts"] > after]
            n += len(frame) - len(ok)
            kept[side].append(ok.assign(_in=e))
            highs[side] = max(highs.get(side, ok["ts"].max()), ok["ts"].max())
        late.append(n)
        mark = min(highs.values()) - DELAY
        after = mark if after is None else max(after, mark)
    applied.append(after)  # epoch FILES + 1, without input
    left, right = pd.concat(kept["left"]), pd.concat(kept["right"])
    pairs = left.merge(right, on="ad", suffixes=("_l", "_r"))
    pairs = pairs[
        (pairs["ts_l"] - LOWER <= pairs["ts_r"]) & (pairs["ts_r"] <= pairs["ts_l"] + UPPER)
    ]
    out = pd.DataFrame({
        "ad": pairs["ad"], "left_ts": pairs["ts_l"], "left_value": pairs["value_l"],
        "right_ts": pairs["ts_r"], "right_value": pairs["value_r"],
        "_epoch": np.maximum(pairs["_in_l"], pairs["_in_r"]),
    })  # fmt: skip

    def expiry_epoch(expires: int, arrived: int) -> int | None:
        for e in range(arrived + 1, FILES + 2):
            if applied[e - 1] is not None and applied[e - 1] >= expires:
                return e
        return None

    if how == "left":
        matched = set(zip(pairs["ad"], pairs["ts_l"], pairs["value_l"], strict=True))
        alone = [r for r in left.itertuples() if (r.ad, r.ts, r.value) not in matched]
        padded = [
            {"ad": r.ad, "left_ts": r.ts, "left_value": r.value, "right_ts": np.nan,
             "right_value": np.nan, "_epoch": expiry_epoch(r.ts + UPPER, r._4)}
            for r in alone
        ]  # fmt: skip
        rows = pd.DataFrame([p for p in padded if p["_epoch"] is not None])
        out = pd.concat([out.astype({"right_ts": "float64"}), rows.astype({"_epoch": "int64"})])
    buffered = []
    for e in range(1, FILES + 2):
        mark = applied[e - 1]
        alive = 0
        for frame, bound in ((left, UPPER), (right, LOWER)):
            arrived = frame[frame["_in"] <= e]
            alive += int(((arrived["ts"] + bound) > (mark if mark is not None else -1)).sum())
        buffered.append(alive)
    return _sorted(out), late, buffered


def _sorted(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame[["_epoch", *COLUMNS]].astype({"_epoch": "int64"})
    return frame.sort_values(["_epoch", *COLUMNS], na_position="first").reset_index(drop=True)


def join_job(root: str, how: str, delay_ms: int = DELAY) -> Job:
    def side(name: str) -> sources.ParquetDirectory:
        return sources.ParquetDirectory(f"{root}/{name}", max_files_per_epoch=1)

    join = IntervalJoin(left=side("impressions"), right=side("clicks"), on="ad",
                        left_time="ts", right_time="ts", lower_ms=LOWER, upper_ms=UPPER,
                        how=how, delay_ms=delay_ms)  # fmt: skip
    return Job(name=f"join-{how}", source=join, key="ad", time_mode="logical")


def _write(root: Path, left: list[pd.DataFrame], right: list[pd.DataFrame]) -> str:
    for name, frames in (("impressions", left), ("clicks", right)):
        for i, frame in enumerate(frames):
            table = pa.Table.from_pandas(frame, preserve_index=False)
            sources.write_parquet_file(str(root / name), f"part-{i:05d}", table)
    return str(root)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> str:
    return _write(tmp_path_factory.mktemp("join"), LEFT, RIGHT)


def _run(spark: Any, job: Job, root: Path, name: str, p: int) -> Repository:
    repo = Repository.open(f"file://{root}/store", name)
    EpochRunner(spark, job, repo=repo, parallelism=p).run()
    return repo


def _output(repo: Repository, branch: str = "main") -> pd.DataFrame:
    return _sorted(read_output(repo, branch).to_pandas())


def _buffered(repo: Repository, branch: str = "main") -> list[int]:
    """The rows every commit's snapshot keeps in the join's state."""
    counts = []
    for manifest in _chain(repo, branch):
        states, _ = load_key_groups(repo, manifest.key_groups, ["ad"])
        counts.append(sum(s.table.num_rows for s in states.values()))
    return counts


@pytest.fixture(scope="module")
def runs(spark: Any, inputs: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("runs")
    return {how: _run(spark, join_job(inputs, how), root, how, p=2) for how in ("inner", "left")}


@pytest.mark.parametrize("how", ["inner", "left"])
def test_the_join_equals_the_pandas_reference_and_cleans_its_state(
    runs: dict[str, Repository], how: str
) -> None:
    repo = runs[how]
    expected, late, buffered = reference(how)
    got = _output(repo)
    pd.testing.assert_frame_equal(got, expected, check_dtype=False)
    assert len(expected) > 100 and sum(late) > 10  # the data joins and has late rows
    marks = _watermarks(repo)
    assert [m[0] for m in marks] == list(range(1, FILES + 2))  # and one epoch without input
    assert [m[3] for m in marks] == [*late, 0]
    # both sides' backlog: the files not read yet (one of each side per epoch), their rows
    chain = _chain(repo)
    assert [m.stats["backlog_epochs"] for m in chain] == [*range(FILES - 1, -1, -1), 0]
    assert chain[0].stats["backlog_records"] == sum(len(f) for f in LEFT[1:] + RIGHT[1:])
    dead = read_dead_letters(repo, "main").to_pandas()
    assert set(dead["reason"]) == {"late"} and len(dead) == sum(late)
    # the buffered rows shrink once the watermark passes what can still match
    assert _buffered(repo) == buffered
    assert buffered[-1] < max(buffered) / 2
    if how == "left":
        assert got["right_ts"].isna().sum() > 10  # unmatched left rows were emitted


def test_parallelism_1_and_live_rescales_give_the_same_output(
    spark: Any, inputs: str, runs: dict[str, Repository], tmp_path: Path
) -> None:
    single = _run(spark, join_job(inputs, "left"), tmp_path, "single", p=1)
    assert _ipc(_output(single)) == _ipc(_output(runs["left"]))
    repo = Repository.open(f"file://{tmp_path}/store", "rescaled")
    runner = EpochRunner(spark, join_job(inputs, "left"), repo=repo, parallelism=2)
    version = None
    for p in (2, 3, 1, 2, 3):
        version = repo.write_control("main", {"parallelism": p}, version)
        result = runner.run_epoch()
        assert result is not None and result.parallelism == p
    runner.run()  # the epoch without input
    assert _ipc(_output(repo)) == _ipc(_output(runs["left"]))
    assert _watermarks(repo) == _watermarks(runs["left"])
    assert _buffered(repo) == _buffered(runs["left"])


def test_a_fork_carries_the_buffered_rows_and_replays_the_same_output(
    spark: Any, inputs: str, runs: dict[str, Repository]
) -> None:
    repo = runs["left"]
    second = next(sid for sid, m in repo.log("heads/main", first_parent=True) if m.epoch == 2)
    new_branch_commit(repo, second, "fork", kind="fork", operation_id=None,
                      provenance={"reason": "replay"})  # fmt: skip
    assert _buffered(repo, "fork")[-1] == _buffered(repo)[1] > 0  # the rows of epoch 2
    EpochRunner(spark, join_job(inputs, "left"), repo=repo, branch="fork", parallelism=3).run()
    assert _ipc(_output(repo, "fork")) == _ipc(_output(repo))
    assert _watermarks(repo, "fork") == _watermarks(repo)


def test_a_side_without_rows_holds_the_watermark(spark: Any, tmp_path: Path) -> None:
    """Spark's policy "min" counts an input without data at the lowest watermark: until the
    right side brings rows, nothing is late and no left row is given up unmatched."""
    root = tmp_path / "in"
    _write(root, LEFT[:3], [])
    repo = Repository.open(f"file://{tmp_path}/store", "held")
    runner = EpochRunner(spark, join_job(str(root), "left"), repo=repo, parallelism=2)
    assert runner.run_epoch() and runner.run_epoch() and runner.run_epoch()
    assert [w[2] for w in _watermarks(repo)] == [None, None, None]
    assert read_output(repo, "main").num_rows == 0
    _write(root, [], RIGHT[:1])
    runner.run_epoch()  # the right side's first rows: now both sides bound it
    highs = [max(f["ts"].max() for f in LEFT[:3]), RIGHT[0]["ts"].max()]
    assert _watermarks(repo)[-1][2] == min(highs) - DELAY


def test_join_declarations_the_engine_cannot_run_are_refused(tmp_path: Path) -> None:
    side = sources.ParquetDirectory(str(tmp_path))
    base: dict[str, Any] = {"left": side, "right": side, "on": "ad", "left_time": "ts",
                            "right_time": "ts", "lower_ms": 0, "upper_ms": 10}  # fmt: skip
    with pytest.raises(EventTimeError, match=r"matches nothing: give lower_ms \+ upper_ms >= 0"):
        IntervalJoin(**{**base, "lower_ms": -20})
    with pytest.raises(EventTimeError, match="how must be one of"):
        IntervalJoin(**base, how="outer")
    with pytest.raises(EventTimeError, match="neither may start with the other"):
        IntervalJoin(**base, prefixes=("l_", "l_r_"))
    join = IntervalJoin(**base)
    with pytest.raises(JobError, match=r"key \['user'\] must be the join's on=\['ad'\]"):
        Job(name="j", source=join, key="user")
    with pytest.raises(JobError, match="give neither aggregate, process nor window"):
        Job(name="j", source=join, key="ad", aggregate=[agg.count()])
    with pytest.raises(JobError, match="leave event_time out"):
        Job(name="j", source=join, key="ad", event_time=EventTime("ts", 0))
    assert Job(name="j", source=join, key="ad").event_time == join.event_time


def _spark_join(spark: Any, root: Path, left: list[pd.DataFrame], right: list[pd.DataFrame],
                delay_ms: int) -> pd.DataFrame:  # fmt: skip
    """Spark's own left outer stream-stream join (withWatermark on both sides, the same time
    range) over the same files, one file of each side per micro-batch (each followed by the
    no-data batch a moved watermark asks for)."""
    from pyspark.sql import functions as F

    def side(name: str, prefix: str) -> Any:
        (root / name).mkdir(parents=True, exist_ok=True)
        value = "long" if prefix == "l" else "double"
        return (
            spark.readStream.schema(f"ad string, ts long, value {value}")
            .option("maxFilesPerTrigger", 1)
            .parquet(str(root / name))
            .select(F.col("ad").alias(f"{prefix}_ad"), F.col("ts").alias(f"{prefix}_ts"),
                    F.col("value").alias(f"{prefix}_value"),
                    F.timestamp_millis("ts").alias(f"{prefix}_t"))
            .withWatermark(f"{prefix}_t", f"{delay_ms} milliseconds")
        )  # fmt: skip

    condition = F.expr(
        f"l_ad = r_ad AND r_t >= l_t - interval {LOWER} milliseconds "
        f"AND r_t <= l_t + interval {UPPER} milliseconds"
    )
    joined = side("impressions", "l").join(side("clicks", "r"), condition, "leftOuter").select(
        F.col("l_ad").alias("ad"), F.col("l_ts").alias("left_ts"),
        F.col("l_value").alias("left_value"), F.col("r_ts").alias("right_ts"),
        F.col("r_value").alias("right_value"),
    )  # fmt: skip
    dirs = (root / "impressions", root / "clicks")
    batches = [{dirs[0]: left[i], dirs[1]: right[i]} for i in range(FILES)]
    rows = run_batches(spark, joined, root / "checkpoint", batches)
    return pd.DataFrame(rows, columns=COLUMNS)


def test_the_left_join_equals_spark_stream_stream_join(spark: Any, tmp_path: Path) -> None:
    """Without late rows (a delay larger than the disorder) the pairs and the null-padded
    rows equal Spark's left outer join over the same micro-batches."""
    left = side_frames(7, 60, 0, late_share=0.0)
    right = right_frames(8, late_share=0.0)
    delay = 15_000
    ours = _run(spark, join_job(_write(tmp_path / "in", left, right), "left", delay),
                tmp_path, "vs-spark", p=2)  # fmt: skip
    assert read_dead_letters(ours, "main").num_rows == 0
    theirs = _spark_join(spark, tmp_path / "spark", left, right, delay)
    frames = (_output(ours).drop(columns="_epoch"), theirs.astype({"right_ts": "float64"}))
    mine, theirs = (f.sort_values(COLUMNS, na_position="first").reset_index(drop=True)
                    for f in frames)  # fmt: skip
    pd.testing.assert_frame_equal(mine, theirs, check_dtype=False)
    assert mine["right_ts"].isna().sum() > 10 and mine["right_ts"].notna().sum() > 100
