"""`python -m bench.sources --quick` runs end to end against the real Redis and RabbitMQ
Streams and Kafka and prints its JSON (so it cannot rot): a rate per source, one ratio per
stream source, publication-to-commit lag, the Kafka sink's ratio and exactly-once check,
results equal to the reference, load averages. (Its spark_kafka part fetches Spark's Kafka
connector from Maven Central, which a test never does: it runs in the benchmark only.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.spark, pytest.mark.services]


def test_bench_sources_quick_reports_rates_ratios_and_lag(
    redis_url: str, rabbitmq_stream_url: str, kafka_bootstrap: str
) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SPARK_LOCAL_IP": "127.0.0.1"}
    done = subprocess.run(
        [sys.executable, "-m", "bench.sources", "--quick", f"--redis-url={redis_url}",
         f"--rabbitmq-url={rabbitmq_stream_url}", f"--kafka-servers={kafka_bootstrap}",
         "--parts=sink"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=540,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["results_match"] is True
    assert set(report["records_per_s"]) == {
        "files", "redis", "rabbitmq", "kafka", "kafka_without_sink", "kafka_with_sink"
    }  # fmt: skip
    assert all(rate > 0 for rate in report["records_per_s"].values())
    assert set(report["ratio_stream_vs_files"]) == {"redis", "rabbitmq", "kafka"}
    assert report["ratio_with_sink"] > 0 and report["checks"]["exactly_once_checked"] is True
    assert "ratio_vs_spark_kafka" not in report  # --parts=sink
    for source in ("redis", "rabbitmq", "kafka"):
        lag = report["lag_ms"][source]
        assert 0 < lag["p50"] <= lag["p99"] and lag["records"] == 300
        assert len(lag["loadavg"]) == 3
    assert len(report["loadavg"]["start"]) == 3 and len(report["loadavg"]["redis"]) == 3
