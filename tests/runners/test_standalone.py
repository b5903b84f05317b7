"""The standalone launcher's settings: the master URL and the executors' interpreter and code
path are an admin's (environment), checked at start-up; an operator's spark_conf cannot move
them. Runs on a real cluster are in tests/cluster."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from runners.job_spec import JobSpec, Resources
from runners.launcher import Launcher, LauncherError
from runners.launchers import get_launcher
from runners.standalone import StandaloneLauncher


def _spec(**overrides: object) -> JobSpec:
    fields: dict[str, object] = {
        "application": "orders",
        "namespace": "orders",
        "branch": "main",
        "job": "clickstream",
        "store_url": "s3://bucket/p?endpoint_url=http://127.0.0.1:9000",
        "parallelism": 3,
        "run_id": "run-1",
        "resources": Resources(executor_cores=2, executor_memory_mb=1536),
    }
    fields.update(overrides)
    return JobSpec(**fields)  # type: ignore[arg-type]


def _conf(env: dict[str, str]) -> dict[str, str]:
    args = shlex.split(env["PYSPARK_SUBMIT_ARGS"])
    return dict(args[i + 1].split("=", 1) for i, a in enumerate(args) if a == "--conf")


def test_the_master_is_a_required_admin_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNNER", "standalone")
    monkeypatch.delenv("SPARK_STANDALONE_MASTER", raising=False)
    with pytest.raises(LauncherError, match="needs SPARK_STANDALONE_MASTER=spark://HOST:PORT"):
        get_launcher()
    monkeypatch.setenv("SPARK_STANDALONE_MASTER", "spark://127.0.0.1:7077/path")
    with pytest.raises(LauncherError, match="is not a standalone master URL"):
        get_launcher()
    monkeypatch.setenv("SPARK_STANDALONE_MASTER", "spark://m1:7077,m2:7077")
    launcher = get_launcher()
    assert isinstance(launcher, StandaloneLauncher) and isinstance(launcher, Launcher)
    assert launcher.name == "standalone" and launcher.master == "spark://m1:7077,m2:7077"


def test_the_job_runs_against_the_cluster_with_the_admin_s_python_and_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "key-id")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    launcher = StandaloneLauncher(
        master="spark://10.0.0.5:7077",
        executor_python="/opt/epochal/venv/bin/python",
        executor_pythonpath="/opt/epochal/app",
        runs_dir=tmp_path,
    )
    hostile = {"spark.pyspark.python": "/tmp/evil", "spark.executorEnv.PYTHONPATH": "/tmp"}
    env = launcher.environment(_spec(spark_conf={**hostile, "spark.sql.shuffle.partitions": "8"}))
    assert env["SPARK_MASTER"] == "spark://10.0.0.5:7077"
    assert shlex.split(env["PYSPARK_SUBMIT_ARGS"])[:2] == ["--master", "spark://10.0.0.5:7077"]
    conf = _conf(env)
    assert conf["spark.pyspark.python"] == "/opt/epochal/venv/bin/python"
    assert conf["spark.executorEnv.PYTHONPATH"] == "/opt/epochal/app"
    assert conf["spark.executor.cores"] == "2" and conf["spark.executor.memory"] == "1536m"
    assert conf["spark.sql.shuffle.partitions"] == "8"  # the operator's other settings stay
    # executors reach the store with the job's credentials
    assert conf["spark.executorEnv.AWS_ACCESS_KEY_ID"] == "key-id"
    assert conf["spark.executorEnv.AWS_SECRET_ACCESS_KEY"] == "secret"


def test_no_warm_standby_holds_cluster_executors(tmp_path: Path) -> None:
    launcher = StandaloneLauncher(master="spark://127.0.0.1:7077", runs_dir=tmp_path)
    assert not launcher._standby(_spec(resources=Resources(standby=True)))
