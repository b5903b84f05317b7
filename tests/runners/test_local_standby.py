"""The warm standby's takeover handshake, its key (code fingerprint, frozen settings) and the
discard of a failed run's standby, against real processes (runners/local_standby.py)."""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from runners.job_spec import JobSpec, Resources
from runners.launcher import RunHandle, RunPhase
from runners.local import PROJECT_ROOT, LocalLauncher, group_members
from runners.local_standby import (
    ACK,
    ADOPTED_WITHOUT_RUN,
    ENGINE_EXIT,
    Standbys,
    code_fingerprint,
    job_packages,
    standby_key,
)
from runners.processes import read_json

STANDBY = Resources(standby=True)


def _wait_for(what: str, condition, timeout_s: float = 150):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _standby_dirs(runs_dir: Path) -> list[Path]:
    return sorted(d for d in (runs_dir / ".standby").glob("*") if (d / "standby.json").exists())


def _kill_groups(*directories: Path) -> None:
    for directory in directories:
        pid = read_json(directory / "pid")
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(pid["pid"]), signal.SIGKILL)


def test_the_key_holds_the_settings_a_standby_froze_and_its_python(make_spec, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A standby's environment is frozen when it starts: a run whose environment differs (a
    new setting after a deploy, another interpreter) must not take it over. The run id is
    the one thing that differs between the run it shadows and the run it takes over."""
    runs = tmp_path / "runs"
    launcher = LocalLauncher(runs_dir=runs)
    spec, again = (make_spec(job="endless-job", resources=STANDBY) for _ in range(2))
    env, env_again = launcher.environment(spec), launcher.environment(again)
    assert env["EPOCHAL_RUN_ID"] != env_again["EPOCHAL_RUN_ID"]
    key = standby_key(spec, python=sys.executable, env=env)
    assert standby_key(again, python=sys.executable, env=env_again) == key
    changed = LocalLauncher(runs_dir=runs, env={"EPOCHAL_RESTORE_READ_AHEAD_MB": "64"})
    assert standby_key(spec, python=sys.executable, env=changed.environment(spec)) != key
    assert standby_key(spec, python="/opt/other/python3", env=env) != key


@pytest.fixture
def job_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An installed package (a dist-info with an ``epochal.jobs`` entry point) on sys.path."""
    site = tmp_path / "site"
    package = site / "fingerprinted_jobs"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "job.py").write_text("VERSION = 1\n")
    dist = site / "fingerprinted_jobs-1.0.dist-info"
    dist.mkdir()
    metadata = "Metadata-Version: 2.1\nName: fingerprinted-jobs\nVersion: 1.0\n"
    (dist / "METADATA").write_text(metadata)
    (dist / "entry_points.txt").write_text(
        "[epochal.jobs]\nfingerprinted-job = fingerprinted_jobs.job:job\n"
    )
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    yield package


def test_the_code_fingerprint_follows_the_job_package_and_the_engine(job_package: Path) -> None:  # type: ignore[no-untyped-def]
    """The fingerprint a ready standby reports must equal the one of the code on disk now:
    a deploy (a changed file of the job's package, or of the engine's) makes it stale."""
    packages = job_packages("fingerprinted-job")
    assert packages == ["fingerprinted_jobs", "runners", "snapshots_store"]
    before = code_fingerprint(packages)
    assert code_fingerprint(packages) == before
    assert code_fingerprint(["runners", "snapshots_store"]) != before
    (job_package / "job.py").write_text("VERSION = 2\n")
    after = code_fingerprint(packages)
    assert after != before
    (job_package / "helpers.py").write_text("X = 1\n")  # a new module counts too
    assert code_fingerprint(packages) != after


def test_a_failed_run_s_standby_is_discarded_for_the_next_run_s(make_spec, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A run that fails before its standby is warm: the restart finds no ready standby, starts
    cold, kills the one still warming up for the failed run and launches one shadowing the new
    run (without the discard the old one blocked a new one for its 900 s orphan timeout)."""
    runs = tmp_path / "runs"
    launcher = LocalLauncher(runs_dir=runs, kill_grace_s=2.0)
    first = make_spec(job="broken-job", parallelism=1, resources=STANDBY)  # fails on load
    handles: list[RunHandle] = []
    try:
        handles.append(launcher.start(first))
        old = _wait_for("the first run's standby", lambda: _standby_dirs(runs), 30)[0]
        old_pid = int(json.loads((old / "pid").read_text())["pid"])
        assert json.loads((old / "standby.json").read_text())["primary"] == handles[0].location
        _wait_for("the first run to fail", lambda: launcher.status(handles[0]).finished, 60)
        assert launcher.status(handles[0]).phase is RunPhase.FAILED
        assert not (old / "ready.json").exists()  # not warm yet: nothing to adopt
        second = make_spec(job="broken-job", parallelism=1, resources=STANDBY)
        handles.append(launcher.start(second))
        assert json.loads((Path(handles[1].location) / "pid").read_text())["pid"] != old_pid
        assert not old.exists() and not group_members(old_pid)
        (new,) = _standby_dirs(runs)
        assert json.loads((new / "standby.json").read_text())["primary"] == handles[1].location
    finally:
        _kill_groups(*_standby_dirs(runs))
        for handle in handles:
            launcher.cleanup(handle)


def test_the_supervisor_fails_an_adopted_standby_that_exits_0_without_running(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A process that acknowledged a run (``ack.json``) and exits 0 before the engine ran for
    it (no ``engine.json``) is recorded as failed with the reason; after the engine ran, its
    exit status stands."""
    write = "import json, sys; open(sys.argv[1], 'w').write(json.dumps({'run_id': 'r1'}))"
    for files, expected in (([ACK], ADOPTED_WITHOUT_RUN), ([ACK, ENGINE_EXIT], 0), ([], 0)):
        run_dir = tmp_path / f"run-{len(files)}"
        run_dir.mkdir()
        child = [f'{sys.executable} -c "{write}" {run_dir / name};' for name in files]
        subprocess.run(
            [sys.executable, "-m", "runners.local", "supervise", str(run_dir), "--",
             "sh", "-c", " ".join(child) + " exit 0"],
            cwd=PROJECT_ROOT, check=True, timeout=60,
        )  # fmt: skip
        ended = json.loads((run_dir / "exit.json").read_text())
        assert ended["returncode"] == expected, ended
        if expected:
            assert "acknowledged run r1 and exited without running it" in ended["reason"]


def _primary(tmp_path: Path, make_spec) -> Path:  # type: ignore[no-untyped-def]
    """A failed run for a standby to shadow (it warms up at once)."""
    launcher = LocalLauncher(runs_dir=tmp_path / "primary", entry_module="tests.runners.sample_job")
    handle = launcher.start(make_spec("crash"))
    _wait_for("the primary to fail", lambda: launcher.status(handle).finished, 60)
    return Path(handle.location)


def _ready(standbys: Standbys, spec: JobSpec, primary: Path, env: dict[str, str]) -> Path:
    directory = standbys.launch(spec, primary, python=sys.executable, env=env, cwd=PROJECT_ROOT)
    assert directory is not None
    _wait_for("a ready standby", lambda: (directory / "ready.json").exists(), 240)
    return directory


@pytest.mark.spark
def test_adoption_is_a_handshake_a_hung_standby_is_never_adopted(make_spec, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Two real standbys. The first acknowledges a run and is renamed into the run's directory,
    but ``go.json`` never comes (the launcher died in between): it exits 75 and the run is
    FAILED, not SUCCEEDED. The second is alive but cannot answer (its driver is stopped, like
    one stuck on its way out): the launcher gets no ack, kills it and adopts nothing."""
    runs = tmp_path / "runs"
    launcher = LocalLauncher(runs_dir=runs, kill_grace_s=2.0)
    standbys = Standbys(runs, handshake_timeout_s=2.0, go_timeout_s=2.0)
    spec = make_spec(job="endless-job", parallelism=1, resources=STANDBY)
    env = launcher.environment(spec)
    key = standby_key(spec, python=sys.executable, env=env)
    code = code_fingerprint(job_packages(spec.job))
    primary = _primary(tmp_path, make_spec)
    directories: list[Path] = []
    try:
        directories.append(_ready(standbys, spec, primary, env))
        taken = make_spec(job="endless-job", parallelism=1, resources=STANDBY)
        assert standbys.ready(key, code) == directories[0]
        assert standbys._handshake(directories[0], taken.run_id)
        acked = json.loads((directories[0] / ACK).read_text())
        assert acked["run_id"] == taken.run_id
        assert acked["pid"] == json.loads((directories[0] / "ready.json").read_text())["pid"]
        run_dir = runs / taken.run_id
        os.rename(directories[0], run_dir)  # the adoption stops here: no spec.json, no go.json
        directories[0] = run_dir
        (run_dir / "spec.json").write_text(json.dumps(taken.to_dict()))
        handle = RunHandle.for_spec(taken, runner="local", location=str(run_dir))
        _wait_for("the run to end", lambda: launcher.status(handle).finished, 60)
        status = launcher.status(handle)
        assert status.phase is RunPhase.FAILED and status.exit_code == 75, status

        directories.append(_ready(standbys, spec, primary, env))
        driver = int(json.loads((directories[1] / "ready.json").read_text())["pid"])
        supervisor = int(json.loads((directories[1] / "pid").read_text())["pid"])
        os.kill(driver, signal.SIGSTOP)
        assert standbys.ready(key, code) == directories[1]  # alive, warm: today's test passed
        hung = make_spec(job="endless-job", parallelism=1, resources=STANDBY)
        with pytest.raises(FileNotFoundError, match="did not take run"):
            standbys.adopt(key, code, hung, runs / hung.run_id, hung.engine_arguments())
        assert not (runs / hung.run_id).exists()
        assert not directories[1].exists() and not group_members(supervisor)
    finally:
        _kill_groups(*directories)
