"""`python -m bench.api` at tiny sizes runs end to end and prints its JSON (so it cannot rot).

Uses PostgreSQL when DATABASE_URL names it (the bench creates and drops its own scratch
database beside it), a scratch SQLite file otherwise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REQUIRED = {
    "clients",
    "snapshots",
    "p50_ms",
    "p99_ms",
    "errors",
    "server_cpu_ms_per_request",
    "p99_ms_304",
    "saturation_rps",
    "idle_watch_cpu_ms_per_s",
    "loadavg_1m_before",
}


@pytest.mark.parametrize(
    "server",
    # the Helm chart's server in CI; gunicorn (the alternative) in the slow run, keeping CI
    # under its time budget
    ["granian", pytest.param("gunicorn", marks=pytest.mark.slow)],
)
def test_bench_api_quick_run_reports_latencies_and_no_errors(tmp_path: Path, server: str) -> None:
    env = {**os.environ, "EPOCHAL_VAR_DIR": str(tmp_path / "var")}
    if not env.get("DATABASE_URL", "").startswith("postgres"):
        env.pop("DATABASE_URL", None)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.api",
            f"--server={server}",
            "--snapshots=300",
            "--branches=5",
            "--clients=4",
            "--rate=5",
            "--seconds=3",
            "--warmup-seconds=1",
            "--workers=1",
            "--threads=4",
            "--watch-slots=3",
            "--conditional-seconds=2",
            "--steps=20,40",
            "--step-seconds=2",
            "--idle-seconds=3",
            "--watch-hold=2",
            "--class-seconds=1.5",
            "--runs=2",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(result) >= REQUIRED
    assert result["snapshots"] == 300 and result["clients"] == 4
    assert result["server"] == server and result["server_version"]
    assert result["errors"] == 0, done.stderr[-3000:]
    for endpoint in ("job", "snapshots", "lineage", "baseline_healthz"):
        assert result[f"{endpoint}_requests"] > 0
        assert 0 < result[f"{endpoint}_p50_ms"] <= result[f"{endpoint}_p99_ms"]
    assert result["requests_304"] > 0
    # CPU per request per endpoint class (each in a window of its own), healthz apart, the
    # PostgreSQL backends' share counted with the web server's when the database is theirs
    postgres = env.get("DATABASE_URL", "").startswith("postgres")
    assert result["postgres_cpu_counted"] is postgres
    costs = result["server_cpu_ms_per_request"]
    assert set(costs) == {"job", "snapshots", "lineage", "healthz", "api"}
    for endpoint, cost in costs.items():
        assert cost["total"] == pytest.approx(cost["web"] + cost["postgres"], abs=0.002)
        assert cost["web"] > 0, endpoint
    if postgres:
        assert costs["lineage"]["postgres"] > 0  # PostgreSQL writes the lineage page's JSON
    # two runs, every one listed; each target judged on the median of the runs
    assert result["runs_count"] == 2 and len(result["runs"]) == 2
    for run in result["runs"]:
        assert run["loadavg_1m_before"] >= 0 and run["errors"] == 0
        assert set(run["server_cpu_ms_per_request"]) == set(costs)
    verdicts = result["verdicts"]
    assert set(verdicts) >= {"server_cpu_ms_per_request.api", "saturation_rps"}
    for verdict in verdicts.values():
        assert len(verdict["runs"]) == 2 and isinstance(verdict["met"], bool)
    lineage = [run["server_cpu_ms_per_request"]["lineage"]["total"] for run in result["runs"]]
    assert costs["lineage"]["total"] == pytest.approx(sum(lineage) / 2, abs=0.002)
    assert result["saturation_steps"][0]["offered_rps"] == 20
    answers = result["idle_watch_answers"]
    assert answers["304"] > 0 and answers["200"] == 0 and answers["other"] == 0
