"""Fault injection for the crash matrix: ``EPOCHAL_CRASH_AT=<point>:<epoch>`` SIGKILLs the
job's driver at a named point of the commit protocol in that epoch (never set in production).
With ``EPOCHAL_CRASH_ONCE_FILE=<path>`` only the first run to reach the point dies (it creates
the file; a run that finds it goes on), so a restarted run can redo the epoch.
"""

from __future__ import annotations

import os
import signal

from runners import config

POINTS = (
    "before_chunks",
    "after_chunks",
    "after_outputs",
    "after_manifest",
    "after_cas",
    "mid_notify",
)
#: points of a job with sinks (sinks.py): after the sinks staged the epoch, after a sink
#: committed the first part of it (the Kafka crash tests use them), and inside a destination's
#: own transaction before its COMMIT (PostgreSQL)
SINK_POINTS = ("after_prepare", "mid_sink_commit", "in_sink_transaction")
ENV = config.CRASH_AT_ENV


def crash_spec() -> tuple[str, int] | None:
    """The (point, epoch) of this process's configuration (``$EPOCHAL_CRASH_AT``), or None."""
    raw = config.current().crash_at
    if not raw:
        return None
    point, _, epoch = raw.partition(":")
    if point not in POINTS + SINK_POINTS or not epoch.isdigit():
        raise ValueError(
            f"{ENV}={raw!r}: expected <point>:<epoch> with point in {POINTS + SINK_POINTS}"
        )
    return point, int(epoch)


def maybe_crash(spec: tuple[str, int] | None, point: str, epoch: int, driver_pid: int = 0) -> None:
    """SIGKILL the driver (and this process) when `spec` names this point and epoch."""
    if spec is None or spec != (point, epoch):
        return
    once = config.current().crash_once_file
    if once:
        try:
            os.close(os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return  # an earlier run crashed here already
    pid = driver_pid or os.getpid()
    os.kill(pid, signal.SIGKILL)
    if pid != os.getpid():
        os._exit(137)
