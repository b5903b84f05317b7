"""The ``restore`` part of ``python -m bench.engine``: how fast a restart-rescale brings
state back, against the disk's own sequential read bandwidth measured in the same run.

1. The vectorised job loads every key once (epoch 1, p = 2, M = 128): ≥ 1 GB of state at the
   default size (``--restore-keys``; the state's payload bytes are reported).
2. The store's files are dropped from the page cache (`bench.disk.drop_page_cache`), then a
   child process restarts the job at p = 3 (a new JVM and new Python workers, an empty state
   cache) and runs its next epoch (``--restore-touched`` keys). Before it, the engine's restore
   stage (`EpochRunner._restore`, a runner's first epoch or a new parallelism) runs one task
   per core (2 on local[2]); each task's threads claim batches of key groups as they go and
   load them into the state cache, the store reading ahead of the claims: long sequential
   range reads of the packs, each key group verified, decompressed into its state-cache file
   and mapped in the reading thread (runners/engine/state/restore.py `restore_claimed`).
   Two rates over the stored bytes the tasks read (manifest stats ``restore_bytes``):
   ``restore_stage_mb_s`` over the whole restore stage (``restore_s``: the stage's Spark
   job as the driver sees it, task launch and the workers' start included) — this is
   ``restore_mb_s`` — and ``restore_span_mb_s`` over the inner span from the first task's
   read start to the last task's state in the cache (``restore_span_s``).
3. The baseline: files of the same sizes as the packs, written the way the store writes
   (temp file, fsync, rename) right after the loading epoch wrote the packs (so both are
   about as old when read: this virtual disk is cached below the guest, and a file written
   a moment ago reads faster than one written a minute ago) and dropped from the page cache
   the same way. ``disk_read_mb_s`` reads them **as the restore stage reads the packs**
   (`bench.disk.parallel_read_mb_s`): as many streams as the stage has reading threads
   (one task per core, `READ_THREADS` each), each claiming the next file and reading it in
   `MAX_READ` reads, with the same read-ahead (`restore_read_ahead_bytes`,
   ``posix_fadvise(WILLNEED)``) ahead of the claims; ``disk_read_single_stream_mb_s`` reads
   them one after the other in 32 MiB reads, beside it. Each way reads two copies, one just
   before the restart and one just after it (each read once: a second read of the same files
   comes from the host's cache at twice the speed even with the guest's page cache dropped),
   and reports the
   mean, so a disk that speeds up or slows down during the part moves the baseline the way
   it moved the restore. ``restore_ratio`` = ``restore_stage_mb_s`` ÷ ``disk_read_mb_s``
   (target ≥ 0.5); ``restore_span_ratio`` the inner span's rate ÷ the same baseline.

Correctness: the restore stage must read exactly the snapshot's stored state bytes (every
member is verified against its hash on read), and the epoch read ``--restore-touched`` records
and output one row per touched key.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import disk
from bench.datagen import EpochSet
from bench.engine_job import aggregate_job
from bench.timing import log
from runners import config
from snapshots_store.packs import MAX_READ, READ_THREADS

MAX_PARALLELISM = 128
#: the restarted child's master: its restore stage runs one task per core
RESTART_CORES = 2
FROM_PARALLELISM, TO_PARALLELISM = 2, 3


@dataclass(frozen=True)
class RestoreSizes:
    keys: int  # every key once in epoch 1: the state restored
    touched: int  # distinct keys of the restored epoch (must reach every key group)


DEFAULT_SIZES = RestoreSizes(keys=28_000_000, touched=200_000)
QUICK_SIZES = RestoreSizes(keys=20_000, touched=2_000)


def _dataset(work: Path, sizes: RestoreSizes) -> EpochSet:
    return EpochSet(
        work / "data" / f"restore-{sizes.keys}",
        keys=sizes.keys,
        records=sizes.touched,
        epochs=2,
        incremental=True,
        seed=11,
    )


def measure(spark: Any, work: Path, store_url: str, namespace: str, sizes: RestoreSizes) -> dict:
    """Run the part; returns the report's figures (``restore_*``, ``disk_*``) and problems."""
    from runners.engine import EpochRunner
    from snapshots_store import Repository

    t0 = time.perf_counter()
    data = _dataset(work, sizes).generate()
    log(f"restore: data {sizes.keys:,} keys + {sizes.touched:,} ({time.perf_counter() - t0:.1f} s)")
    repo = Repository.open(store_url, namespace)
    job = aggregate_job("engine_restore", data.directory)
    runner = EpochRunner(
        spark,
        job,
        repo=repo,
        parallelism=FROM_PARALLELISM,
        max_parallelism=MAX_PARALLELISM,
    )
    t1 = time.perf_counter()
    loaded = runner.run_epoch()
    if loaded is None or loaded.records_in != sizes.keys:
        raise RuntimeError(f"restore: the loading epoch did not run ({runner.stopped_reason})")
    load_s = time.perf_counter() - t1
    state = _state_figures(repo, loaded.snapshot_id)
    log(f"restore: loaded {state['state_payload_bytes'] / 1e6:.0f} MB of state in {load_s:.1f} s")
    root = _local_root(store_url)
    store_files = [p for p in (root / namespace / "objects").rglob("*") if p.is_file()]
    streams = RESTART_CORES * READ_THREADS

    def parallel(files: list[Path]) -> tuple[float, int, float]:
        return disk.parallel_read_mb_s(
            files,
            streams=streams,
            read_bytes=MAX_READ,
            read_ahead=config.current().restore_read_ahead_bytes,
        )

    # Two baseline copies per way of reading, each read once: a second read of the same
    # files is served by the host's cache (measured: twice as fast) even with the guest's
    # page cache dropped.
    copies = {
        name: disk.write_like_the_store(work / f"disk-baseline-{name}", state["pack_sizes"])
        for name in ("parallel-1", "single-1", "parallel-2", "single-2")
    }
    base_method = disk.drop_page_cache([f for files in copies.values() for f in files])
    parallel_before = parallel(copies["parallel-1"])
    single_before = disk.sequential_read_mb_s(copies["single-1"])
    method = disk.drop_page_cache(store_files)
    child = _restart(work, store_url, namespace, data)
    disk.drop_page_cache([*copies["parallel-2"], *copies["single-2"]])
    parallel_after = parallel(copies["parallel-2"])
    single_after = disk.sequential_read_mb_s(copies["single-2"])
    for files in copies.values():
        for path in files:
            path.unlink()
    problems = []
    if child is None:
        return {"restore_problems": ["restore: the restarted job failed"], **_nulls()}
    if child["restore_bytes"] != state["state_stored_bytes"]:
        problems.append(
            f"restore read {child['restore_bytes']} stored bytes, the snapshot holds "
            f"{state['state_stored_bytes']}"
        )
    if child["records_in"] != sizes.touched or child["output_rows"] != sizes.touched:
        problems.append(f"restored epoch read/output {child} rows, expected {sizes.touched}")
    disk_mb_s = (parallel_before[0] + parallel_after[0]) / 2
    single_mb_s = (single_before[0] + single_after[0]) / 2
    stored_mb = child["restore_bytes"] / 1e6
    stage_mb_s = stored_mb / child["restore_s"]
    span_mb_s = stored_mb / child["restore_span_s"]
    figures = {
        # over the whole restore stage (its Spark job): the headline
        "restore_mb_s": round(stage_mb_s, 3),
        "restore_stage_mb_s": round(stage_mb_s, 3),
        # over the inner span: first task's read to the last task's state in the cache
        "restore_span_mb_s": round(span_mb_s, 3),
        # the packs' sizes read as the stage reads (parallel streams, read-ahead)
        "disk_read_mb_s": round(disk_mb_s, 1),
        "disk_read_single_stream_mb_s": round(single_mb_s, 1),
        "restore_ratio": round(stage_mb_s / disk_mb_s, 3),
        "restore_span_ratio": round(span_mb_s / disk_mb_s, 3),
        "restore": {
            "keys": sizes.keys,
            "touched_keys": sizes.touched,
            "max_parallelism": MAX_PARALLELISM,
            "parallelism": [FROM_PARALLELISM, TO_PARALLELISM],
            "state_payload_bytes": state["state_payload_bytes"],
            "state_stored_bytes": state["state_stored_bytes"],
            "packs": len(state["pack_sizes"]),
            "load_epoch_s": round(load_s, 2),
            "restore_bytes": child["restore_bytes"],
            "restore_payload_bytes": child["restore_payload_bytes"],
            "restore_span_s": child["restore_span_s"],
            "restore_stage_s": child["restore_s"],
            "restore_payload_mb_s": round(
                child["restore_payload_bytes"] / 1e6 / child["restore_span_s"], 1
            ),
            "restored_epoch_s": child["duration_s"],
            # what the epoch's tasks still read from the store: key groups below the disk
            # cache's minimum size that their Python worker did not restore itself
            "restored_epoch_state_read_bytes": child["state_read_bytes"],
            "restart_session_s": child["session_s"],
            "disk_read_bytes": parallel_before[1],
            "disk_parallel": {
                "streams": streams,
                "read_bytes": MAX_READ,
                "read_ahead_bytes": config.current().restore_read_ahead_bytes,
                "read_s": [round(parallel_before[2], 3), round(parallel_after[2], 3)],
                "mb_s_before_after": [round(parallel_before[0], 1), round(parallel_after[0], 1)],
            },
            "disk_single_stream": {
                "read_bytes": disk.READ_BYTES,
                "read_s": [round(single_before[2], 3), round(single_after[2], 3)],
                "mb_s_before_after": [round(single_before[0], 1), round(single_after[0], 1)],
            },
            "page_cache_drop": method if method == base_method else f"{method}/{base_method}",
        },
        "restore_problems": problems,
    }
    log(f"restore: {json.dumps(figures)}")
    return figures


def _nulls() -> dict[str, Any]:
    return {"restore_mb_s": None, "disk_read_mb_s": None, "restore_ratio": None}


def _local_root(store_url: str) -> Path:
    if store_url.startswith("file://"):
        return Path(store_url[len("file://") :])
    if "://" not in store_url:
        return Path(store_url)
    raise SystemExit("the restore part measures a local disk: use a file:// --store-url")


def _state_figures(repo: Any, snapshot_id: str) -> dict[str, Any]:
    """Payload and stored bytes of a snapshot's state, and the stored size of each pack."""
    from snapshots_store.objects import object_key
    from snapshots_store.packs import split_ref

    manifest = repo.read_manifest(snapshot_id)
    payload = stored = 0
    packs: dict[str, int] = {}
    for chain in manifest.key_groups.values():
        for ref in chain:
            pack_id, member = split_ref(ref)
            if member is None:
                raise RuntimeError("restore: the engine wrote a loose chunk, expected packs")
            entry = repo.chunks.member(ref)[1]
            payload += entry.size
            stored += entry.stored
            packs[pack_id] = repo.backend.stat(object_key(pack_id)).size
    return {
        "state_payload_bytes": payload,
        "state_stored_bytes": stored,
        "pack_sizes": [packs[p] for p in sorted(packs)],
    }


def _restart(work: Path, store_url: str, namespace: str, data: EpochSet) -> dict | None:
    """Run the restarted epoch in a child process; its JSON report (None when it failed)."""
    argv = [
        sys.executable, "-m", "bench.engine_restore",
        "--store-url", store_url, "--namespace", namespace, "--data-dir", str(data.directory),
    ]  # fmt: skip
    log(f"restore: restarting at p={TO_PARALLELISM} in a child process")
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=1800, cwd=work)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    if proc.returncode != 0 or not lines:
        log(f"restore: child failed ({proc.returncode}): {proc.stderr[-3000:]}")
        return None
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def restart(args: argparse.Namespace) -> dict[str, Any]:
    """The child: a fresh session (new JVM, new Python workers, an empty state cache directory)
    runs the job's next epoch at p = 3."""
    os.environ["EPOCHAL_STATE_CACHE_DIR"] = tempfile.mkdtemp(prefix="restore-cache-")
    from runners.engine import EpochRunner
    from runners.engine.session import build_spark_session
    from snapshots_store import Repository

    t0 = time.perf_counter()
    spark = build_spark_session(
        master=f"local[{RESTART_CORES}]",
        app_name="bench-restore",
        conf={"spark.driver.memory": "4g"},
    )
    session_s = time.perf_counter() - t0
    repo = Repository.open(args.store_url, args.namespace)
    job = aggregate_job("engine_restore", args.data_dir)
    runner = EpochRunner(
        spark, job, repo=repo, parallelism=TO_PARALLELISM, max_parallelism=MAX_PARALLELISM
    )
    result = runner.run_epoch()
    if result is None:
        raise SystemExit(f"the restarted epoch did not run ({runner.stopped_reason})")
    stats = repo.read_manifest(result.snapshot_id).stats
    spark.stop()
    shutil.rmtree(os.environ["EPOCHAL_STATE_CACHE_DIR"], ignore_errors=True)  # ≈ 2 GB
    return {
        "session_s": round(session_s, 2),
        "duration_s": round(result.duration_s, 3),
        "records_in": result.records_in,
        "output_rows": result.output_rows,
        "parallelism": result.parallelism,
        "restore_bytes": int(stats.get("restore_bytes", 0)),
        "restore_payload_bytes": int(stats.get("restore_payload_bytes", 0)),
        "restore_span_s": float(stats.get("restore_span_s", 0.0)),
        "restore_s": float(stats.get("restore_s", 0.0)),
        "state_read_bytes": int(stats.get("state_read_bytes", 0)),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.engine_restore", description=__doc__)
    p.add_argument("--store-url", required=True)
    p.add_argument("--namespace", required=True)
    p.add_argument("--data-dir", required=True)
    print(json.dumps(restart(p.parse_args(argv))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
