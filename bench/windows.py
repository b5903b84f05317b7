"""Sliding-window count/sum with a watermark in append mode: the engine against Spark
Structured Streaming's built-in windowed aggregation, on the same input in the same process
(part ``windows``); and tumbling windows written with event-time timers in a per-key function
against Spark's ``transformWithStateInPandas`` with event-time timers (part ``timers``,
bench/windows_timers.py: ``ratio_vs_spark_transform_with_state``, target ≥ 10). ``--parts``
picks them (default both).

Input: `--epochs` Parquet files of `--records` records each (one file = one epoch = one Spark
micro-batch), keys drawn uniformly from `--keys`, event times of epoch e spread over the minute
``[e min, (e + 1) min)`` and shifted up to the delay (10 s) earlier: out of order, never late.
Job: windows of 60 s sliding by 30 s, watermark delay 10 s, ``count`` and ``sum(value)`` per
key and window, append mode (one final row per key and window once the watermark passes its
end).

- ``engine``: `EpochRunner` at p = 2 over the files (``runners.engine.eventtime``), committing
  every epoch to a snapshot store; its last epoch has no input and closes the windows the
  input's watermark passed.
- ``spark_windowed``: ``readStream.parquet`` (``maxFilesPerTrigger=1``) →
  ``withWatermark("t", "10 seconds")`` → ``groupBy(window("t", "60 seconds", "30 seconds"),
  "key").agg(count, sum)`` in append mode on the default (HDFS-backed) state store,
  ``trigger(availableNow=True)``, a ``foreachBatch`` sink writing each batch's rows to Parquet.

Figure: ``ratio_vs_spark_windowed`` = Spark's wall seconds ÷ the engine's, from the start of
the run until its last row is durably written, per run; the verdict is the median over
`--runs` runs (each runs both variants). Checks: the checksum of all emitted rows (key, window,
count, sum) is equal for both variants and for a numpy reference computed from the generator's
arrays; the engine dropped no record as late. The timers part: `--timer-keys`,
`--timer-records`, `--timer-epochs` (default 10,000 / 20,000 / 4: a few minutes per run on a
loaded 2-core box, Spark's peer being the slow side), the same checks against a tumbling
reference. Exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bench import windows_timers as timers
from bench.checksum import from_arrays
from bench.datagen import key_strings
from bench.engine import DRIVER_MEMORY, REPO_ROOT, effective_jvm, prepare_environment
from bench.spark_peers import (
    ROCKSDB_PROVIDER,
    WINDOW_ROWS,
    run_append_stream,
    watermarked_source,
)
from bench.timing import code_version

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SIZE_MS, SLIDE_MS, DELAY_MS = 60_000, 30_000, 10_000
EPOCH_SPAN_MS = 60_000
BASE_TS = 1_790_000_000_000
PARALLELISM = 2
TARGET = 3.0
SCHEMA = pa.schema([("key", pa.string()), ("value", pa.int64()), ("ts", pa.int64())])


def log(message: str) -> None:
    print(f"[bench.windows {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Input:
    directory: Path
    keys: int
    records: int
    epochs: int
    seed: int = 5

    def arrays(self, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(key ids, values, event times) of an epoch, from its own seed."""
        rng = np.random.default_rng([self.seed, epoch])
        ids = rng.integers(0, self.keys, self.records)
        values = rng.integers(0, 1_000, self.records).astype(np.int64)
        jitter = rng.integers(0, DELAY_MS, self.records)
        ts = BASE_TS + epoch * EPOCH_SPAN_MS + rng.integers(0, EPOCH_SPAN_MS, self.records) - jitter
        return ids, values, ts.astype(np.int64)

    def write(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        names = key_strings(self.keys)
        for e in range(self.epochs):
            ids, values, ts = self.arrays(e)
            table = pa.table([names.take(pa.array(ids)), values, ts], schema=SCHEMA)
            tmp = self.directory / f".epoch-{e:05d}.parquet"
            pq.write_table(table, tmp, row_group_size=1 << 17)
            os.replace(tmp, self.directory / f"epoch-{e:05d}.parquet")


def window_checksum(key_crc: np.ndarray, starts_ms: Any, counts: Any, sums: Any) -> dict[str, int]:
    """bench.checksum's row hash over (key, count, sum, window start in seconds)."""
    c = from_arrays(
        key_crc,
        np.asarray(counts, dtype=np.int64),
        np.asarray(sums, dtype=np.int64),
        np.asarray(starts_ms, dtype=np.int64) // 1000,
    )
    return {
        "rows": c.rows,
        "sum_count": c.sum_count,
        "sum_sum": c.sum_sum,
        "sum_window_start_s": c.sum_max,
        "row_hash": c.row_hash,
    }


def key_crc(keys: int) -> np.ndarray:
    import zlib

    return np.fromiter(
        (zlib.crc32(k.encode()) for k in key_strings(keys).to_pylist()), np.int64, count=keys
    )


def reference_checksum(
    data: Input, crc: np.ndarray, *, size_ms: int = SIZE_MS, slide_ms: int = SLIDE_MS
) -> dict[str, int]:
    """Every (key, window) that ends at or before the final watermark, from the arrays."""
    parts, high = [], np.iinfo(np.int64).min
    for e in range(data.epochs):
        ids, values, ts = data.arrays(e)
        high = max(high, int(ts.max()))
        last = ts // slide_ms * slide_ms
        for back in range(-(-size_ms // slide_ms)):
            start = last - back * slide_ms
            inside = start + size_ms > ts
            parts.append((ids[inside], start[inside], values[inside]))
    ids = np.concatenate([p[0] for p in parts])
    starts = np.concatenate([p[1] for p in parts])
    values = np.concatenate([p[2] for p in parts])
    closed = starts + size_ms <= high - DELAY_MS
    ids, starts, values = ids[closed], starts[closed], values[closed]
    slot = (starts - BASE_TS) // slide_ms + 2
    pair = ids.astype(np.int64) * (int(slot.max()) + 1) + slot
    uniq, inverse = np.unique(pair, return_inverse=True)
    counts = np.bincount(inverse).astype(np.int64)
    sums = np.bincount(inverse, weights=values).astype(np.int64)
    first = np.zeros(len(uniq), dtype=np.int64)
    first[inverse] = np.arange(len(inverse))
    return window_checksum(crc[ids[first]], starts[first], counts, sums)


def _table_checksum(table: pa.Table, names: pa.Array, crc: np.ndarray) -> dict[str, int]:
    ids = pc.index_in(table.column("key"), value_set=names).to_numpy()
    return window_checksum(
        crc[ids],
        table.column("window_start").to_numpy(),
        table.column("count").to_numpy(),
        table.column("sum_value").to_numpy(),
    )


def run_engine(
    spark: SparkSession, data: Input, work: Path, run: int, gap_ms: int | None = None
) -> tuple[float, pa.Table, dict[str, Any]]:
    """The engine's run over `data` (sliding windows; with `gap_ms`, sessions: bench.sessions)."""
    from runners.engine import EpochRunner, Job, read_output, sources
    from runners.engine import aggregations as agg
    from runners.engine.eventtime import EventTime, session, sliding
    from snapshots_store import Repository

    store = work / f"store-{run}"
    shutil.rmtree(store, ignore_errors=True)
    repo = Repository.open(f"file://{store}", "windows")
    job = Job(
        name="windows",
        source=sources.ParquetDirectory(str(data.directory), max_files_per_epoch=1),
        key="key",
        aggregate=[agg.count(), agg.sum("value")],
        event_time=EventTime("ts", DELAY_MS),
        window=sliding(SIZE_MS, SLIDE_MS) if gap_ms is None else session(gap_ms),
    )
    t0 = time.perf_counter()
    results = EpochRunner(spark, job, repo=repo, parallelism=PARALLELISM).run()
    seconds = time.perf_counter() - t0
    late = sum(
        int(m.stats.get("late_records", 0)) for _, m in repo.log("heads/main", first_parent=True)
    )
    detail = {
        "epochs": len(results),
        "epoch_s": [round(r.duration_s, 3) for r in results],
        "late_records": late,
    }
    table = read_output(repo, "main")
    shutil.rmtree(store, ignore_errors=True)
    return seconds, table, detail


def run_spark(
    spark: SparkSession, data: Input, work: Path, gap_ms: int | None = None
) -> tuple[float, pa.Table, dict[str, Any]]:
    """Spark's run over `data`: groupBy(window(...)) (with `gap_ms`, session_window(...))."""
    from pyspark.sql import functions as F

    if gap_ms is None:
        size, slide = f"{SIZE_MS // 1000} seconds", f"{SLIDE_MS // 1000} seconds"
        window, column = F.window("t", size, slide), "window"
    else:
        window, column = F.session_window("t", f"{gap_ms} milliseconds"), "session_window"
    stream = (
        watermarked_source(spark, data.directory, DELAY_MS)
        .groupBy(window, "key")
        .agg(F.count(F.lit(1)).alias("count"), F.sum("value").alias("sum_value"))
        .select("key", F.unix_millis(f"{column}.start").alias("window_start"), "count", "sum_value")
    )
    return run_append_stream(stream, work, f"spark_{column}", WINDOW_ROWS)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.windows", description=__doc__.split("\n")[0])
    p.add_argument("--parts", default="windows,timers", help="windows, timers or both")
    p.add_argument("--keys", type=int, default=1_000_000)
    p.add_argument("--records", type=int, default=1_000_000, help="records per epoch")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--timer-keys", type=int, default=10_000, help="timers part: distinct keys")
    p.add_argument("--timer-records", type=int, default=20_000, help="timers part: per epoch")
    p.add_argument("--timer-epochs", type=int, default=4, help="timers part: epochs")
    p.add_argument("--runs", type=int, default=3, help="runs of both variants (verdict: median)")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--work-dir", help="data and stores (kept when given)")
    args = p.parse_args(argv)
    for name in (
        "keys",
        "records",
        "epochs",
        "timer_keys",
        "timer_records",
        "timer_epochs",
        "runs",
    ):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    args.parts = [x.strip() for x in args.parts.split(",") if x.strip()]
    unknown = set(args.parts) - {"windows", "timers"}
    if unknown or not args.parts:
        p.error(f"--parts takes windows and/or timers, not {sorted(unknown) or args.parts}")
    return args


Variant = Callable[[int], tuple[float, pa.Table, dict[str, Any]]]


def compare(
    variants: dict[str, Variant],
    runs: int,
    expected: dict[str, int],
    keys: int,
    ratio: str,
    problems: list[str],
) -> list[dict[str, Any]]:
    """Every run of the variants (the first is the engine, the second the peer; the order
    alternates), with checksums checked against `expected`; `ratio` = peer s ÷ engine s."""
    names, crc = key_strings(keys), key_crc(keys)
    engine, peer = list(variants)
    figures_of_runs = []
    for run in range(1, runs + 1):
        order = (engine, peer) if run % 2 else (peer, engine)
        figures: dict[str, Any] = {"run": run, "order": list(order)}
        for variant in order:
            load = os.getloadavg()
            seconds, table, detail = variants[variant](run)
            checksum = _table_checksum(table, names, crc)
            figures[variant] = {
                "seconds": round(seconds, 3),
                "checksum": checksum,
                "loadavg_before": [round(x, 2) for x in load],
                **detail,
            }
            log(f"run {run} {variant}: {seconds:.2f} s, {checksum['rows']:,} rows")
            if checksum != expected:
                problems.append(f"run {run} {variant}: checksum {checksum} != reference {expected}")
        if figures[engine].get("late_records"):
            problems.append(f"run {run} {engine}: {figures[engine]['late_records']} late records")
        figures[ratio] = round(figures[peer]["seconds"] / figures[engine]["seconds"], 3)
        figures_of_runs.append(figures)
    return figures_of_runs


def _median(runs: list[dict[str, Any]], *path: str) -> float | None:
    values = []
    for r in runs:
        value: Any = r
        for step in path:
            value = value[step]
        values.append(value)
    return statistics.median(values) if values else None


def windows_part(spark: SparkSession, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Sliding windows: the engine against Spark's windowed aggregation."""
    data = Input(work / "in", args.keys, args.records, args.epochs)
    log(f"windows: {args.epochs} epochs of {args.records:,} records over {args.keys:,} keys")
    data.write()
    expected = reference_checksum(data, key_crc(args.keys))
    # warm-up, untimed: Python workers, imports and Spark's code generation of both
    warm = Input(work / "warm", 2_000, 2_000, 2)
    warm.write()
    run_engine(spark, warm, work, 0)
    run_spark(spark, warm, work)
    problems: list[str] = []
    variants: dict[str, Variant] = {
        "engine": lambda run: run_engine(spark, data, work, run),
        "spark_windowed": lambda run: run_spark(spark, data, work),
    }
    runs = compare(variants, args.runs, expected, args.keys, "ratio_vs_spark_windowed", problems)
    ratio = _median(runs, "ratio_vs_spark_windowed")
    return {
        "ratio_vs_spark_windowed": ratio,
        "target": TARGET,
        "met": ratio is not None and ratio >= TARGET,
        "engine_s_median": _median(runs, "engine", "seconds"),
        "spark_windowed_s_median": _median(runs, "spark_windowed", "seconds"),
        "sizes": {
            "keys": args.keys,
            "records_per_epoch": args.records,
            "epochs": args.epochs,
            "window_ms": SIZE_MS,
            "slide_ms": SLIDE_MS,
            "delay_ms": DELAY_MS,
        },
        "reference_checksum": expected,
        "problems": problems,
        "runs": runs,
    }


def timers_part(spark: SparkSession, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Tumbling windows with event-time timers: the per-key path against Spark's
    transformWithStateInPandas (bench/windows_timers.py)."""
    data = Input(work / "timers-in", args.timer_keys, args.timer_records, args.timer_epochs)
    log(f"timers: {data.epochs} epochs of {data.records:,} records over {data.keys:,} keys")
    data.write()
    size = timers.SIZE_MS
    expected = reference_checksum(data, key_crc(data.keys), size_ms=size, slide_ms=size)
    warm = Input(work / "timers-warm", 500, 500, 2)
    warm.write()
    timers.run_engine(spark, warm.directory, DELAY_MS, PARALLELISM, work / "timers-store")
    timers.run_spark(spark, warm.directory, DELAY_MS, work)
    problems: list[str] = []
    ratio_name = "ratio_vs_spark_transform_with_state"
    variants: dict[str, Variant] = {
        "engine_timers": lambda run: timers.run_engine(
            spark, data.directory, DELAY_MS, PARALLELISM, work / f"timers-store-{run}"
        ),
        "spark_transform_with_state": lambda run: timers.run_spark(
            spark, data.directory, DELAY_MS, work
        ),
    }
    runs = compare(variants, args.runs, expected, data.keys, ratio_name, problems)
    ratio = _median(runs, ratio_name)
    return {
        ratio_name: ratio,
        "target": timers.TARGET,
        "met": ratio is not None and ratio >= timers.TARGET,
        "engine_timers_s_median": _median(runs, "engine_timers", "seconds"),
        "spark_transform_with_state_s_median": _median(
            runs, "spark_transform_with_state", "seconds"
        ),
        "sizes": {
            "keys": data.keys,
            "records_per_epoch": data.records,
            "epochs": data.epochs,
            "total_records": data.records * data.epochs,
            "window_ms": size,
            "delay_ms": DELAY_MS,
        },
        "peer_settings": {
            "state_store": ROCKSDB_PROVIDER,
            "time_mode": "EventTime",
            "output_mode": "Append",
        },
        "reference_checksum": expected,
        "problems": problems,
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    prepare_environment()
    keep = args.work_dir is not None
    work = Path(args.work_dir) if keep else Path(tempfile.mkdtemp(prefix="bench-windows-"))
    work.mkdir(parents=True, exist_ok=True)
    load_start = os.getloadavg()
    parts: dict[str, dict[str, Any]] = {}
    try:
        from runners.engine.session import build_spark_session

        spark = build_spark_session(
            master=args.master,
            app_name="bench-windows",
            conf={"spark.driver.memory": DRIVER_MEMORY},
        )
        settings = {
            "master": args.master,
            "driver_memory": DRIVER_MEMORY,
            "spark_sql_shuffle_partitions": spark.conf.get("spark.sql.shuffle.partitions"),
            "state_store": spark.conf.get("spark.sql.streaming.stateStore.providerClass"),
            "engine_parallelism": PARALLELISM,
            "jvm": effective_jvm(spark),
            "spark_version": spark.version,
        }
        log(f"settings {settings}")
        if "windows" in args.parts:
            parts["windows"] = windows_part(spark, args, work)
        if "timers" in args.parts:
            parts["timers"] = timers_part(spark, args, work)
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    problems = [p for part in parts.values() for p in part["problems"]]
    windows, timed = parts.get("windows", {}), parts.get("timers", {})
    report = {
        "bench": "windows",
        "figure": "ratio_vs_spark_windowed: Spark's wall seconds / the engine's, sliding-window "
        "count/sum with watermark, append mode; ratio_vs_spark_transform_with_state: Spark's "
        "transformWithStateInPandas with event-time timers / the engine's per-key function with "
        "event-time timers, tumbling-window count/sum; same input and micro-batches, medians",
        "ratio_vs_spark_windowed": windows.get("ratio_vs_spark_windowed"),
        "target": TARGET,
        "met": windows.get("met"),
        "ratio_vs_spark_transform_with_state": timed.get("ratio_vs_spark_transform_with_state"),
        "target_transform_with_state": timed.get("target"),
        "met_transform_with_state": timed.get("met"),
        "parts": args.parts,
        "checks_passed": not problems,
        "problems": problems,
        "settings": settings,
        "cpus": os.cpu_count(),
        "loadavg_start": [round(x, 2) for x in load_start],
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        **{name: part for name, part in parts.items()},
        **code_version(REPO_ROOT, "runners", "bench", dirty_key="tree_dirty"),
    }
    for problem in problems:
        log(f"CHECK FAILED: {problem}")
    print(json.dumps(report), flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
