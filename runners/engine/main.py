"""Job entry point: resume a job from its branch head and run epochs.

    python -m runners.engine.main --job NAME --store URL --namespace NS \\
        --branch B --parallelism P [--max-epochs N] [--master local[2]] \\
        [--follow [--poll-interval S]]

`NAME` is a job registered as an entry point of group ``epochal.jobs`` by an installed package
(`runners.entry_points`); it points at a `Job` or a callable returning one. Prints one JSON
line per event (`started`, `epoch_start`, `committed`, `stopped`). Without `--follow` the job
stops when the source has no new data; with it, it keeps polling the source (a long-running
service). Either way it stops at an epoch boundary on a stop request for its run
(`$EPOCHAL_RUN_ID`) in the branch's control document, on `stop_after_epoch`, and on SIGTERM /
SIGINT: a signal abandons an epoch whose Spark job is still running (nothing is committed; the
CAS is the only commit point) and the process exits 0 after a final `{"event": "stopped",
"reason": …}` line. A log source whose retention deleted records the job has not read
stops it with exit status 3 and the reason ``data lost: …`` naming them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import time
from collections.abc import Mapping
from typing import Any

from runners import entry_points
from runners.engine.job import Job
from runners.engine.runner import EpochRunner
from runners.engine.session import build_spark_session
from runners.engine.sinks import Closes
from runners.engine.streams import SourceDataLostError
from snapshots_store import Repository


def load_job(name: str, job_args: Mapping[str, Any] | None = None) -> Job:
    """The job registered as entry point `name` (group ``epochal.jobs``): a Job, or a
    callable returning one, called with `job_args` as keyword arguments (e.g.
    ``{"directory": "/data/clicks"}``)."""
    try:
        value = entry_points.load(entry_points.JOBS, name)
    except entry_points.EntryPointError as exc:
        raise SystemExit(f"--job: {exc}") from None
    if isinstance(value, Job):
        if job_args:
            raise SystemExit(f"--job {name!r} is a Job, not a factory: it takes no --job-args")
        job = value
    else:
        try:
            job = value(**dict(job_args or {}))
        except TypeError as exc:
            raise SystemExit(
                f"--job {name!r} rejected --job-args {dict(job_args or {})}: {exc}"
            ) from None
    if not isinstance(job, Job):
        raise SystemExit(f"--job {name!r} is not a Job (got {type(job).__name__})")
    return job


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m runners.engine.main")
    parser.add_argument(
        "--job", required=True, help="name of a job registered in entry-point group epochal.jobs"
    )
    parser.add_argument(
        "--job-args", default="{}", help="JSON object of keyword arguments for a job factory"
    )
    parser.add_argument("--store", required=True, help="store URL, e.g. file://var/store")
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--branch", default="main")
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--max-parallelism", type=int, default=128)
    parser.add_argument("--max-epochs", type=int, default=None)
    parser.add_argument("--master", default=None, help="Spark master (default $SPARK_MASTER)")
    parser.add_argument("--notify", default=None, help="URL to POST each committed epoch to")
    parser.add_argument(
        "--follow",
        action="store_true",
        help="keep running when the source has no new data, polling it for more",
    )
    parser.add_argument(
        "--poll-interval",
        type=float,
        default=1.0,
        help="seconds between polls of the source (--follow) or of a paused job's control",
    )
    return parser


def _print_event(event: dict[str, Any]) -> None:
    print(json.dumps(event), flush=True)


def main(argv: list[str] | None = None, *, standby: bool = False) -> int:
    """Run the job; `standby` says a warm standby driver took this run over (its session was
    up before the run started: runners/engine/standby.py)."""
    began = time.perf_counter()
    parser = _parser()
    args = parser.parse_args(argv)
    if args.poll_interval <= 0:
        parser.error("--poll-interval must be > 0")
    signalled: list[str] = []
    runner: EpochRunner | None = None

    def on_signal(signum: int, _frame: Any) -> None:
        signalled.append(signal.Signals(signum).name)
        if runner is not None:
            runner.interrupt(signalled[0])

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    try:
        job_args = json.loads(args.job_args)
    except ValueError as exc:
        parser.error(f"--job-args is not JSON: {exc}")
    if not isinstance(job_args, dict):
        parser.error("--job-args must be a JSON object")
    job = load_job(args.job, job_args)
    repo = Repository.open(args.store, args.namespace)
    loaded = time.perf_counter()
    spark = build_spark_session(master=args.master, app_name=f"epochal-{job.name}")
    session_s = time.perf_counter() - loaded
    runner = EpochRunner(
        spark,
        job,
        repo=repo,
        branch=args.branch,
        parallelism=args.parallelism,
        max_parallelism=args.max_parallelism,
        notify=args.notify,
        poll_interval_s=args.poll_interval,
    )
    if signalled:  # a signal arrived while Spark started
        runner.interrupt(signalled[0])
    started = {"event": "started", "branch": args.branch, "standby": standby}
    # seconds in this process: loading the job and the store, then the SparkSession
    _print_event({**started, "load_s": round(loaded - began, 3), "session_s": round(session_s, 3)})
    status = 0
    try:
        runner.run(args.max_epochs, follow=args.follow, on_event=_print_event)
    except SourceDataLostError as exc:  # retention deleted records the job still needs
        _print_event({"event": "stopped", "reason": f"data lost: {exc}"})
        status = 3
    if status == 0:
        for sink in job.sinks:  # producers with nothing left to commit
            if isinstance(sink, Closes):
                with contextlib.suppress(Exception):
                    sink.close()
    with contextlib.suppress(Exception):  # after SIGTERM to the group the JVM may be gone
        spark.stop()
    return status


if __name__ == "__main__":
    sys.exit(main())
