"""The README's first command: `manage.py demo` brings the control plane up (worker with the
reconciler, the example job started by a start operation through the local launcher), follows
the job's commits and indexes its lineage; --no-serve stops the job and the worker at the end."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _demo(var_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "EPOCHAL_VAR_DIR": str(var_dir),
        "DATABASE_URL": f"sqlite:///{var_dir / 'demo.sqlite3'}",
        "STORE_URL": f"file://{var_dir / 'store'}",
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    for command in (["migrate", "--no-input", "-v", "0"], ["demo", "--no-serve", *args]):
        done = subprocess.run(
            [sys.executable, "manage.py", *command],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=400,
        )
        assert done.returncode == 0, done.stdout + done.stderr
    return done


@pytest.mark.spark
def test_demo_commits_epochs_indexes_them_and_resumes_from_the_head(tmp_path: Path) -> None:
    first = _demo(tmp_path, "--input-batches", "2", "--records", "500")
    assert "start succeeded" in first.stdout, first.stdout
    # the running job's Spark UI, through the control plane (test_demo_signals opens it)
    assert "spark ui: http://127.0.0.1:8000/jobs/clickstream-main/spark-ui/" in first.stdout
    assert "the job has consumed all 1000 input records" in first.stdout
    assert "(2 indexed)" in first.stdout
    assert "workers stopped" in first.stdout

    second = _demo(tmp_path, "--input-batches", "1", "--records", "500")
    assert "epoch    3" in second.stdout  # resumed from the head, not from scratch
    assert "(3 indexed)" in second.stdout
    # the job's registered Delta sink holds every epoch of the branch once
    from snapshots_store import Repository
    from tests.engine.destination_checks import chain_output, delta_rows

    assert "output: Delta table" in first.stdout and "deltalake.DeltaTable(" in first.stdout
    repo = Repository.open(f"file://{tmp_path / 'store'}", "clickstream")
    lake = delta_rows(str(tmp_path / "demo" / "clickstream-lake"))
    assert not lake.empty  # the sessions the first epochs closed (an epoch may close none)
    assert lake.equals(chain_output(repo))
    assert not list((tmp_path / "runs").glob("*/pid")) or _no_live_runs(tmp_path)


def _no_live_runs(var_dir: Path) -> bool:
    """Every run the demo started has ended (its process group is gone)."""
    import json

    from runners.local import group_members

    return all(
        not group_members(json.loads(p.read_text())["pid"])
        for p in (var_dir / "runs").glob("*/pid")
    )


def test_demo_refuses_nonsense_counts(tmp_path: Path) -> None:
    env = {**os.environ, "EPOCHAL_VAR_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "manage.py", "demo", "--no-serve", "--input-batches", "0"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "must be positive" in done.stderr


@pytest.mark.slow  # a second full demo (worker, job process) costs over a minute of CI
@pytest.mark.spark
@pytest.mark.services
def test_demo_runs_the_job_from_a_rabbitmq_stream(
    tmp_path: Path, rabbitmq_stream_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import uuid

    from runners.engine.rabbitmq_stream import delete_stream

    stream = f"epochal-demo-test-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("RABBITMQ_STREAM_URL", rabbitmq_stream_url)
    try:
        done = _demo(tmp_path, "--input-batches", "2", "--records", "400", "--source",
                     "rabbitmq-stream", "--stream", stream)  # fmt: skip
    finally:
        delete_stream(rabbitmq_stream_url, stream)
    assert f"input:  RabbitMQ stream {stream}" in done.stdout, done.stdout
    assert "the job has consumed all 800 input records" in done.stdout, done.stdout
    assert "workers stopped" in done.stdout


@pytest.mark.slow  # a second full demo (worker, job process) costs over a minute of CI
@pytest.mark.spark
@pytest.mark.services
def test_demo_runs_the_job_from_a_kafka_topic(
    tmp_path: Path, kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import uuid

    from runners.engine.kafka_client import delete_topics

    topic = f"epochal-demo-test-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", kafka_bootstrap)
    try:
        done = _demo(tmp_path, "--input-batches", "2", "--records", "400", "--source",
                     "kafka", "--topic", topic)  # fmt: skip
    finally:
        delete_topics(kafka_bootstrap, [topic])
    assert f"input:  Kafka topic {topic} at {kafka_bootstrap}" in done.stdout, done.stdout
    assert "the job has consumed all 800 input records" in done.stdout, done.stdout
    assert "workers stopped" in done.stdout


def test_demo_on_kafka_says_how_to_start_a_broker(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "EPOCHAL_VAR_DIR": str(tmp_path),
           "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{port}"}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "manage.py", "demo", "--no-serve", "--source", "kafka"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode != 0
    assert f"no Kafka broker answers at 127.0.0.1:{port}" in done.stderr
    assert "bin/services up" in done.stderr
