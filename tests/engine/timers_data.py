"""A per-key job with event-time and processing-time timers, and an independent reference of
what it emits under the engine's rules, computed in pure Python over the whole input.

The job: per key, a count per 10-second event-time window ending at ``end``; each record
registers an event-time timer at its window's end, which emits the window's count (a record
whose window the applied watermark already passed is emitted as ``late``); a window of
`ECHO_AT` records or more registers its timer again from ``on_timer`` (a time already passed:
it fires in the next epoch, as an ``echo``). Every key with input keeps one processing-time
timer `TICK_MS` ahead of the epoch that set it (a negative value resets it), which emits a
``tick``. A key with no open window holds only its timer: its state is the timer alone.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import pandas as pd

from runners.engine import Job, sources
from runners.engine.eventtime import EventTime
from runners.engine.state import EpochContext, KeyedState
from tests.engine.jobs import DATA_ENV, SLOW_ENV, SlowParquet
from tests.engine.windows_data import DELAY_MS, Layout

WINDOW_MS = 10_000
TICK_MS = 2_500
ECHO_AT = 3
LOGICAL_MS = 1_000
LAYOUT = Layout(files=7, keys=300, records=400, late_fraction=0.04, seed=23)
COLUMNS = ["_epoch", "key", "kind", "ts", "value"]


def _row(key: str, kind: str, ts: int, value: int) -> dict[str, Any]:
    return {"key": key, "kind": kind, "ts": ts, "value": value}


def process(
    key: str, records: list[dict[str, Any]], state: KeyedState, ctx: EpochContext
) -> Iterable[dict[str, Any]]:
    counts = state.map("counts")
    out = []
    for record in records:
        end = record["ts"] // WINDOW_MS * WINDOW_MS + WINDOW_MS
        if ctx.watermark_ms is not None and end <= ctx.watermark_ms:
            out.append(_row(key, "late", end, record["ts"]))
            continue
        counts.put(end, counts.get(end, 0) + 1)
        ctx.timers.register_event_time(end)
    ticks = [t for domain, t in ctx.timers.list() if domain == "processing"]
    if any(record["value"] < 0 for record in records):
        for t in ticks:
            ctx.timers.delete_processing_time(t)
        ticks = []
    if not ticks:
        ctx.timers.register_processing_time(ctx.processing_time_ms + TICK_MS)
    return out


def on_timer(
    key: str, timestamp_ms: int, state: KeyedState, ctx: EpochContext
) -> Iterable[dict[str, Any]]:
    if ctx.timer_domain == "processing":
        return [_row(key, "tick", timestamp_ms, ctx.processing_time_ms)]
    counts = state.map("counts")
    if timestamp_ms not in counts:
        return [_row(key, "echo", timestamp_ms, ctx.epoch)]
    n = counts.get(timestamp_ms)
    counts.remove(timestamp_ms)
    if not dict(counts.items()):
        counts.clear()  # no window open: the key's state is its timers alone
    if n >= ECHO_AT:
        ctx.timers.register_event_time(timestamp_ms)  # passed already: fires next epoch
    return [_row(key, "window", timestamp_ms, n)]


def timer_job(directory: str, **overrides: object) -> Job:
    options: dict[str, object] = {
        "name": "timers",
        "source": sources.ParquetDirectory(directory, max_files_per_epoch=1, rows_per_split=150),
        "key": "key",
        "process": process,
        "on_timer": on_timer,
        "event_time": EventTime("ts", DELAY_MS),
        "time_mode": "logical",
        "logical_epoch_ms": LOGICAL_MS,
    }
    options.update(overrides)
    return Job(**options)  # type: ignore[arg-type]


def crash_timer_job() -> Job:
    """The timers job of the crash test (entry point ``timer-job``): input from
    $EPOCHAL_TEST_DATA, each split read $EPOCHAL_TEST_SLOW_S slower so a kill lands mid-epoch."""
    directory = os.environ[DATA_ENV]
    slow = float(os.environ.get(SLOW_ENV, "0"))
    return timer_job(directory, source=SlowParquet(directory, rows_per_split=150, delay_s=slow))


def reference(frames: list[pd.DataFrame]) -> tuple[pd.DataFrame, list[int]]:
    """(rows with ``_epoch``, timers fired per epoch) under the rules: epoch e (processing time
    e seconds) applies W(e-1); the input first (per key, its records in order), then per key the
    timers due — event time ``<= W(e-1)``, processing time ``<= e s`` — in timestamp order; a
    timer registered by a firing timer waits for the next epoch. Epochs without input follow
    while a timer is due at the next epoch. W(e) = max(W(e-1), max event time read - delay)."""
    watermark: int | None = None
    counts: dict[str, dict[int, int]] = {}
    event: dict[str, set[int]] = {}
    ticks: dict[str, set[int]] = {}
    rows: list[dict[str, Any]] = []
    fired_per_epoch: list[int] = []
    pending = list(frames)
    epoch = 0

    def due(key: str, now: int) -> list[tuple[int, int]]:
        mark = watermark if watermark is not None else -(2**63)
        times = [(t, 0) for t in event.get(key, ()) if t <= mark]
        return sorted(times + [(t, 1) for t in ticks.get(key, ()) if t <= now])

    while pending or any(due(k, (epoch + 1) * LOGICAL_MS) for k in set(event) | set(ticks)):
        epoch += 1
        now = epoch * LOGICAL_MS
        frame = pending.pop(0) if pending else pd.DataFrame({"key": [], "value": [], "ts": []})
        for key, group in frame.groupby("key", sort=False):
            key = str(key)
            for ts in group["ts"].astype(int):
                end = ts // WINDOW_MS * WINDOW_MS + WINDOW_MS
                if watermark is not None and end <= watermark:
                    rows.append({"_epoch": epoch, **_row(key, "late", end, ts)})
                    continue
                counts.setdefault(key, {})[end] = counts.get(key, {}).get(end, 0) + 1
                event.setdefault(key, set()).add(end)
            if (group["value"] < 0).any():
                ticks[key] = set()
            if not ticks.get(key):
                ticks[key] = {now + TICK_MS}
        fired = 0
        for key in sorted(set(event) | set(ticks)):
            for ts, domain in due(key, now):
                fired += 1
                if domain == 1:
                    ticks[key].discard(ts)
                    rows.append({"_epoch": epoch, **_row(key, "tick", ts, now)})
                    continue
                event[key].discard(ts)
                if ts not in counts.get(key, {}):
                    rows.append({"_epoch": epoch, **_row(key, "echo", ts, epoch)})
                    continue
                n = counts[key].pop(ts)
                rows.append({"_epoch": epoch, **_row(key, "window", ts, n)})
                if n >= ECHO_AT:
                    event[key].add(ts)  # fires in the next epoch
        fired_per_epoch.append(fired)
        if len(frame):
            high = int(frame["ts"].max()) - DELAY_MS
            watermark = high if watermark is None else max(watermark, high)
    out = pd.DataFrame(rows, columns=COLUMNS)
    return out.sort_values(COLUMNS).reset_index(drop=True), fired_per_epoch
