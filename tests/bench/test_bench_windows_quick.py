"""`python -m bench.windows` at tiny sizes runs both parts end to end: every variant's rows
(the engine's windows and per-key timers, Spark's windowed aggregation and
transformWithStateInPandas with event-time timers) equal the numpy reference.

Run as a subprocess: the bench starts its own SparkSession with its own settings (the RocksDB
state store provider for transformWithStateInPandas), which must not leak into the shared one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import require_service

REPO_ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.spark, pytest.mark.slow]  # a JVM of its own, ~2 min under load


def test_bench_windows_both_parts_quick(tmp_path: Path) -> None:
    require_service("Java", shutil.which("java") is not None, "install OpenJDK 17")
    args = ["--keys", "800", "--records", "1500", "--epochs", "2", "--timer-keys", "300",
            "--timer-records", "600", "--timer-epochs", "3", "--runs", "1",
            "--work-dir", str(tmp_path)]  # fmt: skip
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    done = subprocess.run(
        [sys.executable, "-m", "bench.windows", *args],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["checks_passed"] and report["parts"] == ["windows", "timers"]
    timers = report["timers"]
    run = timers["runs"][0]
    expected = timers["reference_checksum"]
    assert expected["rows"] > 100
    assert run["engine_timers"]["checksum"] == run["spark_transform_with_state"]["checksum"]
    assert run["engine_timers"]["checksum"] == expected
    assert sum(run["engine_timers"]["timers_fired"]) == expected["rows"]
    assert (
        report["ratio_vs_spark_transform_with_state"] == run["ratio_vs_spark_transform_with_state"]
    )
    assert (
        report["windows"]["runs"][0]["engine"]["checksum"]
        == report["windows"]["reference_checksum"]
    )
