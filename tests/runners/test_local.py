"""LocalLauncher against real processes: a tiny job (tests.runners.sample_job) and the engine."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from runners.job_spec import Resources
from runners.launcher import STOP_KEY, RunHandle, RunNotFoundError, RunPhase, RunStatus
from runners.local import LocalLauncher, group_members
from runners.local_standby import Standbys, standby_key
from snapshots_store import Repository
from tests.store.conftest import AtomicMotoServer, _free_port


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
        "--conf spark.sql.shuffle.partitions=8 "
        "--conf spark.ui.port=0 pyspark-shell"  # the Spark UI (when on) binds a free port
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


@pytest.fixture
def s3_bucket_url(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """A bucket on a moto S3 server spoken to over HTTP, and credentials for it."""
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    port = _free_port()
    server = AtomicMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    keys = {"aws_access_key_id": "archive-key-id", "aws_secret_access_key": "archive-secret"}
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", **keys).create_bucket(
        Bucket="archive"
    )
    try:
        yield f"s3://archive/lineages?endpoint_url={endpoint}", keys
    finally:
        server.stop()


def test_a_store_s_credential_variables_reach_the_job_as_its_only_credentials(  # type: ignore[no-untyped-def]
    make_spec, s3_bucket_url, tmp_path, monkeypatch
) -> None:
    """The job's process gets the store's `<prefix>_AWS_*` as `AWS_*`, and nothing else: with
    no other credentials anywhere (no ~/.aws, no instance metadata) the job reads its control
    document from the S3 store each epoch and stops when asked; the launcher's own AWS_* never
    reach it, and without the store's variables the job has no credentials and fails."""
    url, keys = s3_bucket_url
    for name, value in keys.items():  # this process (the test's stop request) has its own
        monkeypatch.setenv(name.upper(), value)
    home = tmp_path / "home"
    home.mkdir()
    env = {
        "HOME": str(home),
        "AWS_CONFIG_FILE": str(home / "none"),
        "AWS_SHARED_CREDENTIALS_FILE": str(home / "none"),
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "the-launcher-s-own",  # must not reach the job
        "AWS_SECRET_ACCESS_KEY": "the-launcher-s-own-secret",
        "ARCHIVE_AWS_ACCESS_KEY_ID": keys["aws_access_key_id"],
        "ARCHIVE_AWS_SECRET_ACCESS_KEY": keys["aws_secret_access_key"],
    }
    launcher = LocalLauncher(
        runs_dir=tmp_path / "runs", entry_module="tests.runners.sample_job", env=env
    )
    spec = make_spec("until_stopped", store_url=url, store_credentials_env="ARCHIVE")
    job_env = launcher.environment(spec)
    assert job_env["AWS_ACCESS_KEY_ID"] == keys["aws_access_key_id"]
    assert "AWS_SESSION_TOKEN" not in job_env
    handle = launcher.start(spec)
    try:
        wait_for_log(launcher, handle, "epoch 2")  # each epoch read the control document
        status = launcher.stop(handle, deadline_s=20)
        output = launcher.logs(handle, tail_lines=200)
        assert status == RunStatus(phase=RunPhase.SUCCEEDED, exit_code=0), output
        assert "stopping at the boundary" in output
    finally:
        launcher.cleanup(handle)

    # Another prefix, which this environment does not set: no credentials at all.
    spec = make_spec("until_stopped", store_url=url, store_credentials_env="OTHER")
    assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} & set(launcher.environment(spec))
    handle = launcher.start(spec)
    try:
        status = wait_until_finished(launcher, handle, timeout_s=60)
        output = launcher.logs(handle, tail_lines=200)
        assert status.phase is RunPhase.FAILED, output
        assert "NoCredentialsError" in output or "credentials" in output.lower(), output
    finally:
        launcher.cleanup(handle)


def _set_control(store_url: str, **changes: object) -> None:
    repo = Repository.open(store_url, "orders")
    doc, version = repo.read_control("main")
    repo.write_control("main", {**doc, **changes}, version)


def _head_epoch(store_url: str) -> int:
    repo = Repository.open(store_url, "orders")
    head = repo.read_ref("heads/main")
    return 0 if head is None else repo.read_manifest(head.target).epoch


def _standby_dirs(runs_dir: Path) -> list[Path]:
    return sorted(d for d in (runs_dir / ".standby").glob("*") if (d / "standby.json").exists())


def _wait_for(what: str, condition, timeout_s: float = 150):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.spark
def test_a_warm_standby_takes_over_a_killed_run(make_spec, store_url, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """resources.standby: after the run's first commit a standby driver warms up; when the run
    is SIGKILLed, starting the same spec again adopts the standby (no new JVM), which resumes
    from the head, and gets a standby of its own; stopping the job kills the standbys."""
    runs_dir = tmp_path / "runs"
    launcher = LocalLauncher(runs_dir=runs_dir, kill_grace_s=2.0)
    standby = Resources(standby=True)
    first = make_spec(job="endless-job", parallelism=1, resources=standby)
    handle = launcher.start(first)
    second_handle = None
    try:
        wait_for_log(launcher, handle, '"event": "committed"', timeout_s=150)
        _set_control(store_url, paused=True)  # the epochs wait while the standby warms up
        ready = _wait_for(
            "a ready standby",
            lambda: [d for d in _standby_dirs(runs_dir) if (d / "ready.json").exists()],
        )
        assert len(ready) == 1
        standby_pid = json.loads((ready[0] / "pid").read_text())["pid"]
        run_pid = json.loads((Path(handle.location) / "pid").read_text())["pid"]
        at_kill = _head_epoch(store_url)
        os.killpg(run_pid, 9)  # the driver's whole group dies; the standby is another group
        _wait_for("the run's group to die", lambda: not group_alive(run_pid))
        assert launcher.status(handle).phase is RunPhase.FAILED
        assert group_alive(standby_pid)

        second = make_spec(job="endless-job", parallelism=1, resources=standby)
        second_handle = launcher.start(second)
        run_dir = Path(second_handle.location)
        assert json.loads((run_dir / "pid").read_text())["pid"] == standby_pid  # adopted
        assert not ready[0].exists()  # the standby's directory became the run's
        output = wait_for_log(launcher, second_handle, '"event": "started"', timeout_s=30)
        started = next(json.loads(x) for x in output.splitlines() if '"event": "started"' in x)
        assert started["standby"] is True and started["session_s"] < 5
        _set_control(store_url, paused=False)
        _wait_for("a commit by the adopted run", lambda: _head_epoch(store_url) > at_kill)
        assert launcher.status(second_handle).phase is RunPhase.RUNNING
        # the adopted run has a standby of its own (it warms up after the run's first commit)
        _wait_for("the next standby", lambda: _standby_dirs(runs_dir))
        next_standby = _standby_dirs(runs_dir)[0]
        next_pid = json.loads((next_standby / "pid").read_text())["pid"]

        status = launcher.stop(second_handle, deadline_s=60)
        # the exit status reached the run's directory, renamed since the supervisor started
        assert status.phase is RunPhase.SUCCEEDED, launcher.logs(second_handle, 200)
        assert not group_alive(standby_pid) and not group_alive(next_pid)
        assert _standby_dirs(runs_dir) == []
    finally:
        for h in (handle, second_handle):
            if h is not None:
                launcher.cleanup(h)
        for directory in (runs_dir / ".standby").glob("*"):
            with contextlib.suppress(OSError, ValueError, ProcessLookupError):
                os.killpg(json.loads((directory / "pid").read_text())["pid"], 9)


def test_a_standby_serves_only_the_same_spec(make_spec) -> None:  # type: ignore[no-untyped-def]
    def key(spec, python: str = "/usr/bin/python3", env: dict | None = None) -> str:  # type: ignore[no-untyped-def,type-arg]
        return standby_key(spec, python=python, env={"A": "1"} if env is None else env)

    spec = make_spec(job="endless-job", resources=Resources(standby=True))
    again = make_spec(job="endless-job", resources=Resources(standby=True))
    assert spec.run_id != again.run_id
    assert key(spec) == key(again)
    for other in (
        make_spec(job="endless-job", resources=Resources(standby=True), parallelism=3),
        make_spec(job="endless-job", resources=Resources(standby=True, driver_memory_mb=2048)),
        make_spec(
            job="endless-job", resources=Resources(standby=True), spark_conf={"spark.a": "b"}
        ),
    ):
        assert key(other) != key(spec)


def _key(spec) -> str:  # type: ignore[no-untyped-def]
    return standby_key(spec, python="python", env={})


def _fake_standby(root: Path, spec, *, alive: bool = True) -> tuple[Path, int]:  # type: ignore[no-untyped-def]
    """A standby directory as Standbys.launch leaves it, its process a `sleep` group."""
    import subprocess

    from runners.processes import process_start_time, write_json

    key = _key(spec)
    directory = root / ".standby" / f"{key}-{os.urandom(4).hex()}"
    directory.mkdir(parents=True)
    child = subprocess.Popen(["sleep", "60" if alive else "0"], start_new_session=True)
    if not alive:
        child.wait()
    write_json(directory / "pid", {"pid": child.pid, "start_time": process_start_time(child.pid)})
    info = {"key": key, "application": spec.application, "branch": spec.branch}
    write_json(directory / "standby.json", info)
    return directory, child.pid


def test_discard_kills_the_job_s_standbys_for_other_specs_and_prunes_dead_ones(  # type: ignore[no-untyped-def]
    make_spec, tmp_path
) -> None:
    runs = tmp_path / "runs"
    standbys = Standbys(runs)
    at_p2 = make_spec(job="endless-job", resources=Resources(standby=True))
    at_p3 = make_spec(job="endless-job", resources=Resources(standby=True), parallelism=3)
    other_job = make_spec(job="endless-job", branch="other", resources=Resources(standby=True))
    kept, kept_pid = _fake_standby(runs, at_p2)
    stale, stale_pid = _fake_standby(runs, at_p3)
    foreign, foreign_pid = _fake_standby(runs, other_job)
    dead, _ = _fake_standby(runs, other_job, alive=False)
    try:
        assert standbys.ready(_key(at_p2), "c0de") is None  # alive, not warm (no ready.json)
        (kept / "ready.json").write_text('{"code": "c0de"}')
        assert standbys.ready(_key(at_p2), "c0de") == kept
        assert standbys.ready(_key(at_p3), "c0de") is None
        # warm, but for code that has changed on disk since it started
        assert standbys.ready(_key(at_p2), "c0de-after-a-deploy") is None
        assert standbys.discard(at_p2.application, "main", keep_key=_key(at_p2)) == 1
        assert kept.exists() and not group_alive(stale_pid) and not stale.exists()
        assert foreign.exists() and group_alive(foreign_pid)  # another job's standby stays
        assert not dead.exists()  # a dead standby of any job is pruned
        assert standbys.discard(at_p2.application, "main") == 1  # stop: none kept
        assert not kept.exists() and not group_alive(kept_pid)
    finally:
        for pid in (kept_pid, stale_pid, foreign_pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, 9)
