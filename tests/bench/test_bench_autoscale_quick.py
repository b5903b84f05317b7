"""`python -m bench.autoscale --quick` runs end to end (a subprocess: its own SparkSession):
its last line is JSON with the ramp's figures; nothing is lost and the autoscaled run's output
equals the fixed-parallelism run's. Timing figures (reaction, flaps) are the full run's to
judge on a quiet machine; here they only have to be reported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.autoscale import REQUIRED_KEYS

REPO_ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.spark


def test_bench_autoscale_quick_reports_a_lossless_ramp(tmp_path: Path) -> None:
    plot = tmp_path / "ramp.html"
    done = subprocess.run(
        [sys.executable, "-m", "bench.autoscale", "--quick", "--plot", str(plot)],
        cwd=REPO_ROOT,
        env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    for key in REQUIRED_KEYS:
        assert key in report, key
    assert report["epochs_lost"] == 0
    assert report["checksums_match"] is True
    assert report["epochs"] == 14
    assert [r["records_in"] for r in report["series"]] == [300] * 4 + [1200] * 8 + [300] * 2
    assert len(report["loadavg_start"]) == 3 and len(report["loadavg_end"]) == 3
    assert {s["parallelism"] for s in report["sweep"]} == {2, 6}
    assert "plotly" in plot.read_text()
