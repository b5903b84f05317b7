"""How a job run is started, watched and stopped: one `Launcher` protocol, two implementations.

This module knows neither implementation (`runners.local`, `runners.kubernetes`); the edge picks
one by name with `runners.launchers.get_launcher` (`RUNNER`: `local` or `kubernetes`); nothing else
about a job changes between them. A graceful stop reaches the job through the store's control
document of its branch (see `request_stop`), so it works the same on a laptop and in a cluster;
the launcher then escalates to SIGTERM / Pod deletion and finally SIGKILL at the deadline.
"""

from __future__ import annotations

import datetime as dt
import enum
import shlex
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Final, Protocol, runtime_checkable

from runners import config
from runners.job_spec import JobSpec

STOP_KEY: Final = "stop"
"""Control-document key of a stop request: {"run_id": …, "requested_at": …, "reason": …}."""

RUN_ID_ENV: Final = config.RUN_ID_ENV
"""Environment variable that tells the job its run id (to match a stop request against)."""

_CONTROL_ATTEMPTS: Final = 8


class RunPhase(enum.StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


@dataclass(frozen=True, kw_only=True)
class RunStatus:
    """Where a run is. `reason` says why in words a user can act on (empty when obvious)."""

    phase: RunPhase
    reason: str = ""
    exit_code: int | None = None

    @property
    def finished(self) -> bool:
        return self.phase in (RunPhase.SUCCEEDED, RunPhase.FAILED)


@dataclass(frozen=True, kw_only=True)
class RunHandle:
    """Enough to find a run again, from any process (JSON round-trip via `to_dict`).

    `location` is where the launcher keeps the run: the run directory (local) or the
    Kubernetes namespace (kubernetes).
    """

    runner: str
    run_id: str
    application: str
    namespace: str
    branch: str
    store_url: str
    location: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, str]) -> RunHandle:
        return cls(**data)

    @classmethod
    def for_spec(cls, spec: JobSpec, *, runner: str, location: str) -> RunHandle:
        return cls(
            runner=runner,
            run_id=spec.run_id,
            application=spec.application,
            namespace=spec.namespace,
            branch=spec.branch,
            store_url=spec.store_url,
            location=location,
        )


class LauncherError(Exception):
    """A launcher could not do what was asked; the message says what to check."""


class RunNotFoundError(LauncherError):
    """The run is unknown to the launcher (never started here, or already cleaned up)."""


@runtime_checkable
class Launcher(Protocol):
    """Starts, watches and stops job runs. Every method is idempotent."""

    name: str

    def start(self, spec: JobSpec) -> RunHandle:
        """Start the run described by `spec`; starting the same spec again returns its handle."""
        ...

    def status(self, handle: RunHandle) -> RunStatus:
        """The run's phase now, with a reason for pending and failed runs."""
        ...

    def stop(self, handle: RunHandle, deadline_s: float) -> RunStatus:
        """Ask the job to stop at its next epoch boundary; force it after `deadline_s` seconds."""
        ...

    def cleanup(self, handle: RunHandle) -> None:
        """Remove everything the run left behind (processes, files, Kubernetes objects)."""
        ...

    def logs(self, handle: RunHandle, tail_lines: int = 100) -> str:
        """The last `tail_lines` lines of the job's output (driver output on Kubernetes)."""
        ...


def request_stop(handle: RunHandle, *, reason: str = "stop requested") -> None:
    """Write a stop request for this run into its branch's control document (CAS, retried).

    The job stops at its next epoch boundary when `doc["stop"]["run_id"]` equals its
    `EPOCHAL_RUN_ID`; other keys of the document (parallelism, pause …) are kept.
    """
    from snapshots_store import Repository
    from snapshots_store.errors import ControlConflictError

    repo = Repository.open(handle.store_url, handle.namespace)
    request = {
        "run_id": handle.run_id,
        "requested_at": dt.datetime.now(dt.UTC).isoformat(),
        "reason": reason,
    }
    for _ in range(_CONTROL_ATTEMPTS):
        doc, version = repo.read_control(handle.branch)
        if doc.get(STOP_KEY, {}).get("run_id") == handle.run_id:
            return
        try:
            repo.write_control(handle.branch, {**doc, STOP_KEY: request}, version)
            return
        except ControlConflictError:
            continue
    raise LauncherError(
        f"could not write the stop request for run {handle.run_id} into control/"
        f"{handle.branch} of {handle.namespace}: the document kept changing"
    )


def stop_requested(doc: Mapping[str, Any], run_id: str) -> bool:
    """True when the control document asks the run `run_id` to stop (the job-side check)."""
    request = doc.get(STOP_KEY)
    return isinstance(request, Mapping) and request.get("run_id") == run_id


def pyspark_submit_args(master: str, conf: Mapping[str, str], driver_memory_mb: int) -> str:
    """`PYSPARK_SUBMIT_ARGS` for a job that builds its own SparkSession (client mode)."""
    args = ["--master", master, "--driver-memory", f"{driver_memory_mb}m"]
    for key, value in sorted(conf.items()):
        args += ["--conf", f"{key}={value}"]
    return shlex.join([*args, "pyspark-shell"])
