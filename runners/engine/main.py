"""Job entry point: resume a job from its branch head and run epochs.

    python -m runners.engine.main --job module:attr --store URL --namespace NS \\
        --branch B --parallelism P [--max-epochs N] [--master local[2]]

`attr` is a `Job` or a callable returning one. Prints one JSON line per committed epoch.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from dataclasses import asdict

from runners.engine.job import Job
from runners.engine.runner import EpochRunner
from runners.engine.session import build_spark_session
from snapshots_store import Repository


def load_job(spec: str) -> Job:
    """The job named by ``module:attr`` (a Job, or a callable returning one)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise SystemExit(f"--job {spec!r}: expected module:attr")
    value = getattr(importlib.import_module(module_name), attr)
    job = value if isinstance(value, Job) else value()
    if not isinstance(job, Job):
        raise SystemExit(f"--job {spec!r} is not a Job (got {type(job).__name__})")
    return job


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runners.engine.main")
    parser.add_argument("--job", required=True, help="module:attr of a Job")
    parser.add_argument("--store", required=True, help="store URL, e.g. file://var/store")
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--branch", default="main")
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--max-parallelism", type=int, default=128)
    parser.add_argument("--max-epochs", type=int, default=None)
    parser.add_argument("--master", default=None, help="Spark master (default $SPARK_MASTER)")
    parser.add_argument("--notify", default=None, help="URL to POST each committed epoch to")
    args = parser.parse_args(argv)
    job = load_job(args.job)
    repo = Repository.open(args.store, args.namespace)
    spark = build_spark_session(master=args.master, app_name=f"epochal-{job.name}")
    runner = EpochRunner(
        spark,
        job,
        repo=repo,
        branch=args.branch,
        parallelism=args.parallelism,
        max_parallelism=args.max_parallelism,
        notify=args.notify,
    )
    print(json.dumps({"event": "started", "branch": args.branch}), flush=True)
    count = 0
    while args.max_epochs is None or count < args.max_epochs:
        print(json.dumps({"event": "epoch_start", "n": count + 1}), flush=True)
        result = runner.run_epoch()
        if result is None:
            if runner.stopped_reason == "paused":
                time.sleep(runner.poll_interval_s)
                continue
            break
        count += 1
        print(json.dumps({"event": "committed", **asdict(result)}), flush=True)
    print(json.dumps({"event": "stopped", "reason": runner.stopped_reason}), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
