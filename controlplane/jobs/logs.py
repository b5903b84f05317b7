"""Reads of what a job's runs printed: the driver's log (for the live log view and its
download), the exceptions that ended runs across restarts, and the epochs a run began and
never committed (the failed checkpoints). The launcher keeps the text (`run_logs`: the run
directory locally, the driver Pod's log on Kubernetes); nothing here writes."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from controlplane.jobs.events import engine_event
from controlplane.jobs.models import Job, Run, RunPhase
from controlplane.jobs.services import SHUTDOWN_REASON, run_logs

#: The most lines the log view reads from a run (the local launcher keeps the last 256 KB).
MAX_LINES = 5000


def log_lines(run: Run, *, tail: int = MAX_LINES, search: str = "") -> list[str]:
    """The last `tail` lines of `run`'s log, only those containing `search` (any case)."""
    lines = run_logs(run, tail_lines=min(max(1, tail), MAX_LINES)).splitlines()
    if search:
        needle = search.lower()
        lines = [line for line in lines if needle in line.lower()]
    return lines


@dataclass(frozen=True)
class RunException:
    """Why a run ended other than by a stop the control plane asked for."""

    run: Run
    at: datetime | None
    reason: str
    traceback: str
    """The last Python traceback the run printed ("" when none)."""
    abandoned_epoch: int | None
    """The epoch the run had begun and never committed (None: it ended between epochs, or
    before its first commit)."""


def _traceback(lines: list[str]) -> str:
    """The last `Traceback (most recent call last):` block, through its final line."""
    start = max((i for i, line in enumerate(lines) if line.startswith("Traceback (")), default=-1)
    if start < 0:
        return ""
    end = start + 1
    while end < len(lines) and (lines[end].startswith((" ", "\t")) or not lines[end].strip()):
        end += 1
    return "\n".join(lines[start : min(end + 1, len(lines))])


def abandoned_epoch(lines: list[str]) -> int | None:
    """The branch epoch a run began and did not commit (the one after its last committed
    epoch), None when every epoch it began was committed or it printed none. Only whole
    lines of the engine's JSON events count."""
    begun = committed = 0
    last_epoch: int | None = None
    for line in lines:
        event = engine_event(line)
        if event is None:
            continue
        if event.get("event") == "epoch_start":
            begun += 1
        elif event.get("event") == "committed":
            committed += 1
            last_epoch = int(event.get("epoch", 0))
    if begun <= committed:
        return None
    return None if last_epoch is None else last_epoch + 1


def job_exceptions(job: Job, *, limit: int = 20) -> list[RunException]:
    """The job's runs that failed or were stopped from outside, newest first, with their
    tracebacks — Flink's exceptions tab, across restarts."""
    ended = (
        job.runs.filter(phase__in=[RunPhase.FAILED, RunPhase.STOPPED])
        .exclude(reason__in=["", "stopped"])
        .exclude(reason__startswith=SHUTDOWN_REASON)
        .order_by("-created_at")[:limit]
    )
    found = []
    for run in ended:
        lines = run_logs(run, tail_lines=400).splitlines()
        found.append(
            RunException(
                run=run,
                at=run.finished_at,
                reason=run.reason,
                traceback=_traceback(lines),
                abandoned_epoch=abandoned_epoch(lines),
            )
        )
    return found
