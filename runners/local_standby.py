"""Warm standby drivers for the local launcher (`resources.standby`).

A standby is a process group like a run's — the supervisor, a driver with its SparkSession
up and its Python workers forked with the engine imported (`runners.engine.standby`) — kept
in ``<runs_dir>/.standby/<key>-<nonce>/`` for one job spec (every field but the run id: the
same job, arguments, store, parallelism, Spark conf and driver memory). It starts once the run
it shadows has committed its first epoch (so it never slows that run's start) and then waits.
When the control plane starts a run of the same spec — the reconciler restarting a failed
run — the launcher *adopts* the standby: it renames the standby's directory to the run's (the
open log, the supervisor and its exit status follow the directory), writes ``spec.json`` and
hands the driver its arguments in ``go.json``; the driver starts epochs at once. Recovery then
skips the interpreter, the JVM, the SparkSession and the Python workers' start. The idea is the
warm passive standby of the high-availability literature (Silvestre et al., "Clonos:
Consistent Causal Recovery for Highly-Available Streaming Dataflows"), at the driver level:
state still comes from the last committed snapshot, so exactly-once is the engine's as ever.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from runners.job_spec import JobSpec
from runners.launcher import RUN_ID_ENV
from runners.processes import (
    group_members,
    process_alive,
    process_start_time,
    read_json,
    write_json,
)

log = logging.getLogger(__name__)

STANDBY_DIR: Final = ".standby"
STANDBY_MODULE: Final = "runners.engine.standby"
#: written by the standby driver once its session and workers are warm
READY: Final = "ready.json"
#: written by the launcher on adoption: the run's engine arguments and environment
GO: Final = "go.json"
_INFO: Final = "standby.json"
_KILL_WAIT_S: Final = 5.0


def standby_key(spec: JobSpec) -> str:
    """What a standby must share with a run to take it over: the spec without its run id."""
    shape = {**spec.to_dict(), "run_id": None}
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:16]


class Standbys:
    """The standbys under one runs directory."""

    def __init__(self, runs_dir: Path) -> None:
        self.root = runs_dir / STANDBY_DIR
        self._children: dict[Path, subprocess.Popen[bytes]] = {}

    def _entries(self) -> list[tuple[Path, dict[str, Any]]]:
        if not self.root.is_dir():
            return []
        found = []
        for directory in sorted(self.root.iterdir()):
            info = read_json(directory / _INFO)
            if info is not None:
                found.append((directory, info))
        return found

    def _alive(self, directory: Path) -> bool:
        pid = read_json(directory / "pid")
        return pid is not None and process_alive(int(pid["pid"]), pid.get("start_time"))

    def ready(self, spec: JobSpec) -> Path | None:
        """A live standby for `spec` whose driver is warm (None: none ready)."""
        key = standby_key(spec)
        for directory, info in self._entries():
            if info.get("key") == key and (directory / READY).exists() and self._alive(directory):
                return directory
        return None

    def adopt(
        self, spec: JobSpec, run_dir: Path, argv: Sequence[str]
    ) -> subprocess.Popen[bytes] | None:
        """Turn a ready standby for `spec` into the run in `run_dir` (which must not exist).

        Returns the standby's supervisor process when this launcher started it (or None), and
        raises FileNotFoundError when no standby was ready."""
        directory = self.ready(spec)
        if directory is None:
            raise FileNotFoundError(f"no ready standby for {spec.application}/{spec.branch}")
        os.rename(directory, run_dir)  # atomic: of two launchers, one adopts it
        try:
            write_json(run_dir / "spec.json", spec.to_dict())
            write_json(run_dir / GO, {"argv": list(argv), "env": {RUN_ID_ENV: spec.run_id}})
        except OSError:  # the run must not look started: kill it, the caller starts cold
            self._kill(run_dir)
            raise
        log.info("run %s: adopted the standby %s", spec.run_id, directory.name)
        return self._children.pop(directory, None)

    def launch(
        self,
        spec: JobSpec,
        primary: Path,
        *,
        python: str,
        env: Mapping[str, str],
        cwd: Path,
    ) -> Path | None:
        """Start a standby for `spec` shadowing the run in `primary` (None: one exists)."""
        key = standby_key(spec)
        for directory, info in self._entries():
            if info.get("key") == key and self._alive(directory):
                return None
        self.root.mkdir(parents=True, exist_ok=True)
        directory = self.root / f"{key}-{secrets.token_hex(4)}"
        directory.mkdir()
        argv = [
            python, "-m", "runners.local", "supervise", str(directory), "--",
            python, "-m", STANDBY_MODULE, str(directory), "--primary", str(primary),
        ]  # fmt: skip
        with open(directory / "output.log", "ab") as output:
            child = subprocess.Popen(
                argv,
                cwd=cwd,
                env={**env, RUN_ID_ENV: ""},
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._children[directory] = child
        write_json(
            directory / "pid", {"pid": child.pid, "start_time": process_start_time(child.pid)}
        )
        # last: a directory without it is not a standby yet (never adopted nor pruned)
        write_json(
            directory / _INFO,
            {"key": key, "application": spec.application, "branch": spec.branch},
        )
        log.info("standby %s for %s/%s started", directory.name, spec.application, spec.branch)
        return directory

    def discard(self, application: str, branch: str, *, keep: JobSpec | None = None) -> int:
        """Kill the standbys of `application`/`branch` (all, or those not for `keep`) and the
        dead ones of any job; returns how many live standbys were killed."""
        keep_key = None if keep is None else standby_key(keep)
        killed = 0
        for directory, info in self._entries():
            alive = self._alive(directory)
            ours = info.get("application") == application and info.get("branch") == branch
            if alive and (not ours or info.get("key") == keep_key):
                continue
            killed += alive
            self._kill(directory)
        return killed

    def _kill(self, directory: Path) -> None:
        pid = read_json(directory / "pid")
        if pid is not None:
            pgid = int(pid["pid"])
            deadline = time.monotonic() + _KILL_WAIT_S
            while group_members(pgid) and time.monotonic() < deadline:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGKILL)
                time.sleep(0.05)
        child = self._children.pop(directory, None)
        if child is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=_KILL_WAIT_S)
        shutil.rmtree(directory, ignore_errors=True)
