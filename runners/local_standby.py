"""Warm standby drivers for the local launcher (`resources.standby`).

A standby is a process group like a run's — the supervisor, a driver with its SparkSession
up and its Python workers forked with the engine imported (`runners.engine.standby`) — kept
in ``<runs_dir>/.standby/<key>-<nonce>/`` for one job spec (every field but the run id: the
same job, arguments, store, parallelism, Spark conf and driver memory), the same interpreter
and the same environment (the settings it froze when it started: `standby_key`). It starts
once the run it shadows has committed its first epoch (so it never slows that run's start),
fingerprints the engine's and the job package's code before importing either (`code_fingerprint`,
in ``ready.json``) and then waits. When the control plane starts a run of the same spec — the
reconciler restarting a failed run — the launcher *adopts* a standby whose key and code
fingerprint match: a handshake first (``offer.json`` with the run id; the standby, alive and
not on its way out, answers ``ack.json`` and from then on never exits without running the run),
then it renames the standby's directory to the run's (the open log, the supervisor and its exit
status follow the directory), writes ``spec.json`` and hands the driver its arguments in
``go.json``; the driver starts epochs at once. A standby that does not acknowledge in time is
killed and the run starts cold; one that exits 0 after acknowledging without the engine having
run (``engine.json``) is recorded as failed by its supervisor (`adopted_exit`). A start that
adopts nothing discards the job's standbys (one still warming up shadows the failed run) and
launches a new one shadowing the new run. Recovery then
skips the interpreter, the JVM, the SparkSession and the Python workers' start. The idea is the
warm passive standby of the high-availability literature (Silvestre et al., "Clonos:
Consistent Causal Recovery for Highly-Available Streaming Dataflows"), at the driver level:
state still comes from the last committed snapshot, so exactly-once is the engine's as ever.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from importlib.metadata import entry_points
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
#: written by the launcher before the rename: the run id it offers the standby (handshake)
OFFER: Final = "offer.json"
#: written by the standby: it is alive, not exiting, and takes the offered run (handshake)
ACK: Final = "ack.json"
#: written by the launcher on adoption: the run's engine arguments and environment
GO: Final = "go.json"
#: written by the standby when the engine it ran for the adopted run returned
ENGINE_EXIT: Final = "engine.json"
_INFO: Final = "standby.json"
_KILL_WAIT_S: Final = 5.0
#: how long a launcher waits for a standby's ack (it polls every 10 ms when healthy)
HANDSHAKE_TIMEOUT_S: Final = 3.0
#: exit status a supervisor records for an adopted standby that exited 0 without running
ADOPTED_WITHOUT_RUN: Final = 70
#: the engine's own code: what a standby imports before a run's code is known
ENGINE_PACKAGES: Final = ("runners", "snapshots_store")
_FILE_HASHES: dict[tuple[str, int, int], str] = {}


def _package_files(package: str) -> list[Path]:
    """The Python source files of top-level `package` (empty when it cannot be found)."""
    try:
        found = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return []
    if found is None:
        return []
    roots = [Path(p) for p in (found.submodule_search_locations or [])]
    if not roots:
        return [Path(found.origin)] if found.origin else []
    return sorted(f for root in roots for f in root.rglob("*.py") if f.is_file())


def _file_hash(path: Path) -> str:
    st = path.stat()
    key = (str(path), st.st_mtime_ns, st.st_size)
    digest = _FILE_HASHES.get(key)
    if digest is None:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        _FILE_HASHES[key] = digest
    return digest


def job_packages(job: str) -> list[str]:
    """The top-level packages of the code a job runs: the engine's and the one its
    ``epochal.jobs`` entry point is in (only the engine's when the name is not registered)."""
    modules = {ep.module for ep in entry_points(group="epochal.jobs", name=job)}
    return sorted({*ENGINE_PACKAGES, *(m.split(".")[0] for m in modules)})


def code_fingerprint(packages: Iterable[str]) -> str:
    """A hash of the source files of `packages` (their paths and contents): it changes with a
    deploy. File hashes are cached by path, modification time and size."""
    digest = hashlib.sha256()
    for package in sorted(set(packages)):
        for path in _package_files(package):
            digest.update(f"{path}\0{_file_hash(path)}\n".encode())
    return digest.hexdigest()[:16]


def standby_key(spec: JobSpec, *, python: str, env: Mapping[str, str]) -> str:
    """What a standby must share with a run to take it over: the spec without its run id, the
    interpreter and the environment it froze when it started (but the run id)."""
    shape = {
        "spec": {**spec.to_dict(), "run_id": None},
        "python": python,
        "env": {k: v for k, v in sorted(env.items()) if k != RUN_ID_ENV},
    }
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:16]


def adopted_exit(directory_fd: int, returncode: int) -> tuple[int, str | None]:
    """The exit status a supervisor records for its child: an adopted standby (it wrote
    ``ack.json``) that exited 0 although the engine never ran for the run (no ``engine.json``)
    failed — the run it took over processed nothing."""
    if returncode != 0:
        return returncode, None
    acked = read_json(Path(ACK), dir_fd=directory_fd)
    if acked is None or read_json(Path(ENGINE_EXIT), dir_fd=directory_fd) is not None:
        return returncode, None
    return ADOPTED_WITHOUT_RUN, (
        f"the standby acknowledged run {acked.get('run_id')} and exited without running it"
    )


class Standbys:
    """The standbys under one runs directory."""

    def __init__(
        self,
        runs_dir: Path,
        *,
        handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S,
        go_timeout_s: float | None = None,
    ) -> None:
        self.root = runs_dir / STANDBY_DIR
        self.handshake_timeout_s = handshake_timeout_s
        #: the standby's --go-timeout (None: its default)
        self.go_timeout_s = go_timeout_s
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

    def ready(self, key: str, code: str) -> Path | None:
        """A live standby with `key` whose driver is warm and runs the code fingerprinted
        `code` (None: none ready)."""
        for directory, info in self._entries():
            if info.get("key") != key or not self._alive(directory):
                continue
            warm = read_json(directory / READY)
            if warm is not None and warm.get("code") == code and not (directory / OFFER).exists():
                return directory
        return None

    def _handshake(self, directory: Path, run_id: str) -> bool:
        """Offer `run_id` to the standby in `directory`; True once it acknowledged this offer.
        A standby that does not answer in time (hung, or already on its way out) is killed;
        one that acknowledged another launcher's offer is left to that launcher."""
        nonce = secrets.token_hex(8)
        write_json(directory / OFFER, {"run_id": run_id, "nonce": nonce})
        deadline = time.monotonic() + self.handshake_timeout_s
        while time.monotonic() < deadline:
            acked = read_json(directory / ACK)
            if acked is not None:
                return acked.get("nonce") == nonce
            if not self._alive(directory):
                break
            time.sleep(0.005)
        log.warning("standby %s did not acknowledge run %s: discarded", directory.name, run_id)
        self._kill(directory)
        return False

    def adopt(
        self, key: str, code: str, spec: JobSpec, run_dir: Path, argv: Sequence[str]
    ) -> subprocess.Popen[bytes] | None:
        """Turn a ready standby with `key` and code `code` into the run of `spec` in `run_dir`
        (which must not exist), after the handshake.

        Returns the standby's supervisor process when this launcher started it (or None), and
        raises FileNotFoundError when no standby was ready or none acknowledged the run."""
        directory = self.ready(key, code)
        if directory is None:
            raise FileNotFoundError(f"no ready standby for {spec.application}/{spec.branch}")
        if not self._handshake(directory, spec.run_id):
            raise FileNotFoundError(f"the standby {directory.name} did not take run {spec.run_id}")
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
        key = standby_key(spec, python=python, env=env)
        for directory, info in self._entries():
            if info.get("key") == key and self._alive(directory):
                return None
        self.root.mkdir(parents=True, exist_ok=True)
        directory = self.root / f"{key}-{secrets.token_hex(4)}"
        directory.mkdir()
        argv = [
            python, "-m", "runners.local", "supervise", str(directory), "--",
            python, "-m", STANDBY_MODULE, str(directory), "--primary", str(primary),
            "--packages", ",".join(job_packages(spec.job)),
        ]  # fmt: skip
        if self.go_timeout_s is not None:
            argv += ["--go-timeout", str(self.go_timeout_s)]
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
            {
                "key": key,
                "application": spec.application,
                "branch": spec.branch,
                "primary": str(primary),
            },
        )
        log.info("standby %s for %s/%s started", directory.name, spec.application, spec.branch)
        return directory

    def discard(self, application: str, branch: str, *, keep_key: str | None = None) -> int:
        """Kill the standbys of `application`/`branch` (all, or those whose key is not
        `keep_key`) and the dead ones of any job; returns how many live standbys were killed."""
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
