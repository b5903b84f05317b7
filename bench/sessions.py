"""Session windows (count/sum) with a watermark in append mode: the engine against Spark
Structured Streaming's ``groupBy(session_window(...))``, on the same input in the same process.

Input: bench.windows's generator (`--epochs` Parquet files of `--records` records, keys drawn
uniformly from `--keys`, event times of epoch e spread over minute e and up to the delay (10 s)
early: out of order, never late), with fewer keys by default so that a key's records are
seconds apart and its sessions run across epochs. Job: sessions with a gap of 10 s, watermark
delay 10 s, ``count`` and ``sum(value)`` per key and session, append mode.

- ``engine``: `EpochRunner` at p = 2 over the files, committing every epoch to a snapshot
  store; its last epoch has no input and closes the sessions the input's watermark passed.
- ``spark_session_window``: ``readStream.parquet`` (``maxFilesPerTrigger=1``) →
  ``withWatermark("t", "10 seconds")`` → ``groupBy(session_window("t", "10 seconds"),
  "key").agg(count, sum)`` in append mode on the default state store,
  ``trigger(availableNow=True)``, ``foreachBatch`` writing each batch's rows to Parquet.

Figure: ``ratio_vs_spark_session_window`` = Spark's wall seconds ÷ the engine's, per run; the
verdict is the median over `--runs` runs. Checks: the checksum of all emitted rows (key,
session start, count, sum) is equal for both variants and for a numpy reference computed from
the generator's arrays (sessions of all records per key, closed by the final watermark: with
this input no record is late and none meets a session that already closed); the engine dropped
no record as late. Exit status 1 when a check fails.
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
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bench.datagen import key_strings
from bench.engine import DRIVER_MEMORY, REPO_ROOT, effective_jvm, prepare_environment
from bench.timing import code_version
from bench.windows import (
    DELAY_MS,
    PARALLELISM,
    Input,
    key_crc,
    run_engine,
    run_spark,
    window_checksum,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

GAP_MS = 10_000
TARGET = 3.0
RATIO = "ratio_vs_spark_session_window"


def log(message: str) -> None:
    print(f"[bench.sessions {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def reference_checksum(data: Input, crc: np.ndarray) -> dict[str, int]:
    """Every session (records of a key at most the gap apart) ending at or before the final
    watermark, from the arrays."""
    epochs = [data.arrays(e) for e in range(data.epochs)]
    ids, values, ts = (np.concatenate([a[i] for a in epochs]) for i in range(3))
    order = np.lexsort((ts, ids))
    ids, values, ts = ids[order], values[order], ts[order]
    first = np.ones(len(ts), dtype=bool)
    first[1:] = (ids[1:] != ids[:-1]) | (ts[1:] > ts[:-1] + GAP_MS)
    starts = np.flatnonzero(first)
    ends = np.maximum.reduceat(ts, starts) + GAP_MS
    closed = ends <= int(ts.max()) - DELAY_MS
    counts = np.diff(np.append(starts, len(ts)))[closed]
    sums = np.add.reduceat(values, starts)[closed]
    return window_checksum(crc[ids[starts[closed]]], ts[starts[closed]], counts, sums)


def table_checksum(table: pa.Table, names: pa.Array, crc: np.ndarray) -> dict[str, int]:
    ids = pc.index_in(table.column("key"), value_set=names).to_numpy()
    columns = ("window_start", "count", "sum_value")
    return window_checksum(crc[ids], *(table.column(c).to_numpy() for c in columns))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.sessions", description=__doc__.split("\n")[0])
    p.add_argument("--keys", type=int, default=100_000)
    p.add_argument("--records", type=int, default=1_000_000, help="records per epoch")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--runs", type=int, default=3, help="runs of both variants (verdict: median)")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--work-dir", help="data and stores (kept when given)")
    args = p.parse_args(argv)
    for name in ("keys", "records", "epochs", "runs"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1")
    return args


def measure(
    spark: SparkSession, data: Input, work: Path, run: int, expected: dict[str, int]
) -> tuple[dict[str, Any], list[str]]:
    """One run of both variants (alternating which goes first): figures and failed checks."""
    names, crc = key_strings(data.keys), key_crc(data.keys)
    order = ("engine", "spark_session_window")
    order = order if run % 2 else order[::-1]
    figures: dict[str, Any] = {"run": run, "order": list(order)}
    problems = []
    for variant in order:
        load = os.getloadavg()
        if variant == "engine":
            seconds, table, detail = run_engine(spark, data, work, run, GAP_MS)
        else:
            seconds, table, detail = run_spark(spark, data, work, GAP_MS)
        checksum = table_checksum(table, names, crc)
        figures[variant] = {"seconds": round(seconds, 3), "checksum": checksum,
                            "loadavg_before": [round(x, 2) for x in load], **detail}  # fmt: skip
        log(f"run {run} {variant}: {seconds:.2f} s, {checksum['rows']:,} sessions")
        if checksum != expected:
            problems.append(f"run {run} {variant}: checksum {checksum} != reference {expected}")
    if figures["engine"]["late_records"]:
        problems.append(f"run {run} engine: {figures['engine']['late_records']} late records")
    figures[RATIO] = round(
        figures["spark_session_window"]["seconds"] / figures["engine"]["seconds"], 3
    )
    return figures, problems


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    prepare_environment()
    keep = args.work_dir is not None
    work = Path(args.work_dir) if keep else Path(tempfile.mkdtemp(prefix="bench-sessions-"))
    work.mkdir(parents=True, exist_ok=True)
    load_start = os.getloadavg()
    data = Input(work / "in", args.keys, args.records, args.epochs)
    problems: list[str] = []
    runs: list[dict[str, Any]] = []
    try:
        log(f"writing {args.epochs} epochs of {args.records:,} records over {args.keys:,} keys")
        data.write()
        expected = reference_checksum(data, key_crc(args.keys))
        from runners.engine.session import build_spark_session

        spark = build_spark_session(
            master=args.master, app_name="bench-sessions",
            conf={"spark.driver.memory": DRIVER_MEMORY},
        )  # fmt: skip
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
        warm = Input(work / "warm", 2_000, 2_000, 2)  # untimed: workers, imports, codegen
        warm.write()
        run_engine(spark, warm, work, 0, GAP_MS)
        run_spark(spark, warm, work, GAP_MS)
        for run in range(1, args.runs + 1):
            figures, failed = measure(spark, data, work, run, expected)
            runs.append(figures)
            problems += failed
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    ratio = statistics.median(r[RATIO] for r in runs) if runs else None
    report = {
        "bench": "sessions",
        "figure": f"{RATIO}: Spark's wall seconds / the engine's, session-window count/sum "
        "with watermark, append mode, same input and micro-batches, median of runs",
        RATIO: ratio,
        "target": TARGET,
        "met": ratio is not None and ratio >= TARGET,
        "engine_s_median": statistics.median(r["engine"]["seconds"] for r in runs)
        if runs
        else None,
        "spark_s_median": statistics.median(r["spark_session_window"]["seconds"] for r in runs)
        if runs
        else None,
        "sizes": {
            "keys": args.keys,
            "records_per_epoch": args.records,
            "epochs": args.epochs,
            "gap_ms": GAP_MS,
            "delay_ms": DELAY_MS,
        },
        "reference_checksum": expected,
        "checks_passed": not problems,
        "problems": problems,
        "settings": settings,
        "cpus": os.cpu_count(),
        "loadavg_start": [round(x, 2) for x in load_start],
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "runs": runs,
        **code_version(REPO_ROOT, "runners", "bench", dirty_key="tree_dirty"),
    }
    for problem in problems:
        log(f"CHECK FAILED: {problem}")
    print(json.dumps(report), flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
