"""Event-time test data (out of order, some records late) and an independent reference of
windowed aggregation under the engine's watermark rule, computed with pandas over the whole
input; also the windowed job the crash harness runs (entry point ``window-job``)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa

from runners.engine import Job
from runners.engine import aggregations as agg
from runners.engine.eventtime import EventTime, Window, sliding
from runners.engine.sources import write_parquet_file
from tests.engine.jobs import DATA_ENV, SLOW_ENV, SlowParquet

EPOCH_MS = 10_000  # event time advances ~10 s per file
DELAY_MS = 5_000


@dataclass(frozen=True)
class Layout:
    files: int = 6
    keys: int = 60
    records: int = 500
    late_fraction: float = 0.03
    seed: int = 11


def event_frames(layout: Layout) -> list[pd.DataFrame]:
    """One frame per epoch: ``key`` (string), ``value`` (int64), ``ts`` (int64 ms). Event times
    of file i lie around ``[i * 10 s, (i + 1) * 10 s)`` shuffled and up to the delay early;
    `late_fraction` of them are 20 to 40 s old (late once the watermark passed them)."""
    rng = np.random.default_rng(layout.seed)
    frames = []
    for i in range(layout.files):
        n = layout.records
        ts = i * EPOCH_MS + rng.integers(0, EPOCH_MS, n) - rng.integers(0, DELAY_MS, n)
        late = rng.random(n) < layout.late_fraction
        ts[late] -= rng.integers(20_000, 40_000, int(late.sum()))
        frames.append(
            pd.DataFrame(
                {
                    "key": [f"k{k:03d}" for k in rng.integers(0, layout.keys, n)],
                    "value": rng.integers(-50, 1000, n).astype(np.int64),
                    "ts": (ts + 1_700_000_000_000).astype(np.int64),
                }
            )
        )
    return frames


def write_event_files(directory: str, layout: Layout, *, row_group_size: int | None = None) -> None:
    for i, frame in enumerate(event_frames(layout)):
        table = pa.Table.from_pandas(frame, preserve_index=False)
        if row_group_size is None:
            write_parquet_file(directory, f"part-{i:05d}", table)
        else:
            write_parquet_file(directory, f"part-{i:05d}", table, row_group_size=row_group_size)


def window_job(directory: str, window: Window | None = None, **overrides: object) -> Job:
    from runners.engine import sources

    options: dict[str, object] = {
        "name": "views",
        "source": sources.ParquetDirectory(directory, max_files_per_epoch=1, rows_per_split=200),
        "key": "key",
        "aggregate": [agg.count(), agg.sum("value"), agg.max("value")],
        "event_time": EventTime("ts", DELAY_MS),
        "window": window or sliding(10_000, 5_000),
        "time_mode": "logical",
    }
    options.update(overrides)
    return Job(**options)  # type: ignore[arg-type]


def crash_window_job() -> Job:
    """The windowed job of the crash tests: input from $EPOCHAL_TEST_DATA, each split read
    $EPOCHAL_TEST_SLOW_S slower so that a kill lands mid-epoch."""
    directory = os.environ[DATA_ENV]
    slow = float(os.environ.get(SLOW_ENV, "0"))
    return window_job(directory, source=SlowParquet(directory, rows_per_split=200, delay_s=slow))


def reference(
    frames: list[pd.DataFrame], size: int, slide: int, delay: int, mode: str = "append"
) -> tuple[pd.DataFrame, list[int]]:
    """(emitted rows with ``_epoch``, late records per epoch) of windowed count/sum/max under
    the rule: epoch e applies W(e-1) (no watermark before the first epoch): a (record, window)
    pair with ``end <= W(e-1)`` is dropped, a record left with none is late; append emits a
    window in the first epoch whose applied watermark reaches its end (one epoch without input
    follows the input while windows are due); update emits every window an epoch changed.
    W(e) = max(W(e-1), max event time read up to e - delay)."""
    watermark = None
    windows: dict[tuple[str, int], list[int]] = {}
    rows: list[dict[str, object]] = []
    late_counts: list[int] = []
    epoch = 0
    pending = list(frames)
    while pending or (
        watermark is not None and any(start + size <= watermark for _, start in windows)
    ):
        epoch += 1
        frame = pending.pop(0) if pending else pd.DataFrame({"key": [], "value": [], "ts": []})
        applied = watermark
        late = 0
        changed: set[tuple[str, int]] = set()
        for key, value, ts in zip(frame["key"], frame["value"], frame["ts"], strict=True):
            ts, value = int(ts), int(value)
            starts = [
                s for s in range(ts - ts % slide - size + slide, ts + 1, slide) if s > ts - size
            ]
            open_ = [s for s in starts if applied is None or s + size > applied]
            if not open_:
                late += 1
                continue
            for s in open_:
                acc = windows.setdefault((key, s), [0, 0, -(2**62)])
                acc[0] += 1
                acc[1] += value
                acc[2] = max(acc[2], value)
                changed.add((key, s))
        closing = [w for w in windows if applied is not None and w[1] + size <= applied]
        emit = closing if mode == "append" else sorted(changed)
        for key, s in emit:
            count, total, high = windows[(key, s)]
            rows.append({"key": key, "window_start": s, "window_end": s + size, "count": count,
                         "sum_value": total, "max_value": high, "_epoch": epoch})  # fmt: skip
        for w in closing:
            del windows[w]
        late_counts.append(late)
        if len(frame):
            high_ts = int(frame["ts"].max()) - delay
            watermark = high_ts if watermark is None else max(watermark, high_ts)
    out = pd.DataFrame(rows, columns=["key", "window_start", "window_end", "count", "sum_value",
                                      "max_value", "_epoch"])  # fmt: skip
    return out.sort_values(["_epoch", "key", "window_start"]).reset_index(drop=True), late_counts
