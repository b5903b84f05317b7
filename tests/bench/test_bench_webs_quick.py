"""`python -m bench.webs --quick` runs end to end: its last line is JSON with the alignment
latency figures, and both variants are correct (run as a subprocess: its own SparkSession)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.webs import REQUIRED_KEYS

REPO_ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.spark


def test_bench_webs_quick_prints_the_latency_json() -> None:
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    done = subprocess.run(
        [sys.executable, "-m", "bench.webs", "--quick", "--epochs", "3", "--interval", "2"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    for key in REQUIRED_KEYS:
        assert isinstance(report[key], float | int), key
    assert report["correct"] is True and report["epochs"] == 3
    assert report["alignment_extra_latency_epochs_mean"] >= 0
    assert (
        report["alignment_extra_latency_epochs_mean"]
        <= report["alignment_extra_latency_epochs_max"]
    )
