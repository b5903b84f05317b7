"""A tiny stand-in for `runners.engine.main` with the same command line, for launcher tests.

`--job sample-<behaviour>` picks what it does: `epochs` runs `--max-epochs`
short epochs and exits 0; `until_stopped` polls the branch's control document between epochs
and exits 0 when asked to stop; `stubborn` ignores stop requests and SIGTERM; `crash` exits 3;
`with_grandchild` starts a long `sleep` and then behaves like `stubborn`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

from runners.launcher import RUN_ID_ENV, stop_requested
from snapshots_store import Repository


def main() -> int:
    parser = argparse.ArgumentParser()
    for name in ("--job", "--store", "--namespace", "--branch"):
        parser.add_argument(name, required=True)
    parser.add_argument("--parallelism", type=int, required=True)
    parser.add_argument("--max-epochs", type=int, default=None)
    args = parser.parse_args()
    behaviour = args.job.removeprefix("sample-")
    run_id = os.environ[RUN_ID_ENV]
    print(
        "sample-job-start "
        + json.dumps(
            {
                "behaviour": behaviour,
                "run_id": run_id,
                "spark_master": os.environ.get("SPARK_MASTER"),
                "pyspark_submit_args": os.environ.get("PYSPARK_SUBMIT_ARGS"),
                "parallelism": args.parallelism,
                "pid": os.getpid(),
                "pgid": os.getpgid(0),
            }
        ),
        flush=True,
    )
    if behaviour == "crash":
        print("sample job: failing on purpose", file=sys.stderr, flush=True)
        return 3
    if behaviour in {"stubborn", "with_grandchild"}:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if behaviour == "with_grandchild":
            grandchild = subprocess.Popen(["sleep", "1000"])
            print(f"grandchild {grandchild.pid}", flush=True)
        while True:
            time.sleep(0.1)
    repo = Repository.open(args.store, args.namespace)
    epoch = 0
    while args.max_epochs is None or epoch < args.max_epochs:
        epoch += 1
        print(f"epoch {epoch}", flush=True)
        time.sleep(0.05)
        if behaviour == "until_stopped":
            doc, _ = repo.read_control(args.branch)
            if stop_requested(doc, run_id):
                print(f"stopping at the boundary of epoch {epoch}", flush=True)
                return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
