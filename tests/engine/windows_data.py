"""Event-time test data (out of order, some records late) and an independent reference of
windowed aggregation under the engine's watermark rule, computed with pandas over the whole
input; also the windowed job the crash harness runs (entry point ``window-job``)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from runners.engine import Job
from runners.engine import aggregations as agg
from runners.engine.eventtime import EventTime, SessionWindow, Window, sliding
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


def window_job(
    directory: str, window: Window | SessionWindow | None = None, **overrides: object
) -> Job:
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
        frame, applied, late = _next_input(pending), watermark, 0
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
        watermark = _advance(watermark, frame, delay)
    out = pd.DataFrame(rows, columns=["key", "window_start", "window_end", "count", "sum_value",
                                      "max_value", "_epoch"])  # fmt: skip
    return out.sort_values(["_epoch", "key", "window_start"]).reset_index(drop=True), late_counts


def _next_input(pending: list[pd.DataFrame]) -> pd.DataFrame:
    """The next epoch's records (none once the input is read: an epoch closing state)."""
    return pending.pop(0) if pending else pd.DataFrame({"key": [], "value": [], "ts": []})


def _advance(watermark: int | None, frame: pd.DataFrame, delay: int) -> int | None:
    """W(e) = max(W(e-1), largest event time read up to e - delay)."""
    if not len(frame):
        return watermark
    high = int(frame["ts"].max()) - delay
    return high if watermark is None else max(watermark, high)


def _merged(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {"start": min(a["start"], b["start"]), "end": max(a["end"], b["end"]),
            "count": a["count"] + b["count"], "sum": a["sum"] + b["sum"],
            "max": max(a["max"], b["max"]), "changed": 1}  # fmt: skip


def session_reference(
    frames: list[pd.DataFrame], gap: int, delay: int, mode: str = "append"
) -> tuple[pd.DataFrame, list[int]]:
    """(emitted rows with ``_epoch``, late records per epoch) of session windows with
    count/sum/max, record by record: epoch e applies W(e-1); a record whose own ``[t, t + gap)``
    ends at or before it is late (Spark drops it before merging). First the sessions with
    ``end <= W(e-1)`` close (append emits them; Spark evicts them in the no-data batch the
    moved watermark runs); then each record's interval joins every open session of its key it
    overlaps or touches (``start <= end``), merging them; update emits the sessions the epoch
    changed. Epochs without input follow while sessions are due."""
    watermark = None
    sessions: dict[str, list[dict[str, int]]] = {}
    rows: list[dict[str, object]] = []
    late_counts: list[int] = []
    epoch = 0
    pending = list(frames)
    while pending or (
        watermark is not None and any(s["end"] <= watermark for v in sessions.values() for s in v)
    ):
        epoch += 1
        frame, applied, late = _next_input(pending), watermark, 0
        emit: list[tuple[str, dict[str, int]]] = []
        for key, v in sessions.items():  # sessions the watermark passed close first
            closing = [s for s in v if applied is not None and s["end"] <= applied]
            emit += [(key, s) for s in closing] if mode == "append" else []
            sessions[key] = [{**s, "changed": 0} for s in v if s not in closing]
        for key, value, ts in zip(frame["key"], frame["value"], frame["ts"], strict=True):
            ts, value = int(ts), int(value)
            if applied is not None and ts + gap <= applied:
                late += 1
                continue
            new = {"start": ts, "end": ts + gap, "count": 1, "sum": value, "max": value,
                   "changed": 1}  # fmt: skip
            apart = []
            for s in sessions.get(key, []):  # disjoint sessions: one pass merges them all
                if s["start"] <= new["end"] and new["start"] <= s["end"]:
                    new = _merged(s, new)
                else:
                    apart.append(s)
            sessions[key] = [*apart, new]
        if mode == "update":
            emit = [(key, s) for key, v in sessions.items() for s in v if s["changed"]]
        rows += [{"key": key, "window_start": s["start"], "window_end": s["end"],
                  "count": s["count"], "sum_value": s["sum"], "max_value": s["max"],
                  "_epoch": epoch} for key, s in emit]  # fmt: skip
        late_counts.append(late)
        watermark = _advance(watermark, frame, delay)
    out = pd.DataFrame(rows, columns=["key", "window_start", "window_end", "count", "sum_value",
                                      "max_value", "_epoch"])  # fmt: skip
    return out.sort_values(["_epoch", "key", "window_start"]).reset_index(drop=True), late_counts


def dedup_reference(
    frames: list[pd.DataFrame], keys: list[str], delay: int
) -> tuple[pd.DataFrame, list[int]]:
    """(emitted records with ``_epoch``, late records per epoch) of deduplication within the
    watermark, record by record: epoch e applies W(e-1); a record with ``t <= W(e-1)`` is late;
    keys whose first record's ``t + delay <= W(e-1)`` are forgotten; a record of a key not
    remembered is emitted and its key remembered until ``t + delay``, the others dropped."""
    watermark = None
    remembered: dict[tuple[Any, ...], int] = {}
    rows: list[dict[str, object]] = []
    late_counts: list[int] = []
    epoch = 0
    pending = list(frames)
    while pending or (watermark is not None and any(e <= watermark for e in remembered.values())):
        epoch += 1
        frame, applied, late = _next_input(pending), watermark, 0
        if applied is not None:
            remembered = {k: e for k, e in remembered.items() if e > applied}
        for record in frame.to_dict("records"):
            ts = int(record["ts"])
            if applied is not None and ts <= applied:
                late += 1
                continue
            key = tuple(record[k] for k in keys)
            if key in remembered:
                continue
            remembered[key] = ts + delay
            rows.append({**record, "_epoch": epoch})
        late_counts.append(late)
        watermark = _advance(watermark, frame, delay)
    out = pd.DataFrame(rows, columns=[*frames[0].columns, "_epoch"])
    return out.sort_values(["_epoch", *keys]).reset_index(drop=True), late_counts
