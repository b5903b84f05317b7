"""Job-web benchmark: ``python -m bench.webs [--quick] [--interval S] [--epochs N]``.

What does epoch alignment add to the latency of a downstream job, in epoch intervals
(van Kaam's "Epoch alignment in stateful streams" reports "a little over one interval" at most
and about half on average)?

An upstream job U (a keyed running aggregate over generated Parquet epochs) commits one
epoch every `interval` seconds: at each tick a new input file arrives and U runs its epoch.
A downstream job D reads U's branch output (`BranchOutputSource`) with the same per-key
logic as a second stage.

1. **Same-process baseline**: U and D in one loop — D's epoch runs right after U's commit,
   in the same thread, on the records U just committed (no alignment, no polling).
   ``baseline_latency_epochs`` = (D commit - U commit) / interval per upstream epoch.
2. **Aligned**: D runs as its own job in aligned mode (control document ``alignment:
   align from epoch 1``: each D epoch reads exactly one U epoch), polling the store every
   `poll` seconds (default interval / 4) — its own schedule, out of phase with U.
   ``aligned_latency_epochs`` = (D commit of the epoch mapped to U's epoch k - U commit of
   k) / interval.

``alignment_extra_latency_epochs`` = aligned - baseline median, per upstream epoch (the
wait for D's next poll plus the protocol's reads of the upstream chain). Both variants check
that D's output equals U's output row for row (aligned: per epoch). Progress on stderr; the
last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REQUIRED_KEYS = (
    "alignment_extra_latency_epochs_mean",
    "alignment_extra_latency_epochs_max",
    "baseline_latency_epochs_mean",
    "aligned_latency_epochs_mean",
)


def log(message: str) -> None:
    print(f"[bench.webs {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _jobs(data: str, upstream_store: str, namespace: str) -> tuple[Any, Any]:
    from runners.engine import Job
    from runners.engine import aggregations as agg
    from runners.engine.branch_source import BranchOutputSource
    from runners.engine.sources import ParquetDirectory

    upstream = Job(
        name="counts",
        source=ParquetDirectory(data, max_files_per_epoch=1),
        key="key",
        aggregate=[agg.count(), agg.sum("value")],
        time_mode="logical",
    )
    downstream = Job(
        name="totals",
        source=BranchOutputSource(upstream_store, namespace, "main"),
        key="key",
        aggregate=[agg.count(), agg.max("count")],
        time_mode="logical",
    )
    return upstream, downstream


def _write_input(data: str, index: int, keys: int, records: int) -> None:
    from runners.engine.sources import Generator, write_parquet_file

    block = Generator(keys=keys, records_per_epoch=records, seed=7).block(index)
    write_parquet_file(data, f"part-{index:05d}", block)


def run_variant(
    spark: Any, work: Path, name: str, *, aligned: bool, args: argparse.Namespace
) -> dict[str, Any]:
    """One variant: returns per-upstream-epoch latencies (s) and a correctness flag."""
    from runners.engine import EpochRunner, read_output
    from snapshots_store import Repository

    root = work / name
    data = str(root / "in")
    os.makedirs(data, exist_ok=True)
    store = f"file://{root / 'store'}"
    up_repo, down_repo = Repository.open(store, "up"), Repository.open(store, "down")
    up_job, down_job = _jobs(data, store, "up")
    up = EpochRunner(spark, up_job, repo=up_repo, parallelism=2)
    down = EpochRunner(spark, down_job, repo=down_repo, parallelism=2)
    committed_up: dict[int, float] = {}
    committed_down: dict[int, float] = {}
    durations: dict[int, float] = {}
    interval = args.interval
    if aligned:
        down_repo.write_control("main", {"alignment": {"command": "align", "from_epoch": 1}}, None)
    done = threading.Event()

    def downstream_loop() -> None:
        poll = args.poll if args.poll is not None else interval / 4
        while not done.is_set() or len(committed_down) < len(committed_up):
            result = down.run_epoch()
            if result is None:
                time.sleep(poll)
                continue
            manifest = down_repo.read_manifest(result.snapshot_id)
            read = manifest.extra["inputs"]["upstream"]["epochs"]  # type: ignore[index]
            now = time.perf_counter()
            for k in read:  # type: ignore[union-attr]
                committed_down[int(k)] = now
            durations[result.epoch] = result.duration_s

    worker = None
    if aligned:
        worker = threading.Thread(target=downstream_loop, name="downstream")
        worker.start()
    start = time.perf_counter()
    try:
        for k in range(1, args.epochs + 1):
            tick = start + (k - 1) * interval
            time.sleep(max(0.0, tick - time.perf_counter()))
            _write_input(data, k - 1, args.keys, args.records)
            result = up.run_epoch()
            assert result is not None and result.epoch == k
            committed_up[k] = time.perf_counter()
            if not aligned:  # same process: the second stage right after the commit
                second = down.run_epoch()
                assert second is not None
                committed_down[k] = time.perf_counter()
                durations[second.epoch] = second.duration_s
            if time.perf_counter() - tick > interval:
                log(f"{name}: upstream epoch {k} overran the {interval:g} s interval")
    finally:
        done.set()
        if worker is not None:
            worker.join(timeout=interval * 10 + 60)
    latencies = {
        k: committed_down[k] - committed_up[k] for k in committed_up if k in committed_down
    }
    up_out, down_out = read_output(up_repo, "main"), read_output(down_repo, "main")
    ok = len(latencies) == args.epochs and down_out.num_rows > 0
    if aligned:
        # aligned: downstream epoch m read exactly upstream epoch m
        from runners.engine.branch_source import epoch_mapping

        ok = ok and [m.upstream_epochs for m in epoch_mapping(down_repo, "main")] == [
            (k,) for k in range(1, args.epochs + 1)
        ]
    keys_up = set(up_out.column("key").to_pylist())
    ok = ok and keys_up == set(down_out.column("key").to_pylist())
    log(f"{name}: latencies {[round(v, 3) for v in latencies.values()]} s, correct={ok}")
    return {"latency_s": latencies, "durations_s": durations, "correct": ok}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.webs")
    parser.add_argument("--quick", action="store_true", help="fewer, smaller epochs")
    parser.add_argument("--interval", type=float, default=None, help="upstream epoch interval")
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--poll", type=float, default=None, help="downstream poll (interval/4)")
    parser.add_argument("--keys", type=int, default=2000)
    parser.add_argument("--records", type=int, default=20000)
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    if args.interval is None:
        args.interval = 3.0 if args.quick else 4.0
    if args.epochs is None:
        args.epochs = 5 if args.quick else 12
    if args.quick:
        args.keys, args.records = min(args.keys, 500), min(args.records, 2000)
    from runners.engine.session import build_spark_session

    started = time.perf_counter()
    load_start = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="bench-webs-"))
    spark = build_spark_session(master="local[2]", app_name="bench-webs")
    try:
        log("warm-up")
        warm = argparse.Namespace(**{**vars(args), "epochs": 2, "interval": 0.0})
        run_variant(spark, work, "warmup", aligned=False, args=warm)
        log(f"baseline: same process, {args.epochs} epochs every {args.interval:g} s")
        base = run_variant(spark, work, "baseline", aligned=False, args=args)
        log("aligned: downstream job in aligned mode, polling the store")
        aligned = run_variant(spark, work, "aligned", aligned=True, args=args)
    finally:
        spark.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    interval = args.interval
    base_lat = [v / interval for v in base["latency_s"].values()]
    al_lat = [aligned["latency_s"][k] / interval for k in sorted(aligned["latency_s"])]
    base_median = statistics.median(base_lat)
    extra = [max(0.0, v - base_median) for v in al_lat]
    report = {
        "alignment_extra_latency_epochs_mean": round(statistics.fmean(extra), 3),
        "alignment_extra_latency_epochs_max": round(max(extra), 3),
        "baseline_latency_epochs_mean": round(statistics.fmean(base_lat), 3),
        "baseline_latency_epochs_max": round(max(base_lat), 3),
        "aligned_latency_epochs_mean": round(statistics.fmean(al_lat), 3),
        "aligned_latency_epochs_max": round(max(al_lat), 3),
        "target_mean_le_0_5": statistics.fmean(extra) <= 0.5,
        "target_max_le_1_0": max(extra) <= 1.0,
        "correct": bool(base["correct"] and aligned["correct"]),
        "interval_s": interval,
        "poll_s": args.poll if args.poll is not None else interval / 4,
        "epochs": args.epochs,
        "records_per_epoch": args.records,
        "keys": args.keys,
        "wall_s": round(time.perf_counter() - started, 1),
        "cpus": os.cpu_count(),
        "loadavg_start": [round(x, 2) for x in load_start],
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "quick": args.quick,
    }
    print(json.dumps(report), flush=True)
    return 0 if report["correct"] else 1


if __name__ == "__main__":
    sys.exit(main())
