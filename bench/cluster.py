"""Cluster benchmark: ``python -m bench.cluster [--quick] [--parts scale,restore,executor_kill]``.

The vectorised workload of ``bench.engine`` (default 1,000,000 keys, 1,000,000 records per epoch,
5 epochs; running count, sum and max of ``value`` per ``key``) run by the engine on a real Spark
standalone cluster on this machine (``runners.local_cluster``: a master and one-core workers from
the pyspark install, each worker with its own directories and state cache), the store on a moto
S3 server in its own process (``moto_server``) — and, in the same run, on ``local[1]`` and
``local[2]`` against the same store, for comparison.

Each variant is a child process (``python -m bench.cluster child``: its own driver JVM, as a
job's run has) that runs the epochs with ``EpochRunner`` and reports each epoch's wall time.

- ``scale``: ``cluster_rps`` with 1 and 2 workers (parallelism = workers), ``local_rps`` on
  ``local[1]`` (p = 1) and ``local[2]`` (p = 2); each rate is the records of epochs 2..N over
  their summed wall time (epoch 1 pays the executors' Python workers and the first state
  writes; every epoch's seconds are listed). ``scale_workers_1_to_2`` = 2 workers ÷ 1 worker
  (target ≥ 1.6 on two cores).
- ``restore``: every key loaded once on the 2-worker cluster (``--restore-keys``, ~1 GB of
  state payload at the default), every worker's state cache then wiped, and a new driver runs
  one epoch: its restore stage reads all state from the object store.
  ``restore_from_object_store_mb_s`` = stored bytes read ÷ the restore stage's whole Spark job
  (``restore_s``; the inner span from first read to last cached key group is reported beside
  it). Baseline: ``object_store_read_mb_s``, the same objects GET whole from the same server by
  as many threads as the restore's tasks had read threads. ``restore_ratio`` (target ≥ 0.5).
  Beside it ``object_store_ranged_read_mb_s``: the same bytes GET in ranges of one key group's
  share (as the restore asks for them), and ``restore_ratio_vs_ranged_reads``.
- ``executor_kill``: the 2-worker run again, with one executor SIGKILLed 30% into epoch 3;
  ``executor_kill_epoch_s`` = that epoch's seconds ÷ the median of the other epochs.

Checksums: every variant's output per epoch must equal a numpy reference computed from the
generator's arrays (bench/checksum.py). Any mismatch or failed child: a message on stderr, the
JSON still printed with the problems, exit status 1. Progress goes to stderr; the last stdout
line is one JSON object (with the load average at the start, per part and at the end).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import checksum as ck
from bench.datagen import EpochSet
from bench.engine_job import aggregate_job
from bench.timing import code_version, log

REPO_ROOT = Path(__file__).resolve().parent.parent
PARTS = ("scale", "restore", "executor_kill")
MAX_PARALLELISM = 128
DRIVER_MEMORY = "2g"
EXECUTOR_MEMORY = "2g"
S3_ENV = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}
BUCKET = "bench-cluster"
KILL_AT_EPOCH, KILL_FRACTION = 3, 0.3


@dataclass(frozen=True)
class Sizes:
    keys: int
    records: int
    epochs: int
    restore_keys: int


FULL = Sizes(keys=1_000_000, records=1_000_000, epochs=5, restore_keys=28_000_000)
QUICK = Sizes(keys=20_000, records=20_000, epochs=4, restore_keys=200_000)


# -- the child: one driver running the epochs ------------------------------------------------


def _child(args: argparse.Namespace) -> int:
    """Run `args.epochs` epochs of the aggregate job on `args.master`; one JSON line per epoch
    start and a final report."""
    from bench.engine import engine_checksums
    from runners.engine import EpochRunner, read_output
    from runners.engine.session import build_spark_session
    from snapshots_store import Repository

    conf = {"spark.driver.memory": DRIVER_MEMORY}
    if args.master.startswith("spark://"):
        conf |= {
            "spark.executor.cores": "1",
            "spark.executor.memory": EXECUTOR_MEMORY,
            "spark.executorEnv.PYTHONPATH": str(REPO_ROOT),
            **{f"spark.executorEnv.{k}": v for k, v in S3_ENV.items()},
        }
    spark = build_spark_session(master=args.master, app_name="bench-cluster", conf=conf)
    repo = Repository.open(args.store, args.namespace)
    job = aggregate_job("bench-cluster", args.data)
    runner = EpochRunner(
        spark, job, repo=repo, parallelism=args.parallelism, max_parallelism=MAX_PARALLELISM
    )
    seconds: list[float] = []
    stats: list[dict[str, Any]] = []
    records = 0
    for epoch in range(1, args.epochs + 1):
        print(json.dumps({"event": "epoch_start", "epoch": epoch}), flush=True)
        t0 = time.perf_counter()
        result = runner.run_epoch()
        seconds.append(time.perf_counter() - t0)
        if result is None:
            raise SystemExit(f"epoch {epoch} did not run: {runner.stopped_reason}")
        records += int(result.records_in)
        stats.append(dict(repo.read_manifest(result.snapshot_id).stats))
    report: dict[str, Any] = {"seconds": seconds, "records": records, "stats": stats}
    if args.checksums:
        sums = engine_checksums(read_output(repo, "main"), args.epochs)
        report["checksums"] = [c.as_dict() for c in sums]
    print(json.dumps(report), flush=True)
    spark.stop()
    return 0


# -- the parent ------------------------------------------------------------------------------


class ObjectStore:
    """A moto S3 server in its own process (moto_server), with one bucket."""

    def __init__(self, work: Path) -> None:
        from runners.local_cluster import free_port

        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        server = Path(sys.executable).with_name("moto_server")
        self.log = (work / "moto.log").open("wb")
        self.proc = subprocess.Popen(
            [str(server), "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                self.client().create_bucket(Bucket=BUCKET)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, **_boto_keys())

    def url(self, prefix: str) -> str:
        return f"s3://{BUCKET}/{prefix}?endpoint_url={self.endpoint}"

    def read_all(self, prefix: str, threads: int, range_bytes: int = 0) -> tuple[int, float]:
        """GET every object under `prefix` with `threads` threads — whole, or in byte ranges
        of `range_bytes` (as a restore reads key groups' members): (bytes, seconds)."""
        client = self.client()
        reads: list[tuple[str, str | None]] = []
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
            for obj in page.get("Contents", []):
                size = int(obj["Size"])
                if not range_bytes or size <= range_bytes:
                    reads.append((obj["Key"], None))
                    continue
                for start in range(0, size, range_bytes):
                    end = min(size, start + range_bytes) - 1
                    reads.append((obj["Key"], f"bytes={start}-{end}"))

        def get(read: tuple[str, str | None]) -> int:
            key, byte_range = read
            extra = {"Range": byte_range} if byte_range else {}
            return len(client.get_object(Bucket=BUCKET, Key=key, **extra)["Body"].read())

        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(max(1, threads)) as pool:
            total = sum(pool.map(get, reads))
        return total, time.perf_counter() - t0

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.log.close()


def _boto_keys() -> dict[str, str]:
    return {
        "aws_access_key_id": S3_ENV["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": S3_ENV["AWS_SECRET_ACCESS_KEY"],
        "region_name": S3_ENV["AWS_DEFAULT_REGION"],
    }


@dataclass
class Child:
    report: dict[str, Any] | None
    error: str = ""


def run_child(
    *,
    master: str,
    parallelism: int,
    store: str,
    data: EpochSet,
    epochs: int,
    checksums: bool = True,
    on_epoch_start: Any = None,
    timeout_s: float = 3600,
) -> Child:
    """One driver process; `on_epoch_start(epoch)` is called as each epoch starts."""
    env = {**os.environ, **S3_ENV, "SPARK_LOCAL_IP": "127.0.0.1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env["PYSPARK_PYTHON"] = sys.executable
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    cache = Path(tempfile.mkdtemp(prefix="bench-cluster-driver-cache-"))
    env["EPOCHAL_STATE_CACHE_DIR"] = str(cache)
    argv = [sys.executable, "-m", "bench.cluster", "child", "--master", master]
    argv += ["--parallelism", str(parallelism), "--store", store, "--namespace", "bench"]
    argv += ["--data", str(data.directory), "--epochs", str(epochs)]
    argv += ["--checksums"] if checksums else []
    proc = subprocess.Popen(
        argv, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    watchdog = threading.Timer(timeout_s, proc.kill)
    watchdog.start()
    errors: list[str] = []
    reader = threading.Thread(
        target=lambda: errors.append(proc.stderr.read() if proc.stderr else "")
    )
    reader.start()
    last = ""
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            last = line if line.strip() else last
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("event") == "epoch_start" and on_epoch_start is not None:
                on_epoch_start(int(event["epoch"]))
        code = proc.wait()
    finally:
        watchdog.cancel()
        reader.join()
        shutil.rmtree(cache, ignore_errors=True)
    if code != 0:
        return Child(None, f"exit {code}: {''.join(errors)[-3000:]}")
    return Child(json.loads(last))


def _steady_rps(report: dict[str, Any], records_per_epoch: int) -> float:
    rest = report["seconds"][1:] or report["seconds"]
    return round(records_per_epoch * len(rest) / sum(rest), 1)


def _loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


class Bench:
    def __init__(self, sizes: Sizes, work: Path) -> None:
        self.sizes = sizes
        self.work = work
        self.problems: list[str] = []
        self.out: dict[str, Any] = {}
        self.loads: dict[str, list[float]] = {}
        self.data = EpochSet(
            work / "in", keys=sizes.keys, records=sizes.records, epochs=sizes.epochs
        )
        self.data.directory.mkdir(parents=True)
        self.data.generate()
        self.reference = ck.reference_running(self.data)
        self.store = ObjectStore(work)

    def check(self, label: str, child: Child) -> dict[str, Any] | None:
        if child.report is None:
            self.problems.append(f"{label}: the child failed: {child.error}")
            return None
        sums = [ck.Checksum(**c) for c in child.report.get("checksums", [])]
        if sums and sums != self.reference:
            self.problems.append(f"{label}: output checksums differ from the numpy reference")
        if child.report["records"] != self.data.total_records and sums:
            self.problems.append(f"{label}: read {child.report['records']} records")
        return child.report

    def scale(self, cluster_factory: Any) -> None:
        s = self.sizes
        rates: dict[str, float] = {}
        seconds: dict[str, list[float]] = {}
        for label, master, p in (("local1", "local[1]", 1), ("local2", "local[2]", 2)):
            log(f"scale: {label}")
            child = run_child(
                master=master, parallelism=p, store=self.store.url(label), data=self.data,
                epochs=s.epochs,
            )  # fmt: skip
            report = self.check(label, child)
            if report:
                rates[label] = _steady_rps(report, s.records)
                seconds[label] = [round(x, 3) for x in report["seconds"]]
        for workers in (1, 2):
            cluster = cluster_factory(workers)
            label = f"cluster{workers}"
            log(f"scale: {label} ({cluster.master_url})")
            child = run_child(
                master=cluster.master_url, parallelism=workers, store=self.store.url(label),
                data=self.data, epochs=s.epochs,
            )  # fmt: skip
            report = self.check(label, child)
            if report:
                rates[label] = _steady_rps(report, s.records)
                seconds[label] = [round(x, 3) for x in report["seconds"]]
        self.out["cluster_rps"] = {"1": rates.get("cluster1"), "2": rates.get("cluster2")}
        self.out["local_rps"] = {"local[1]": rates.get("local1"), "local[2]": rates.get("local2")}
        self.out["seconds_per_epoch"] = seconds
        one, two = rates.get("cluster1"), rates.get("cluster2")
        self.out["scale_workers_1_to_2"] = round(two / one, 3) if one and two else None
        l1, l2 = rates.get("local1"), rates.get("local2")
        self.out["scale_local_1_to_2"] = round(l2 / l1, 3) if l1 and l2 else None
        self.out["cluster2_vs_local2"] = round(two / l2, 3) if two and l2 else None

    def restore(self, cluster: Any) -> None:
        s = self.sizes
        # epoch 1 writes every key once; epoch 2 touches 1% of them
        touched = max(1, s.restore_keys // 100)
        big = EpochSet(self.work / "restore-in", keys=s.restore_keys, records=touched,
                       epochs=2, incremental=True)  # fmt: skip
        big.directory.mkdir(parents=True)
        big.generate()
        store = self.store.url("restore")
        log(f"restore: loading {s.restore_keys:,} keys on {cluster.master_url}")
        load = run_child(master=cluster.master_url, parallelism=2, store=store, data=big,
                         epochs=1, checksums=False)  # fmt: skip
        if load.report is None:
            self.problems.append(f"restore: the loading run failed: {load.error}")
            return
        cluster.wipe_state_caches()
        log("restore: a new driver on empty caches runs the next epoch")
        again = run_child(master=cluster.master_url, parallelism=2, store=store, data=big,
                          epochs=1, checksums=False)  # fmt: skip
        if again.report is None:
            self.problems.append(f"restore: the restarted run failed: {again.error}")
            return
        # the new driver's first epoch (the data's second) restores the whole state first
        restore_stats = again.report["stats"][0]
        restored = int(restore_stats.get("restore_bytes", 0))
        stage_s = float(restore_stats.get("restore_s", 0) or 0)
        span_s = float(restore_stats.get("restore_span_s", 0) or 0)
        threads = 2 * int(os.environ.get("EPOCHAL_RESTORE_THREADS", "4"))
        stored, read_s = self.store.read_all("restore/", threads)
        # the same bytes in ranges of one key group's share of the state (M = 128), the way
        # the restore's threads ask for them
        range_bytes = max(1, restored // MAX_PARALLELISM)
        ranged, ranged_s = self.store.read_all("restore/", threads, range_bytes)
        self.out["restore"] = {
            "keys": s.restore_keys,
            "restore_bytes": restored,
            "restore_payload_bytes": int(restore_stats.get("restore_payload_bytes", 0)),
            "restore_stage_s": stage_s,
            "restore_span_s": span_s,
            "store_objects_bytes": stored,
            "store_read_s": round(read_s, 3),
            "store_read_threads": threads,
            "store_ranged_read_bytes": ranged,
            "store_ranged_read_s": round(ranged_s, 3),
            "store_range_bytes": range_bytes,
        }
        if restored <= 0:
            self.problems.append("restore: the restarted run restored nothing from the store")
            return
        mb = 1024**2
        stage_rate = restored / mb / stage_s if stage_s else None
        self.out["restore_from_object_store_mb_s"] = round(stage_rate, 1) if stage_rate else None
        self.out["restore_span_mb_s"] = round(restored / mb / span_s, 1) if span_s else None
        self.out["object_store_read_mb_s"] = round(stored / mb / read_s, 1)
        self.out["restore_ratio"] = (
            round(stage_rate / (stored / mb / read_s), 3) if stage_rate else None
        )
        ranged_rate = ranged / mb / ranged_s
        self.out["object_store_ranged_read_mb_s"] = round(ranged_rate, 1)
        self.out["restore_ratio_vs_ranged_reads"] = (
            round(stage_rate / ranged_rate, 3) if stage_rate else None
        )

    def executor_kill(self, cluster: Any) -> None:
        s = self.sizes
        killed: list[int] = []
        median_hint = statistics.median(
            self.out.get("seconds_per_epoch", {}).get("cluster2", [1.0])
        )

        def kill(epoch: int) -> None:
            if epoch != KILL_AT_EPOCH:
                return

            def act() -> None:
                executors = cluster.executors()
                if executors:
                    os.kill(executors[-1].pid, signal.SIGKILL)
                    killed.append(executors[-1].pid)

            threading.Timer(KILL_FRACTION * median_hint, act).start()

        log("executor_kill: one executor SIGKILLed inside epoch 3")
        child = run_child(
            master=cluster.master_url, parallelism=2, store=self.store.url("kill"),
            data=self.data, epochs=s.epochs, on_epoch_start=kill,
        )  # fmt: skip
        report = self.check("executor_kill", child)
        if not report:
            return
        if not killed:
            self.problems.append("executor_kill: no executor was killed")
            return
        seconds = report["seconds"]
        hit = seconds[KILL_AT_EPOCH - 1]
        others = [x for i, x in enumerate(seconds) if i not in (0, KILL_AT_EPOCH - 1)]
        self.out["executor_kill_epoch_s"] = round(hit / statistics.median(others), 3)
        self.out["executor_kill_seconds_per_epoch"] = [round(x, 3) for x in seconds]
        self.out["executor_kill_restore_bytes"] = int(
            report["stats"][KILL_AT_EPOCH - 1].get("restore_bytes", 0)
        )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.cluster",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("mode", nargs="?", default="run", choices=["run", "child"])
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--keys", type=int)
    parser.add_argument("--records", type=int)
    parser.add_argument("--epochs", type=int)
    parser.add_argument("--restore-keys", type=int)
    # the child's
    parser.add_argument("--master")
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--store")
    parser.add_argument("--namespace", default="bench")
    parser.add_argument("--data")
    parser.add_argument("--checksums", action="store_true")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.mode == "child":
        return _child(args)
    base = QUICK if args.quick else FULL
    sizes = Sizes(
        keys=args.keys or base.keys,
        records=args.records or base.records,
        epochs=args.epochs or base.epochs,
        restore_keys=args.restore_keys or base.restore_keys,
    )
    parts = [p for p in args.parts.split(",") if p]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        print(f"unknown parts {unknown}: choose from {', '.join(PARTS)}", file=sys.stderr)
        return 2
    from runners.local_cluster import LocalCluster

    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    load_start = _loadavg()
    bench = Bench(sizes, work)
    clusters: list[LocalCluster] = []

    def cluster_of(workers: int) -> LocalCluster:
        while clusters and clusters[-1].workers < workers:
            last = clusters[-1]
            last.workers += 1
            last.start_worker(last.workers - 1)
        if not clusters:
            clusters.append(LocalCluster(work / "cluster", workers=workers, cores=1).start())
        return clusters[-1]

    try:
        for part in PARTS:
            if part not in parts:
                continue
            if part == "scale":
                bench.scale(cluster_of)
            elif part == "restore":
                bench.restore(cluster_of(2))
            else:
                bench.executor_kill(cluster_of(2))
            bench.loads[part] = _loadavg()
    finally:
        for cluster in clusters:
            cluster.stop()
        bench.store.stop()
        shutil.rmtree(work, ignore_errors=True)
    scale = bench.out.get("scale_workers_1_to_2")
    ratio = bench.out.get("restore_ratio")
    report = {
        "bench": "cluster",
        "parts": parts,
        "keys": sizes.keys,
        "records_per_epoch": sizes.records,
        "epochs": sizes.epochs,
        "workers_cores": 1,
        "executor_memory": EXECUTOR_MEMORY,
        "driver_memory": DRIVER_MEMORY,
        "store": "moto_server (S3 API over HTTP, own process)",
        **bench.out,
        "targets": {"scale_workers_1_to_2": 1.6, "restore_ratio": 0.5},
        "verdicts": {
            "scale_workers_1_to_2": None if scale is None else scale >= 1.6,
            "restore_ratio": None if ratio is None else ratio >= 0.5,
        },
        "checksums_match": not any("checksums" in p for p in bench.problems),
        "problems": bench.problems,
        "cpus": os.cpu_count(),
        "loadavg_start": load_start,
        "loadavg_by_part": bench.loads,
        "loadavg_end": _loadavg(),
        "wall_s": round(time.perf_counter() - started, 1),
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "quick": args.quick,
        **code_version(REPO_ROOT, "runners", "bench", dirty_key="engine_tree_dirty"),
    }
    for problem in bench.problems:
        log(f"PROBLEM: {problem}")
    print(json.dumps(report))
    return 1 if bench.problems else 0


if __name__ == "__main__":
    sys.exit(main())
