"""Stopping a job: stop requests in the control document, --follow, SIGTERM to the entry point."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from runners.engine import EpochRunner, read_output
from runners.engine.sources import Generator, write_parquet_file
from runners.job_spec import JobSpec
from snapshots_store import Repository, check_repository
from tests.conftest import SUBPROCESS_PYTHONPATH
from tests.engine.jobs import DATA_ENV, SLOW_ENV, aggregate_job, reference_output, write_epochs

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]


def _until(condition: Callable[[], bool], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.05)


def _head_epoch(repo: Repository, branch: str = "main") -> int:
    head = repo.read_ref(f"heads/{branch}")
    return 0 if head is None else repo.read_manifest(head.target).epoch


def _frame(table: Any) -> pd.DataFrame:
    return table.to_pandas().sort_values(["_epoch", "key"]).reset_index(drop=True)


def test_stop_request_for_this_run_stops_at_the_epoch_boundary(
    spark: Any, epochs_dir: str, repo: Repository, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = EpochRunner(spark, aggregate_job(epochs_dir), repo=repo, run_id="run-a")
    assert runner.run_epoch() is not None
    version = repo.write_control("main", {"stop": {"run_id": "run-b"}}, None)
    assert runner.run_epoch() is not None  # another run's stop request is not ours
    version = repo.write_control("main", {"stop": {"run_id": "run-a"}, "paused": True}, version)
    assert runner.run_epoch() is None
    assert runner.stopped_reason == "stop requested"  # a stop beats a pause
    assert runner.run() == [] and _head_epoch(repo) == 2
    # without a run id (no $EPOCHAL_RUN_ID) stop requests are not for this process
    monkeypatch.delenv("EPOCHAL_RUN_ID", raising=False)
    repo.write_control("main", {"stop": {"run_id": "run-a"}}, version)
    anonymous = EpochRunner(spark, aggregate_job(epochs_dir), repo=repo)
    assert anonymous.run_id is None and anonymous.run_epoch() is not None


def test_follow_waits_for_new_data_until_interrupted(
    spark: Any, repo: Repository, tmp_path: Path
) -> None:
    directory = str(tmp_path / "in")
    gen = Generator(keys=50, records_per_epoch=300, seed=1)
    write_parquet_file(directory, "part-00000", gen.block(0))
    runner = EpochRunner(
        spark, aggregate_job(directory), repo=repo, poll_interval_s=0.05, run_id="r1"
    )
    results: list[Any] = []
    thread = threading.Thread(target=lambda: results.extend(runner.run(follow=True)))
    thread.start()
    try:
        _until(lambda: _head_epoch(repo) == 1 and runner.stopped_reason == "no new data")
        assert thread.is_alive()  # following: no new data is not the end
        write_parquet_file(directory, "part-00001", gen.block(1))
        _until(lambda: _head_epoch(repo) == 2)
        repo.write_control("main", {"paused": True}, None)  # paused: polls the control doc
        _until(lambda: runner.stopped_reason == "paused")
        write_parquet_file(directory, "part-00002", gen.block(2))
        time.sleep(0.3)
        assert _head_epoch(repo) == 2 and thread.is_alive()
        runner.interrupt("test is over")
        thread.join(timeout=60)
        assert not thread.is_alive()
    finally:
        runner.interrupt("test is over")
        thread.join(timeout=60)
    assert [r.epoch for r in results] == [1, 2]
    assert runner.stopped_reason == "test is over"


def test_job_spec_follow_reaches_the_engine_command_line() -> None:
    spec = JobSpec(
        application="a",
        namespace="orders",
        branch="main",
        store_url="file:///tmp/store",
        job="crash-job",
        parallelism=2,
        follow=True,
    )
    assert spec.engine_arguments()[-1] == "--follow"
    assert JobSpec.from_dict(spec.to_dict()) == spec
    plain = JobSpec.from_dict({**spec.to_dict(), "follow": False})
    assert "--follow" not in plain.engine_arguments()


class _Job:
    """The job entry point as a subprocess (its own process group, like the launchers)."""

    def __init__(self, store: str, data: str, *extra: str, env: dict[str, str]) -> None:
        full_env = {
            **os.environ,
            DATA_ENV: data,
            "PYTHONPATH": SUBPROCESS_PYTHONPATH,
            "SPARK_LOCAL_IP": "127.0.0.1",
            **env,
        }
        full_env.pop("EPOCHAL_CRASH_AT", None)
        cmd = [
            sys.executable, "-m", "runners.engine.main", "--store", store, "--namespace", "app",
            "--parallelism", "2", "--master", "local[2]", *extra,
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True, start_new_session=True,
        )  # fmt: skip
        self.events: list[dict[str, Any]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with contextlib.suppress(ValueError):
                self.events.append(json.loads(line))

    def wait_for(self, event: str, n: int = 1, timeout: float = 240) -> None:
        _until(lambda: sum(e.get("event") == event for e in self.events) >= n, timeout)

    def signal_group(self, signum: int) -> None:
        os.killpg(self.proc.pid, signum)

    def finish(self, timeout: float = 120) -> int:
        try:
            code = self.proc.wait(timeout=timeout)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self._reader.join(timeout=10)
        return code

    @property
    def committed(self) -> list[int]:
        return [int(e["epoch"]) for e in self.events if e.get("event") == "committed"]


def test_sigterm_abandons_the_running_epoch_and_follow_resumes_then_stops_on_request(
    tmp_path: Path,
) -> None:
    data = str(tmp_path / "in")
    write_epochs(data, files=3, keys=200, records=1000)
    store = f"file://{tmp_path}/store"
    repo = Repository.open(store, "app")
    # 1) a slow job (each split read takes 2 s): SIGTERM to its group while epoch 2 runs
    slow = _Job(store, data, "--job", "slow-job", env={SLOW_ENV: "2"})
    slow.wait_for("committed")
    slow.wait_for("epoch_start", 2)
    time.sleep(1.0)
    slow.signal_group(signal.SIGTERM)
    assert slow.finish() == 0
    assert slow.events[-1]["event"] == "stopped"
    assert slow.events[-1]["reason"] == "SIGTERM: epoch 2 abandoned before its commit"
    assert _head_epoch(repo) == len(slow.committed) == 1  # nothing committed after the signal
    assert check_repository(repo).ok
    # 2) restart following the directory; it catches up, waits, takes a new file, and stops
    #    on a stop request for its run id
    follow = _Job(
        store, data, "--job", "crash-job", "--follow", "--poll-interval",
        "0.2", env={"EPOCHAL_RUN_ID": "run-2"},
    )  # fmt: skip
    _until(lambda: _head_epoch(repo) == 3, timeout=240)
    time.sleep(1.0)
    assert follow.proc.poll() is None  # no new data: still running
    write_epochs(data + "-more", files=4, keys=200, records=1000)
    os.replace(f"{data}-more/part-00003.parquet", f"{data}/part-00003.parquet")
    _until(lambda: _head_epoch(repo) == 4)
    _, version = repo.read_control("main")
    repo.write_control("main", {"stop": {"run_id": "run-2"}}, version)
    assert follow.finish() == 0
    assert follow.events[-1] == {"event": "stopped", "reason": "stop requested"}
    assert sum(e["event"] == "epoch_start" for e in follow.events) == len(follow.committed) + 1
    pd.testing.assert_frame_equal(
        _frame(read_output(repo, "main"))[["_epoch", "key", "count", "sum_value"]],
        reference_output(data)[["_epoch", "key", "count", "sum_value"]],
        check_dtype=False,
    )
