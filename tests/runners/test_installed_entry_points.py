"""What an installed Epochal offers users as jobs: the example jobs it ships, not the
benchmarks' own job, which only the processes a benchmark starts can see."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from runners import entry_points

ROOT = Path(__file__).resolve().parents[2]


def test_the_benchmark_job_is_not_offered_to_users() -> None:
    names = {r.name for r in entry_points.registered(entry_points.JOBS)}
    assert {"clickstream", "fraud", "web-totals"} <= names
    assert "bench-recovery" not in names


def test_a_benchmark_process_finds_its_job() -> None:
    from bench.engine_recovery import BENCH_ENTRY_POINTS

    code = "from runners import entry_points as e; print(e.lookup(e.JOBS, 'bench-recovery').value)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(ROOT), str(BENCH_ENTRY_POINTS)))}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True
    )
    assert done.stdout.strip() == "bench.engine:recovery_job", done.stderr
