"""`python -m bench.engine --quick` runs end to end and every variant's checksums agree.

Run as a subprocess: the bench starts its own SparkSession with its own settings (state store
provider switches, Python worker interpreter), which must not leak into the shared test session.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench import checksum as ck
from bench.datagen import EpochSet
from bench.engine import PARTS, REQUIRED_KEYS, _child_report, scale_child_failure
from runners.local import group_members
from tests.conftest import require_service

REPO_ROOT = Path(__file__).resolve().parents[2]
OWN_TEST_PARTS = ("restore", "large_state")

pytestmark = pytest.mark.spark


def test_reference_checksums_agree_with_arrow(tmp_path: Path) -> None:
    """The numpy reference and the Arrow checksum compute the same function."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    data = EpochSet(tmp_path / "d", keys=300, records=400, epochs=2).generate()
    per_epoch = ck.reference_per_epoch(data)
    for epoch, expected in zip(range(1, 3), per_epoch, strict=True):
        table = pq.read_table(data.path(epoch))
        grouped = table.group_by("key").aggregate(
            [("value", "count"), ("value", "sum"), ("value", "max")]
        )
        grouped = grouped.rename_columns(
            [
                {"value_count": "count", "value_sum": "sum_value", "value_max": "max_value"}.get(
                    n, n
                )
                for n in grouped.column_names
            ]
        )
        assert ck.checksum_arrow(grouped) == expected
        assert expected.rows == pc.count_distinct(table.column("key")).as_py()
    running = ck.reference_running(data)
    assert running[0] == per_epoch[0]
    # Epoch 2 outputs the running values of the keys it touched: same rows, larger counts.
    assert running[1].rows == per_epoch[1].rows
    assert running[1].sum_count > per_epoch[1].sum_count == 400


def test_bench_engine_quick(tmp_path: Path) -> None:
    require_service("Java", shutil.which("java") is not None, "install OpenJDK 17")
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    env["PYTHONPATH"] = os.pathsep.join(x for x in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if x)
    # every part but scale, recovery and spark_ui, which start more Spark sessions in child
    # processes, and restore and large_state (test_bench_engine_quick_restore_and_large_state)
    children = ("scale", "recovery", "spark_ui")
    parts = ",".join(p for p in PARTS if p not in (*children, *OWN_TEST_PARTS))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.engine",
            "--quick",
            "--parts",
            parts,
            "--work-dir",
            str(tmp_path / "w"),
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert lines, f"no stdout; stderr tail:\n{proc.stderr[-4000:]}"
    report = json.loads(lines[-1])
    assert proc.returncode == 0, f"exit {proc.returncode}; stderr tail:\n{proc.stderr[-4000:]}"
    missing = [k for k in REQUIRED_KEYS if k not in report]
    assert not missing, missing
    assert report["checksums_match"] is True, report["checksum_problems"]
    for key in REQUIRED_KEYS:
        # the parts this test leaves out report null
        assert report[key] is not None or key.startswith(
            ("scale", "recovery", "restore", "disk_read", "large_state", "spark_ui")
        ), key
    assert report["live_rescale_epochs_lost"] == 0
    assert sorted(set(report["live_rescale_parallelism"])) == [2, 3]
    assert report["limit_rps"] > report["engine_rps"]  # no Spark, no durability: the ceiling
    for variant, options in report["peers_jvm_options"].items():  # the JVM's defaults
        flags = " ".join(options["jvm_arguments"])
        assert "TieredStopAtLevel" not in flags and "UseSerialGC" not in flags, variant
        assert options["max_heap_mb"] > 2048, variant  # driver_memory 4g, not Spark's 1g
    assert report["driver_memory"] == "4g"
    assert set(report["part_wall_s"]) == {"session", "warm", *parts.split(",")}
    assert all(seconds > 0 for seconds in report["part_wall_s"].values())
    assert len(report["driver_points"]) == 6
    assert report["engine_rps"] > 0 and report["spark_builtin_rps"] > 0
    assert report["engine_python_rps"] > 0 and report["spark_tws_rps"] > 0
    assert report["bytes_written_per_epoch"] > 0
    assert report["changed_state_bytes_per_epoch"] > 0
    assert report["peak_rss_mb"] > 100  # the JVM is in the process tree
    assert set(report["seconds_per_epoch"]) >= {
        "engine",
        "spark_builtin",
        "stateless",
        "engine_python",
        "spark_tws",
        "spark_tws_row",
        "engine_incremental",
        "polars_limit",
    }


def test_bench_engine_quick_restore_and_large_state(tmp_path: Path) -> None:
    """The restore part (a restart at p = 3 in a child session, the disk baseline) and the
    large_state part (engine at M = 4,096 and the peers over an incremental key space) run at
    tiny sizes and report every figure."""
    require_service("Java", shutil.which("java") is not None, "install OpenJDK 17")
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    env["PYTHONPATH"] = os.pathsep.join(x for x in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if x)
    argv = [sys.executable, "-m", "bench.engine", "--quick", "--parts", ",".join(OWN_TEST_PARTS)]
    argv += ["--work-dir", str(tmp_path / "w"), "--restore-keys", "30000"]
    proc = subprocess.run(argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=540)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert lines, f"no stdout; stderr tail:\n{proc.stderr[-4000:]}"
    report = json.loads(lines[-1])
    assert proc.returncode == 0, f"exit {proc.returncode}; stderr tail:\n{proc.stderr[-4000:]}"
    assert report["checksums_match"] is True, report["checksum_problems"]
    restore = report["restore"]
    assert restore["keys"] == 30000 and restore["parallelism"] == [2, 3]
    # the restarted tasks read the whole snapshot's state from the store, nothing from a cache
    assert restore["restore_bytes"] == restore["state_stored_bytes"] > 0
    assert restore["restore_payload_bytes"] == restore["state_payload_bytes"]
    assert restore["state_payload_bytes"] > restore["state_stored_bytes"]  # compressed
    assert restore["page_cache_drop"] in ("drop_caches", "fadvise")
    assert restore["disk_read_bytes"] >= restore["state_stored_bytes"]  # whole pack files
    assert report["restore_mb_s"] > 0 and report["disk_read_mb_s"] > 0
    # restore_mb_s is over the whole stage (its Spark job), the span's rate is named apart
    stored_mb = restore["restore_bytes"] / 1e6
    stage_mb_s = stored_mb / restore["restore_stage_s"]
    span_mb_s = stored_mb / restore["restore_span_s"]
    assert report["restore_stage_mb_s"] == report["restore_mb_s"]
    # the figures are rounded to 0.001 MB/s (small at these sizes)
    assert report["restore_mb_s"] == pytest.approx(stage_mb_s, rel=0.01, abs=0.0006)
    assert report["restore_span_mb_s"] == pytest.approx(span_mb_s, rel=0.01, abs=0.0006)
    assert restore["restore_stage_s"] >= restore["restore_span_s"] > 0
    # the baseline reads like the stage (its streams, reads and read-ahead); single beside
    assert restore["disk_parallel"]["streams"] == 2 * 4
    assert restore["disk_parallel"]["read_ahead_bytes"] > 0
    assert report["disk_read_single_stream_mb_s"] > 0
    disk_mb_s = report["disk_read_mb_s"]
    assert report["restore_ratio"] == pytest.approx(stage_mb_s / disk_mb_s, rel=0.05, abs=0.002)
    assert report["restore_span_ratio"] == pytest.approx(span_mb_s / disk_mb_s, rel=0.05, abs=0.002)
    large = report["large_state"]
    assert large["keys"] == 20000 and large["max_parallelism"] == 4096
    assert large["total_records"] == 20000 + 2 * 2000
    for variant in ("engine", "spark_builtin", "stateless"):
        assert large[f"{variant}_rps"] > 0, variant
        assert large["peak_rss_mb"][variant] > 100, variant  # the JVM is in the process tree
        assert len(large["seconds_per_epoch"][variant]) == 3, variant
    assert 0 < large["commit_p50_ms"] <= large["commit_p99_ms"]


def test_bench_engine_recovery_restarts_through_the_control_plane(tmp_path: Path) -> None:
    """The recovery part, three ways: a control plane (SQLite, filesystem broker, Celery worker
    with the reconciler) restarts the job whose run was SIGKILLed mid-epoch — adopting the
    job's warm standby, cold, and cold after the state cache was wiped (a lost node) — and in
    each the branch's output, once the job has read every epoch, equals a failure-free run's.
    The kill is proved inside an epoch by the engine's records, not by timing."""
    require_service("Java", shutil.which("java") is not None, "install OpenJDK 17")
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    env["PYTHONPATH"] = os.pathsep.join(x for x in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if x)
    work = tmp_path / "w"
    argv = [sys.executable, "-m", "bench.engine", "--quick", "--parts", "recovery"]
    proc = subprocess.run(
        [*argv, "--work-dir", str(work)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert proc.returncode == 0 and lines, f"exit {proc.returncode}:\n{proc.stderr[-4000:]}"
    report = json.loads(lines[-1])
    assert report["checksums_match"] is True, report["checksum_problems"]
    modes = ["warm", "cold", "node_lost"]
    assert report["recovery_modes"] == modes
    for mode in modes:
        figures = report["recovery"][mode]
        assert report["recovery_output_matches"][mode] is True, mode
        assert report["recovery_kill_mid_epoch"][mode] is True, mode
        # the restart's first commit is the epoch that had started and not committed
        assert figures["interrupted_epoch"] == figures["head_at_kill"] + 1
        breakdown = figures["breakdown_s"]
        assert figures["recovery_s"] == pytest.approx(sum(breakdown.values()), abs=0.1)
        assert 0 < breakdown["relaunch"] < 10  # the watch noticed the dead run within seconds
        assert report["recovery_ratio"][mode] == pytest.approx(
            figures["recovery_s"] / (figures["cold_start_s"] + 2 * figures["epoch_s"]), abs=0.01
        )
        assert figures["cold_start_s"] > 0
        runs_dir = work / f"recovery-{mode}" / "runs"
        runs = sorted(runs_dir.glob("*/spec.json"), key=lambda f: f.stat().st_mtime)
        assert len(runs) == 2  # the killed run and the one the reconciler's start launched
        worker_log = (work / f"recovery-{mode}" / "worker.log").read_text()
        assert "'restarts_requested': 1" in worker_log  # by the reconciler's watch
        for pid_file in [*runs_dir.glob("*/pid"), *runs_dir.glob(".standby/*/pid")]:
            pid = json.loads(pid_file.read_text())["pid"]  # nothing outlived the part
            assert not group_members(pid)
    warm, cold, lost = (report["recovery"][m] for m in modes)
    assert warm["standby"] is True and warm["standby_adopted"] is True
    assert warm["startup_s"]["restart"]["session_s"] < 5  # the standby's session
    runs_dir = work / "recovery-warm" / "runs"
    restarted = max(runs_dir.glob("*/spec.json"), key=lambda f: f.stat().st_mtime).parent
    # the restarted run is the standby's directory, renamed: it warmed up before it started
    assert '"event": "standby_ready"' in (restarted / "output.log").read_text()
    assert cold["standby_adopted"] is False and lost["standby_adopted"] is False
    # a process crash on a surviving host restores from the machine's state cache; after a
    # lost node every key group's state comes from the store
    restored = report["recovery_restore_bytes"]
    assert restored["node_lost"] > 0 and restored["node_lost"] > restored["cold"]
    assert lost["node_lost_wipe"]["state_cache_bytes"] > 0


def test_a_scale_child_runs_at_the_parallelism_of_its_cores_and_a_failed_one_counts(
    tmp_path: Path,
) -> None:
    """The scale part's local[1] child runs its engine at p = 1 (one task on its one slot,
    not two split tasks), and a child that fails or reports another parallelism or a
    mismatch is a problem of the whole run with the reason, not a missing rate."""
    require_service("Java", shutil.which("java") is not None, "install OpenJDK 17")
    argv = [
        sys.executable, "-m", "bench.engine", "--quick", "--parts", "vectorised",
        "--variants", "engine", "--master", "local[1]", "--parallelism", "1",
    ]  # fmt: skip
    child, failure = _child_report(argv, tmp_path / "one")
    assert failure is None and child is not None
    assert child["master"] == "local[1]"
    assert set(child["engine_epoch_detail"]["engine"]["parallelism"]) == {1}
    assert scale_child_failure(child, None, 1) is None
    assert "ran at parallelism [1], expected 2" in str(scale_child_failure(child, None, 2))
    mismatched = {**child, "checksums_match": False, "checksum_problems": ["epoch 2 differs"]}
    assert "epoch 2 differs" in str(scale_child_failure(mismatched, None, 1))
    broken, failure = _child_report([*argv[:6], "--keys", "0"], tmp_path / "broken")
    assert broken is None and failure is not None
    assert "the child exited 1" in failure and "--keys must be >= 1" in failure
    assert scale_child_failure(broken, failure, 1) == failure


@pytest.mark.slow
def test_bench_engine_spark_ui_part(tmp_path: Path) -> None:
    """The spark_ui part: children with the UI on and off (their reports say where it bound,
    or null), every rate listed, the ratio of the medians."""
    require_service("Java", shutil.which("java") is not None, "install OpenJDK 17")
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    env["PYTHONPATH"] = os.pathsep.join(x for x in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if x)
    argv = [sys.executable, "-m", "bench.engine", "--quick", "--parts", "spark_ui"]
    argv += ["--work-dir", str(tmp_path / "w")]
    proc = subprocess.run(argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900)
    report = json.loads([line for line in proc.stdout.splitlines() if line.strip()][-1])
    runs = report["spark_ui_runs"]
    assert len(runs["on"]) == len(runs["off"]) == 3 and all(runs["on"] + runs["off"]), runs
    assert report["spark_ui_cost_ratio"] == round(
        report["spark_ui_rps"]["off"] / report["spark_ui_rps"]["on"], 3
    )
    assert not [p for p in report["checksum_problems"] if "spark_ui" in p], report
