"""LocalLauncher against real processes: a tiny job (tests.runners.sample_job) and the engine."""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

import pytest

from runners.launcher import STOP_KEY, RunHandle, RunNotFoundError, RunPhase, RunStatus
from runners.local import LocalLauncher, group_members
from snapshots_store import Repository


@pytest.fixture
def launcher(tmp_path: Path):  # type: ignore[no-untyped-def]
    launcher = LocalLauncher(
        runs_dir=tmp_path / "runs", entry_module="tests.runners.sample_job", kill_grace_s=2.0
    )
    yield launcher
    for run_dir in (tmp_path / "runs").glob("*"):  # never leave a process behind
        pid = json.loads((run_dir / "pid").read_text())["pid"] if (run_dir / "pid").exists() else 0
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, 9)


def wait_until_finished(
    launcher: LocalLauncher, handle: RunHandle, timeout_s: float = 30
) -> RunStatus:
    deadline = time.monotonic() + timeout_s
    while True:
        status = launcher.status(handle)
        if status.finished or time.monotonic() > deadline:
            return status
        time.sleep(0.05)


def wait_for_log(
    launcher: LocalLauncher, handle: RunHandle, text: str, timeout_s: float = 30
) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        output = launcher.logs(handle, tail_lines=1000)
        if text in output:
            return output
        time.sleep(0.05)
    raise AssertionError(f"{text!r} never appeared in the run's output:\n{output}")


def start_line(output: str) -> dict:  # type: ignore[type-arg]
    line = next(line for line in output.splitlines() if line.startswith("sample-job-start "))
    return json.loads(line.removeprefix("sample-job-start "))


def group_alive(pgid: int) -> bool:
    return bool(group_members(pgid))


def test_job_runs_to_completion_in_local_mode_and_reports_succeeded(launcher, make_spec) -> None:  # type: ignore[no-untyped-def]
    spec = make_spec("epochs", max_epochs=3, spark_conf={"spark.sql.shuffle.partitions": "8"})
    handle = launcher.start(spec)
    assert wait_until_finished(launcher, handle) == RunStatus(phase=RunPhase.SUCCEEDED, exit_code=0)
    output = launcher.logs(handle)
    started = start_line(output)
    assert started["run_id"] == spec.run_id
    assert started["spark_master"] == "local[2]"
    assert started["pyspark_submit_args"] == (
        "--master 'local[2]' --driver-memory 1024m "
        "--conf spark.sql.shuffle.partitions=8 pyspark-shell"
    )
    assert started["pgid"] != os.getpgid(0)  # its own process group
    assert launcher.logs(handle, tail_lines=1) == "epoch 3"


def test_crashing_job_is_failed_with_its_exit_code(launcher, make_spec) -> None:  # type: ignore[no-untyped-def]
    handle = launcher.start(make_spec("crash"))
    status = wait_until_finished(launcher, handle)
    assert status == RunStatus(phase=RunPhase.FAILED, reason="exit code 3", exit_code=3)
    assert "failing on purpose" in launcher.logs(handle)


def test_stop_reaches_the_job_through_the_control_document(launcher, make_spec, store_url) -> None:  # type: ignore[no-untyped-def]
    spec = make_spec("until_stopped")
    repo = Repository.open(store_url, "orders")
    repo.write_control("main", {"parallelism": 2}, None)
    handle = launcher.start(spec)
    wait_for_log(launcher, handle, "epoch 2")
    assert launcher.status(handle).phase is RunPhase.RUNNING
    started = time.monotonic()
    status = launcher.stop(handle, deadline_s=20)
    assert status == RunStatus(phase=RunPhase.SUCCEEDED, exit_code=0)
    assert time.monotonic() - started < 10  # graceful: long before the deadline
    assert "stopping at the boundary" in launcher.logs(handle)
    doc, _ = repo.read_control("main")
    assert doc["parallelism"] == 2  # other control keys are kept
    assert doc[STOP_KEY]["run_id"] == spec.run_id


def test_stop_escalates_to_sigterm_then_sigkill_and_leaves_no_process(launcher, make_spec) -> None:  # type: ignore[no-untyped-def]
    handle = launcher.start(make_spec("with_grandchild"))
    output = wait_for_log(launcher, handle, "grandchild ")
    pgid = start_line(output)["pgid"]
    grandchild = int(output.split("grandchild ")[1].split()[0])
    status = launcher.stop(handle, deadline_s=0.5)
    assert status.phase is RunPhase.FAILED
    assert status.reason == "killed by SIGKILL after the stop deadline"
    assert not group_alive(pgid)
    assert grandchild not in group_members(pgid)


def test_starting_the_same_spec_twice_is_one_run(launcher, make_spec) -> None:  # type: ignore[no-untyped-def]
    spec = make_spec("until_stopped")
    first = launcher.start(spec)
    assert launcher.start(spec) == first
    wait_for_log(launcher, first, "epoch 1")
    assert launcher.stop(first, deadline_s=20).phase is RunPhase.SUCCEEDED
    assert launcher.logs(first).count("sample-job-start") == 1


def test_another_launcher_process_sees_how_the_run_ended(launcher, make_spec, tmp_path) -> None:  # type: ignore[no-untyped-def]
    handle = launcher.start(make_spec("crash"))
    wait_until_finished(launcher, handle)
    other = LocalLauncher(runs_dir=tmp_path / "runs")
    restored = RunHandle.from_dict(json.loads(json.dumps(handle.to_dict())))
    assert other.status(restored).exit_code == 3
    assert other.stop(restored, deadline_s=1).phase is RunPhase.FAILED  # stopping an ended run


def test_cleanup_removes_the_run_and_is_idempotent(launcher, make_spec) -> None:  # type: ignore[no-untyped-def]
    handle = launcher.start(make_spec("stubborn"))
    output = wait_for_log(launcher, handle, "sample-job-start")
    pgid = start_line(output)["pgid"]
    launcher.cleanup(handle)
    launcher.cleanup(handle)
    assert not Path(handle.location).exists()
    assert not group_alive(pgid)
    with pytest.raises(RunNotFoundError, match="never started"):
        launcher.status(handle)


@pytest.mark.spark
def test_engine_entry_point_runs_under_the_local_launcher(make_spec, store_url, tmp_path) -> None:  # type: ignore[no-untyped-def]
    launcher = LocalLauncher(runs_dir=tmp_path / "runs")  # the real entry point
    spec = make_spec(job="engine-job", max_epochs=2, parallelism=1)
    handle = launcher.start(spec)
    try:
        status = wait_until_finished(launcher, handle, timeout_s=150)
        output = launcher.logs(handle, tail_lines=200)
        assert status.phase is RunPhase.SUCCEEDED, output
        assert output.count('"event": "committed"') == 2, output
        head = Repository.open(store_url, "orders").read_ref("heads/main")
        assert head is not None
    finally:
        launcher.cleanup(handle)
