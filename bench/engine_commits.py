"""The engine's vectorised throughput at two commits, back to back:
``python -m bench.engine_commits --old PATH [--runs 3] [--tolerance 0.05]``.

`--old` is a checkout of the baseline commit (e.g. ``git worktree add /tmp/old <commit>``);
the new side is this checkout. Each run measures both sides, one right after the other, in
alternating order (old first, then new first, …) so a machine whose load drifts favours
neither: a fresh ``python -m bench.engine --parts vectorised --variants engine`` per side,
with that checkout first on ``PYTHONPATH`` (the driver and Spark's Python workers import
its code; the interpreter and packages are this one's). Each run records the load averages
before and after each side. The verdict compares the medians of all runs: ``ratio`` =
median new ``engine_rps`` ÷ median old, within ``1 ± tolerance``; every side's checksums
must match the numpy reference. Progress goes to stderr; the last stdout line is one JSON
object; the exit status is 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.timing import log

HERE = Path(__file__).resolve().parent.parent


def _commit(checkout: Path) -> str:
    done = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=checkout, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def _side(checkout: Path, sizes: list[str]) -> dict[str, Any]:
    """One ``bench.engine`` vectorised run of `checkout`'s code: its JSON and the load."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(checkout), os.environ.get("PYTHONPATH", "")]),
    }
    command = [sys.executable, "-m", "bench.engine", "--parts", "vectorised",
               "--variants", "engine", *sizes]  # fmt: skip
    load_before = os.getloadavg()
    started = time.perf_counter()
    done = subprocess.run(command, cwd=checkout, env=env, capture_output=True, text=True)
    wall_s = time.perf_counter() - started
    load_after = os.getloadavg()
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise SystemExit(
            f"bench.engine in {checkout} printed no JSON (exit {done.returncode}):\n"
            f"{done.stderr[-2000:]}"
        )
    report = json.loads(lines[-1])
    return {
        "engine_rps": report["engine_rps"],
        #: where the engine's epochs went (driver, tasks, commit), to tell a side's slow run
        "engine_phase_breakdown": report.get("engine_phase_breakdown"),
        "checksums_match": bool(report.get("checksums_match", False)),
        "exit_status": done.returncode,
        "wall_s": round(wall_s, 1),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in load_after],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.engine_commits")
    parser.add_argument("--old", required=True, type=Path, help="checkout of the baseline")
    parser.add_argument("--new", type=Path, default=HERE, help="checkout measured against it")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tolerance", type=float, default=0.05)
    parser.add_argument("--keys", type=int, default=None)
    parser.add_argument("--records", type=int, default=None)
    parser.add_argument("--epochs", type=int, default=None)
    args = parser.parse_args(argv)
    if args.runs < 1 or not 0 < args.tolerance < 1:
        parser.error("--runs must be >= 1 and --tolerance in (0, 1)")
    sizes = [f"--{name}={value}" for name in ("keys", "records", "epochs")
             if (value := getattr(args, name)) is not None]  # fmt: skip
    sides = {"old": args.old.resolve(), "new": args.new.resolve()}
    runs: list[dict[str, Any]] = []
    for run in range(args.runs):
        order = ["old", "new"] if run % 2 == 0 else ["new", "old"]
        measured = {}
        for side in order:
            log(f"run {run + 1}/{args.runs}: {side} ({sides[side]})")
            measured[side] = _side(sides[side], sizes)
            log(f"  engine_rps {measured[side]['engine_rps']:,.0f}")
        runs.append({"order": order, **measured})
    old = statistics.median(r["old"]["engine_rps"] for r in runs)
    new = statistics.median(r["new"]["engine_rps"] for r in runs)
    ratio = new / old
    checks = {
        "checksums_match": all(r[s]["checksums_match"] for r in runs for s in ("old", "new")),
        "within_tolerance": abs(ratio - 1) <= args.tolerance,
    }
    print(
        json.dumps(
            {
                "bench": "engine_commits",
                "at": datetime.now(UTC).isoformat(timespec="seconds"),
                "old_commit": _commit(sides["old"]),
                "new_commit": _commit(sides["new"]),
                "part": "vectorised",
                "variant": "engine",
                "sizes": sizes or "bench.engine defaults",
                "runs": runs,
                "engine_rps_old_median": round(old, 1),
                "engine_rps_new_median": round(new, 1),
                "ratio_new_vs_old": round(ratio, 4),
                "tolerance": args.tolerance,
                "checks": checks,
                "cpu_count": os.cpu_count(),
            }
        )
    )
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
