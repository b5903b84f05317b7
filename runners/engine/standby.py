"""A warm standby driver: ``python -m runners.engine.standby DIR --primary RUN_DIR``.

Started by the local launcher next to a run (`runners.local_standby`). It waits until the run
it shadows (RUN_DIR) has committed an epoch — so its JVM never competes with that run's own
start — then builds the SparkSession, forks the Python workers with the engine's task modules
imported (a warm-up job of one task per core), runs a few tiny synthetic epochs through the
engine on a scratch store (`warm_epochs`), writes ``ready.json`` (with the fingerprint of the
engine's and the job package's code, taken before any of it was imported) and waits.

Adoption is a handshake (`runners.local_standby`): the launcher writes ``offer.json`` (a run
id and a nonce); the standby answers ``ack.json`` with the nonce and its pid, and from then on
it never exits on its own without running the run. The launcher renames the directory to the
run's and writes ``go.json`` (the run's engine arguments and environment); the driver goes on
as `runners.engine.main` with the session it has and writes ``engine.json`` when the engine
returns. Should ``go.json`` not come within ``--go-timeout`` seconds of the ack (the launcher
died between the two), it exits with status 75: whatever directory it is in by then is not a
run that succeeded. Before any offer it exits 0 without running anything when the shadowed run
ended cleanly (no more input) or its directory is gone, and after ``--orphan-timeout`` seconds
(default 900) of a failed run that nobody restarted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from runners import config
from runners.local_standby import ACK, ENGINE_EXIT, GO, OFFER, READY, code_fingerprint
from runners.processes import process_alive, read_json, write_json

#: seconds between looks at ``go.json`` (the adoption's latency) and at the shadowed run
GO_POLL_S = 0.01
PRIMARY_POLL_S = 0.25
#: a failed run nobody restarted in this long (the restart policy gave up, or its back-off is
#: longer): the standby exits and frees its memory
ORPHAN_TIMEOUT_S = 900.0
#: seconds from the ack to ``go.json`` before the standby gives up (exit status 75)
GO_TIMEOUT_S = 60.0
#: the exit status when an acknowledged adoption never came
NO_GO = 75


def primary_state(primary: Path, *, commits: bool = True) -> str:
    """``committed`` (the run has committed an epoch; looked for only with `commits`: it
    reads the run's log), ``running``, ``failed`` (it ended without a clean exit: a restart
    will want us) or ``done`` (exit 0, or its directory is gone)."""
    if not primary.is_dir():
        return "done"
    ended = read_json(primary / "exit.json")
    if ended is not None:
        return "done" if ended.get("returncode") == 0 else "failed"
    pid = read_json(primary / "pid")
    if pid is not None and not process_alive(int(pid["pid"]), pid.get("start_time")):
        return "failed"
    if not commits:
        return "running"
    try:
        with open(primary / "output.log", "rb") as log:
            if b'"event": "committed"' in log.read():
                return "committed"
    except OSError:
        pass
    return "running"


def _warm_task(_: Iterator[Any]) -> Iterator[int]:
    import runners.engine.tasks  # noqa: F401 (pyarrow, numpy, the engine: once per worker)

    yield os.getpid()


def warm_up(spark: Any) -> list[int]:
    """Fork the Python workers (one task per core) with the engine's task modules imported;
    with worker reuse they stay up for the first epoch. Returns the workers' pids."""
    from runners.engine.session import build_spark_session
    from runners.engine.spark_ui import job_session_conf

    # the adopted run's own build_spark_session finds this session; its first call on an
    # existing session builds the lazy session state (about 0.4 s), so pay that here
    build_spark_session(app_name="epochal-standby", conf=job_session_conf())
    sc = spark.sparkContext
    p = sc.defaultParallelism
    pids: list[int] = []
    for _ in range(2):  # the second round runs on warm workers and a warmer JVM path
        pids = sc.parallelize(range(p), p).mapPartitions(_warm_task).collect()
    warm_epochs(spark, p)
    return sorted(set(pids))


def warm_epochs(spark: Any, parallelism: int, epochs: int = 3) -> None:
    """Run a few tiny epochs of a synthetic job through the engine's own path (routing,
    restore stage, map and reduce tasks, chunk writes, manifest, CAS) on a scratch store, so
    that the JVM's and the workers' first-epoch costs are paid here, not in the first epoch
    of the run the standby takes over. Its chunks are content-addressed: the state cache may
    keep a few kilobytes of them, which no other chain can mistake for its own."""
    from runners.engine import aggregations as agg
    from runners.engine.job import Job
    from runners.engine.runner import EpochRunner
    from runners.engine.sources import Generator
    from snapshots_store import Repository

    job = Job(
        name="standby-warm-up",
        source=Generator(keys=2_000, records_per_epoch=4_000, epochs=epochs),
        key="key",
        aggregate=[agg.count(), agg.sum("value"), agg.max("value")],
        time_mode="logical",
    )
    with tempfile.TemporaryDirectory(prefix="epochal-standby-") as scratch:
        repo = Repository.open(f"file://{scratch}/store", "warm-up")
        runner = EpochRunner(spark, job, repo=repo, parallelism=parallelism)
        runner.crash = None  # a test's crash point is for the run, not for this warm-up
        runner.run(max_epochs=epochs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runners.engine.standby")
    parser.add_argument("directory", help="the standby's directory (renamed to the run's)")
    parser.add_argument("--primary", required=True, help="the run directory it shadows")
    parser.add_argument(
        "--orphan-timeout",
        type=float,
        default=ORPHAN_TIMEOUT_S,
        help="exit when the shadowed run failed this many seconds ago and no run adopted it",
    )
    parser.add_argument(
        "--go-timeout",
        type=float,
        default=GO_TIMEOUT_S,
        help="exit with status 75 when go.json has not come this long after the ack",
    )
    parser.add_argument(
        "--packages",
        default="runners,snapshots_store",
        help="comma list of the top-level packages whose code the run executes (fingerprinted)",
    )
    args = parser.parse_args(argv)
    directory_fd = os.open(args.directory, os.O_RDONLY | os.O_DIRECTORY)
    # before the engine or the job is imported: the code this driver will run is on disk now
    code = code_fingerprint(p for p in args.packages.split(",") if p)
    primary = Path(args.primary)
    while (state := primary_state(primary)) == "running":
        time.sleep(PRIMARY_POLL_S)
    if state == "done":
        return 0
    started = time.perf_counter()
    from runners.engine.session import build_spark_session
    from runners.engine.spark_ui import job_session_conf

    spark = build_spark_session(app_name="epochal-standby", conf=job_session_conf())
    session_s = time.perf_counter() - started
    workers = warm_up(spark)
    ready = {
        "session_s": round(session_s, 3),
        "warm_s": round(time.perf_counter() - started - session_s, 3),
        "workers": workers,
        "code": code,
        "pid": os.getpid(),
    }
    write_json(Path(READY), ready, dir_fd=directory_fd)
    print(json.dumps({"event": "standby_ready", **ready}), flush=True)
    go = wait_for_go(directory_fd, primary, args.orphan_timeout, args.go_timeout)
    if go is None:  # nobody will adopt it (no offer was acknowledged)
        spark.stop()
        return 0
    if not go:  # acknowledged, then never told to go
        print(json.dumps({"event": "standby_no_go", "after_s": args.go_timeout}), flush=True)
        return NO_GO
    config.update_environment({str(k): str(v) for k, v in go.get("env", {}).items()})
    from runners.engine import main as engine

    returncode = engine.main([str(a) for a in go["argv"]], standby=True)
    write_json(Path(ENGINE_EXIT), {"returncode": returncode}, dir_fd=directory_fd)
    return returncode


def wait_for_go(
    directory_fd: int, primary: Path, orphan_timeout_s: float, go_timeout_s: float
) -> dict[str, Any] | None:
    """The handshake's standby side: ``go.json`` once a launcher's offer was acknowledged;
    None when the standby should exit unadopted (the shadowed run ended cleanly, or failed
    `orphan_timeout_s` ago, and no offer came first); ``{}`` when ``go.json`` did not come
    within `go_timeout_s` of the ack."""
    checked = time.monotonic()
    failed_at: float | None = None
    acked_at: float | None = None
    while True:
        if acked_at is not None:
            go = read_json(Path(GO), dir_fd=directory_fd)
            if go is not None:
                return go
            if time.monotonic() - acked_at > go_timeout_s:
                return {}
            time.sleep(GO_POLL_S)
            continue
        offer = read_json(Path(OFFER), dir_fd=directory_fd)
        if offer is not None:  # alive and not exiting: take it, never exit unadopted now
            ack = {"run_id": offer.get("run_id"), "nonce": offer.get("nonce"), "pid": os.getpid()}
            write_json(Path(ACK), ack, dir_fd=directory_fd)
            acked_at = time.monotonic()
            continue
        time.sleep(GO_POLL_S)
        if time.monotonic() - checked < PRIMARY_POLL_S:
            continue
        checked = time.monotonic()
        state = primary_state(primary, commits=False)
        if state == "failed" and failed_at is None:
            failed_at = checked
        orphaned = failed_at is not None and checked - failed_at > orphan_timeout_s
        if state == "done" or orphaned:
            return None


if __name__ == "__main__":
    sys.exit(main())
