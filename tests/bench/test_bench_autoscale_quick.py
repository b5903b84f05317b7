"""`python -m bench.autoscale --quick` runs end to end (a subprocess: its own SparkSession):
its last line is JSON with the ramp's figures; nothing is lost and the autoscaled run's output
equals the pandas reference computed from the input files. Timing figures (reaction, flaps)
are the full run's to judge; here they only have to be reported. The reference and the
comparison themselves are checked on small inputs without Spark."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.autoscale import (
    REQUIRED_KEYS,
    EpochRow,
    _epoch_checksums,
    analyse,
    compare_checksums,
    reference_checksum,
    steps_from,
    write_file,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.spark
def test_bench_autoscale_quick_reports_a_lossless_ramp(tmp_path: Path) -> None:
    # (--plot: tests/bench/test_autoscale_plot.py draws the figure once)
    done = subprocess.run(
        [sys.executable, "-m", "bench.autoscale", "--quick"],
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
    assert report["verdict"] == "met" and report["missed"] == []
    assert report["runs"] == 1 and len(report["per_run"]) == 1
    assert report["per_run"][0]["checksum_mismatches"] == []
    assert len(report["loadavg_per_run"]) == 1
    assert report["epochs"] == 14
    assert [r["records_in"] for r in report["series"]] == [300] * 4 + [1200] * 8 + [300] * 2
    assert len(report["loadavg_start"]) == 3 and len(report["loadavg_end"]) == 3
    assert {s["parallelism"] for s in report["sweep"]} == {2, 6}


def test_the_reference_is_computed_from_the_input_files_and_catches_a_wrong_epoch(
    tmp_path: Path,
) -> None:
    import pandas as pd
    import pyarrow.parquet as pq

    for index, records in enumerate([5, 8, 3]):
        write_file(str(tmp_path), index, records, keys=3, cost_ms=1.0, jitter=0.3)
    reference = reference_checksum(tmp_path)
    assert [(e, rows) for e, rows, _ in reference] == [
        (e, len({*pq.read_table(f).column("key").to_pylist()}))
        for e, f in enumerate(sorted(tmp_path.glob("*.parquet")), start=1)
    ]
    # the same output written by hand: per key the records read and the running sum
    rows, totals = [], {}
    for epoch, path in enumerate(sorted(tmp_path.glob("*.parquet")), start=1):
        frame = pq.read_table(path).to_pandas()
        assert frame["cost_ms"].nunique() == 1  # a file's records share its cost factor
        for key, part in frame.groupby("key"):
            totals[key] = totals.get(key, 0) + int(part["value"].sum())
            rows.append({"epoch": epoch, "key": key, "total": totals[key], "n": len(part)})
    engine_like = _epoch_checksums(pd.DataFrame(rows))
    assert compare_checksums(engine_like, reference) == []
    rows[-1]["total"] += 1  # one wrong running sum in the last epoch
    problems = compare_checksums(_epoch_checksums(pd.DataFrame(rows)), reference)
    assert len(problems) == 1 and problems[0].startswith("epoch 3:")
    assert compare_checksums(engine_like[:-1], reference)[0].startswith("epoch 3:")


def test_lost_epochs_and_steps_from_the_sweeps_best() -> None:
    loads = [10, 10, 40, 40]
    rows = [EpochRow(e, 2, n, 1.0, 0, float(e)) for e, n in enumerate(loads[:3], start=1)]
    assert analyse(rows, loads, 2)["epochs_lost"] == 1  # the last file never committed
    sweep = (2, 3, 4, 5, 6, 8)
    assert steps_from(4, 3, sweep) == 1 and steps_from(3, 4, sweep) == -1
    assert steps_from(5, 3, sweep) == 2
    assert steps_from(7, 6, sweep) == 0.5 and steps_from(8, 6, sweep) == 1


@pytest.mark.spark
def test_a_run_whose_input_vanishes_stops_and_counts_the_lost_epochs(
    spark: object, tmp_path: Path
) -> None:
    from bench.autoscale import QUICK, run

    loads = [50, 50, 50]
    data = tmp_path / "vanish-input"

    def remove_the_rest(result: object) -> None:  # after the first commit
        for path in sorted(data.glob("*.parquet"))[1:]:
            path.unlink()

    done = run(
        spark,
        tmp_path,
        "vanish",
        loads,
        QUICK,
        parallelism=2,
        realtime=False,
        stall_s=3.0,
        on_commit=remove_the_rest,
    )
    assert done.timed_out and len(done.rows) == 1
    assert analyse(done.rows, loads, 2)["epochs_lost"] == 2
