"""Shared command line of the example jobs: generate data, run epochs, print a summary."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from runners.engine import EpochRunner, Job, read_output
from runners.engine.session import build_spark_session
from snapshots_store import Repository


def run_example(
    parser: argparse.ArgumentParser,
    argv: list[str] | None,
    *,
    generate: Callable[..., None],
    make_job: Callable[[str], Job],
    namespace: str,
) -> None:
    parser.add_argument("--data", required=True, help="input directory (generated if empty)")
    parser.add_argument("--store", default="file://var/store")
    parser.add_argument("--namespace", default=namespace)
    parser.add_argument("--branch", default="main")
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--files", type=int, default=5)
    args = parser.parse_args(argv)
    import os

    if not os.path.isdir(args.data) or not os.listdir(args.data):
        generate(args.data, files=args.files)
    repo = Repository.open(args.store, args.namespace)
    spark = build_spark_session(app_name=f"epochal-{namespace}")
    runner = EpochRunner(
        spark, make_job(args.data), repo=repo, branch=args.branch, parallelism=args.parallelism
    )
    for result in runner.run():
        print(json.dumps({"epoch": result.epoch, "snapshot": result.snapshot_id[:12],
                          "records_in": result.records_in, "output_rows": result.output_rows,
                          "duration_s": round(result.duration_s, 3)}))  # fmt: skip
    output: Any = read_output(repo, args.branch)
    print(f"{output.num_rows} output rows on branch {args.branch}; first rows:")
    for row in output.slice(0, 5).to_pylist():
        print("  ", row)
    spark.stop()
