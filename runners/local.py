"""LocalLauncher: one run = one process group on this machine, Spark in `local[N]` mode.

Each run gets a directory `<runs_dir>/<run_id>/` holding `spec.json`, `pid` (pid and
start time of the run's supervisor), `output.log`, `exit.json` and `stop.json`. The
supervisor (`python -m runners.local supervise …`) leads a new session, runs the job as its
child and records the exit status, so any process — not only the one that started the
run — can tell how a run ended. Stopping signals the whole group, so no Spark JVM or Python
worker outlives its run. A job whose spec sets `resources.standby` also gets a warm standby
driver that a later start of the same spec adopts (`runners.local_standby`,
docs/launchers.md).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

from runners import config
from runners.config import RunnersConfig
from runners.job_spec import ENGINE_MODULE, JobSpec
from runners.launcher import (
    RUN_ID_ENV,
    LauncherError,
    RunHandle,
    RunNotFoundError,
    RunPhase,
    RunStatus,
    pyspark_submit_args,
    request_stop,
)
from runners.local_standby import (
    Standbys,
    adopted_exit,
    code_fingerprint,
    job_packages,
    standby_key,
)
from runners.processes import (
    group_members,
    process_alive,
    process_start_time,
    read_json,
    write_json,
)

log = logging.getLogger(__name__)

PROJECT_ROOT: Final = Path(__file__).resolve().parent.parent
_POLL_S: Final = 0.05


def _describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


#: the variables an S3 client reads its credentials from
CREDENTIAL_NAMES: Final = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


def with_store_credentials(prefix: str, env: Mapping[str, str]) -> dict[str, str]:
    """`env` with the job's `AWS_*` taken from the store's `<prefix>_AWS_*`. A name the prefix
    does not set is removed, so the job never runs with the launcher's own credentials or
    another store's (the control plane refuses to launch when the key id or secret is
    missing)."""
    out = {k: v for k, v in env.items() if k not in CREDENTIAL_NAMES}
    for name in CREDENTIAL_NAMES:
        if env.get(f"{prefix}_{name}"):
            out[name] = env[f"{prefix}_{name}"]
    return out


class LocalLauncher:
    """Runs jobs as local process groups; see the module docstring for the run directory."""

    name = "local"

    def __init__(
        self,
        *,
        runs_dir: Path,
        python: str = sys.executable,
        entry_module: str = ENGINE_MODULE,
        kill_grace_s: float = 5.0,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.runs_dir = Path(runs_dir).resolve()
        self.python = python
        self.entry_module = entry_module
        self.kill_grace_s = kill_grace_s
        self.env = dict(env or {})
        self._children: dict[str, subprocess.Popen[bytes]] = {}
        self.standbys = Standbys(self.runs_dir)

    @classmethod
    def from_config(cls, settings: RunnersConfig) -> LocalLauncher:
        """Runs under `$EPOCHAL_VAR_DIR/runs` (default `var/runs` in the project)."""
        var_dir = Path(settings.var_dir or PROJECT_ROOT / "var")
        return cls(runs_dir=var_dir / "runs")

    # -- paths and bookkeeping ------------------------------------------------------------

    def _run_dir(self, handle: RunHandle) -> Path:
        run_dir = Path(handle.location)
        if not (run_dir / "spec.json").exists():
            raise RunNotFoundError(
                f"run {handle.run_id} is unknown here: {run_dir} has no spec.json "
                f"(never started on this machine, or cleaned up)"
            )
        return run_dir

    def _pid(self, run_dir: Path) -> tuple[int, str | None] | None:
        data = read_json(run_dir / "pid")
        if data is None:
            return None
        return int(data["pid"]), data.get("start_time")

    def _alive(self, run_dir: Path, run_id: str) -> bool:
        child = self._children.get(run_id)
        if child is not None and child.poll() is not None:
            self._children.pop(run_id, None)
        pid = self._pid(run_dir)
        return pid is not None and process_alive(*pid)

    def _signal_group(self, run_dir: Path, signum: signal.Signals) -> None:
        pid = self._pid(run_dir)
        if pid is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid[0], signum)

    def _wait(self, run_dir: Path, run_id: str, timeout_s: float) -> bool:
        """Wait until the supervisor has exited; True when it has."""
        deadline = time.monotonic() + timeout_s
        while self._alive(run_dir, run_id):
            if time.monotonic() >= deadline:
                return False
            time.sleep(_POLL_S)
        return True

    # -- Launcher -------------------------------------------------------------------------

    def command(self, spec: JobSpec) -> list[str]:
        """The job's own command line (what the supervisor runs)."""
        return [self.python, "-m", self.entry_module, *spec.engine_arguments()]

    def environment(self, spec: JobSpec) -> dict[str, str]:
        """The job's environment: Spark in local[parallelism] mode, run id, project importable."""
        master = f"local[{spec.parallelism}]"
        env = {**config.environment(), **self.env}
        env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        env["SPARK_MASTER"] = master
        # the Spark UI (when on) binds a free port; the run's `started` event says which
        env["PYSPARK_SUBMIT_ARGS"] = pyspark_submit_args(
            master, {"spark.ui.port": "0", **spec.spark_conf}, spec.resources.driver_memory_mb
        )
        env[RUN_ID_ENV] = spec.run_id
        env["STORE_URL"] = spec.store_url
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH", "")) if p
        )
        env["PYTHONUNBUFFERED"] = "1"
        if spec.store_credentials_env:
            env = with_store_credentials(spec.store_credentials_env, env)
        return env

    def start(self, spec: JobSpec) -> RunHandle:
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        run_dir = self.runs_dir / spec.run_id
        handle = RunHandle.for_spec(spec, runner=self.name, location=str(run_dir))
        if run_dir.exists():
            return handle  # this spec was started before: same run
        if self._standby(spec):
            key = standby_key(spec, python=self.python, env=self.environment(spec))
            self.standbys.discard(spec.application, spec.branch, keep_key=key)
            code = code_fingerprint(job_packages(spec.job))
            try:
                adopted = self.standbys.adopt(key, code, spec, run_dir, spec.engine_arguments())
            except OSError:  # none ready (or another launcher took it): a cold start
                # a standby still warming up shadows the failed run, not this one: without
                # it a new one (shadowing this run) can start
                self.standbys.discard(spec.application, spec.branch)
            else:
                if adopted is not None:
                    self._children[spec.run_id] = adopted
                self._launch_standby(spec, run_dir)
                return handle
        try:
            run_dir.mkdir()
        except FileExistsError:
            return handle  # this spec was started before: same run
        write_json(run_dir / "spec.json", spec.to_dict())
        argv = [
            self.python,
            "-m",
            "runners.local",
            "supervise",
            str(run_dir),
            "--",
            *self.command(spec),
        ]
        with open(run_dir / "output.log", "ab") as output:
            child = subprocess.Popen(
                argv,
                cwd=PROJECT_ROOT,
                env=self.environment(spec),
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._children[spec.run_id] = child
        write_json(run_dir / "pid", {"pid": child.pid, "start_time": process_start_time(child.pid)})
        log.info("started run %s (pid %d) in %s", spec.run_id, child.pid, run_dir)
        if self._standby(spec):
            self._launch_standby(spec, run_dir)
        return handle

    def _standby(self, spec: JobSpec) -> bool:
        """Whether runs of `spec` get a warm standby (the engine's own entry point only)."""
        return spec.resources.standby and self.entry_module == ENGINE_MODULE

    def _launch_standby(self, spec: JobSpec, run_dir: Path) -> None:
        """A warm standby for the next run of `spec` (local_standby.py); best effort."""
        try:
            self.standbys.launch(
                spec, run_dir, python=self.python, env=self.environment(spec), cwd=PROJECT_ROOT
            )
        except OSError as exc:
            log.warning("run %s: no standby (%s)", spec.run_id, exc)

    def status(self, handle: RunHandle) -> RunStatus:
        run_dir = self._run_dir(handle)
        exit_info = read_json(run_dir / "exit.json")
        if exit_info is None and self._alive(run_dir, handle.run_id):
            return RunStatus(phase=RunPhase.RUNNING)
        if exit_info is None:
            exit_info = read_json(run_dir / "exit.json")  # written just before the exit
        stop = read_json(run_dir / "stop.json") or {}
        if exit_info is None:
            if self._pid(run_dir) is None:
                return RunStatus(phase=RunPhase.PENDING, reason="starting")
            forced = stop.get("forced")
            return RunStatus(
                phase=RunPhase.FAILED,
                reason=f"killed by {forced} after the stop deadline"
                if forced
                else "the run's process group ended without recording an exit status "
                "(killed from outside?)",
            )
        code = int(exit_info["returncode"])
        if code == 0:
            return RunStatus(phase=RunPhase.SUCCEEDED, exit_code=0)
        reason = str(exit_info.get("reason") or _describe_exit(code))
        if stop.get("forced"):
            reason += f" (sent {stop['forced']} after the stop deadline)"
        return RunStatus(phase=RunPhase.FAILED, reason=reason, exit_code=code)

    def stop(self, handle: RunHandle, deadline_s: float) -> RunStatus:
        run_dir = self._run_dir(handle)
        spec = read_json(run_dir / "spec.json")
        if spec is not None:  # a stopped job needs no standby (a restart launches a new one)
            self.standbys.discard(str(spec["application"]), str(spec["branch"]))
        if not self._alive(run_dir, handle.run_id):
            self._reap_group(run_dir)
            return self.status(handle)
        stop = {"requested_at": time.time(), "deadline_s": deadline_s}
        write_json(run_dir / "stop.json", stop)
        try:
            request_stop(handle, reason=f"stop with a {deadline_s:g} s deadline")
        except Exception as exc:  # the store may be down: fall through to signals
            log.warning("run %s: could not write the stop request (%s)", handle.run_id, exc)
        if not self._wait(run_dir, handle.run_id, deadline_s):
            for signum in (signal.SIGTERM, signal.SIGKILL):
                write_json(run_dir / "stop.json", {**stop, "forced": signum.name})
                log.warning(
                    "run %s: still running at the deadline, sending %s", handle.run_id, signum.name
                )
                self._signal_group(run_dir, signum)
                if self._wait(run_dir, handle.run_id, self.kill_grace_s):
                    break
            else:
                raise LauncherError(
                    f"run {handle.run_id} survived SIGKILL; check its process group"
                )
        self._reap_group(run_dir)
        return self.status(handle)

    def _reap_group(self, run_dir: Path) -> None:
        """Kill whatever the job left behind in its process group, and wait until it is gone."""
        pid = self._pid(run_dir)
        if pid is None:
            return
        deadline = time.monotonic() + self.kill_grace_s
        while group_members(pid[0]):
            self._signal_group(run_dir, signal.SIGKILL)
            if time.monotonic() > deadline:
                raise LauncherError(
                    f"process group {pid[0]} of run {run_dir.name} survived SIGKILL: "
                    f"{group_members(pid[0])}"
                )
            time.sleep(_POLL_S)

    def cleanup(self, handle: RunHandle) -> None:
        run_dir = Path(handle.location)
        if not run_dir.exists():
            return
        if self._pid(run_dir) is not None:
            self._signal_group(run_dir, signal.SIGKILL)
            self._wait(run_dir, handle.run_id, self.kill_grace_s)
            self._reap_group(run_dir)
        self._children.pop(handle.run_id, None)
        shutil.rmtree(run_dir, ignore_errors=True)

    def logs(self, handle: RunHandle, tail_lines: int = 100) -> str:
        run_dir = self._run_dir(handle)
        try:
            with open(run_dir / "output.log", "rb") as output:
                output.seek(0, os.SEEK_END)
                size = output.tell()
                output.seek(max(0, size - 256 * 1024))
                text = output.read().decode("utf-8", errors="replace")
        except FileNotFoundError:
            return ""
        lines = text.splitlines()
        return "\n".join(lines[-tail_lines:]) if tail_lines > 0 else ""


def _supervise(run_dir: Path, argv: Sequence[str]) -> int:
    """Run `argv` as a child in this process group and record how it ended in exit.json."""
    # The launcher signals the whole group; the job receives the signal itself, and the
    # supervisor stays to record the job's exit status.
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda *_: None)
    # The directory stays open: a standby's directory becomes a run's by a rename (standby.py)
    # and the exit status must land where the directory is by then.
    dir_fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        child = subprocess.Popen(list(argv))
    except OSError as exc:
        print(f"epochal: cannot start {argv[0]}: {exc}", file=sys.stderr, flush=True)
        write_json(Path("exit.json"), {"returncode": 127}, dir_fd=dir_fd)
        return 127
    while True:
        try:
            returncode = child.wait()
            break
        except InterruptedError:
            continue
    # a standby that took this run over and exited 0 without running it failed
    returncode, reason = adopted_exit(dir_fd, returncode)
    ended: dict[str, object] = {"returncode": returncode}
    if reason is not None:
        print(f"epochal: {reason}", file=sys.stderr, flush=True)
        ended["reason"] = reason
    write_json(Path("exit.json"), ended, dir_fd=dir_fd)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 4 or args[0] != "supervise" or args[2] != "--":
        print("usage: python -m runners.local supervise RUN_DIR -- COMMAND…", file=sys.stderr)
        return 2
    return _supervise(Path(args[1]), args[3:])


if __name__ == "__main__":
    sys.exit(main())
