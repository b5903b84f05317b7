"""Per-epoch statistics of a branch's history, for charts: what each commit read, wrote and cost.

The engine records its stats in every manifest (`records_in`, `output_rows`, `dead_letters`,
`bytes_written`, `changed_state_bytes`, `process_s`); the index keeps them. The commit point
is the moment the branch ref moved (its reflog entry), so the commit latency of a snapshot is
that moment minus the manifest's `created_at` (written just before the compare-and-swap).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from controlplane.applications.models import Application
from controlplane.lineage.errors import UnknownRevisionError
from controlplane.lineage.event_time import event_time_stats, watermark_at, watermark_lag_s
from controlplane.lineage.models import ReflogEntry
from controlplane.lineage.selectors import SnapshotSummary, snapshot_log


@dataclass(frozen=True)
class EpochPoint:
    """One commit on a branch's first-parent history."""

    snapshot_id: str
    epoch: int
    kind: str
    parallelism: int
    operation_id: str
    created_at: datetime
    committed_at: datetime | None
    records_in: int
    output_rows: int
    dead_letters: int
    bytes_written: int
    changed_state_bytes: int
    process_s: float | None
    #: epochs of the branch a sink's destination lacked when the commit was made (and the
    #: seconds since the oldest of them was committed); None: the job has no such sink
    sink_lag_epochs: int | None = None
    sink_lag_s: float | None = None
    #: event-time jobs: records dropped as late, and the watermark after the epoch (ms)
    late_records: int = 0
    watermark_ms: int | None = None
    #: whether the commit records event time at all (an event-time job's epoch)
    event_time: bool = False

    @property
    def watermark_at(self) -> datetime | None:
        """The watermark as an instant (UTC)."""
        return watermark_at(self.watermark_ms)

    @property
    def watermark_lag_s(self) -> float | None:
        """How far the watermark trailed the commit's wall time, its manifest's `created_at`
        (None: no watermark) — as the REST API says it."""
        return watermark_lag_s(self.watermark_ms, self.created_at)

    @property
    def commit_latency_ms(self) -> float | None:
        """From the manifest written to the branch ref moved (None: no reflog entry indexed)."""
        if self.committed_at is None:
            return None
        return max(0.0, (self.committed_at - self.created_at).total_seconds() * 1000)

    @property
    def records_in_per_s(self) -> float | None:
        if not self.process_s:
            return None
        return self.records_in / self.process_s

    @property
    def output_rows_per_s(self) -> float | None:
        if not self.process_s:
            return None
        return self.output_rows / self.process_s


def _int(stats: dict[str, int | float], name: str) -> int:
    value = stats.get(name, 0)
    return int(value) if isinstance(value, int | float) else 0


def _point(s: SnapshotSummary, committed_at: datetime | None) -> EpochPoint:
    stats = s.stats
    process = stats.get("process_s")
    lag, lag_s = stats.get("sink_lag_epochs"), stats.get("sink_lag_s")
    timed = event_time_stats(stats)
    return EpochPoint(
        snapshot_id=s.snapshot_id,
        epoch=s.epoch,
        kind=s.kind,
        parallelism=s.parallelism,
        operation_id=s.operation_id,
        created_at=s.created_at,
        committed_at=committed_at,
        records_in=_int(stats, "records_in"),
        output_rows=_int(stats, "output_rows"),
        dead_letters=_int(stats, "dead_letters"),
        bytes_written=_int(stats, "bytes_written"),
        changed_state_bytes=_int(stats, "changed_state_bytes"),
        process_s=float(process) if isinstance(process, int | float) else None,
        sink_lag_epochs=int(lag) if isinstance(lag, int | float) else None,
        sink_lag_s=float(lag_s) if isinstance(lag_s, int | float) else None,
        late_records=0 if timed is None else timed.late_records,
        watermark_ms=None if timed is None else timed.watermark_ms,
        event_time=timed is not None,
    )


def epoch_series(*, application: Application, branch: str, limit: int = 200) -> list[EpochPoint]:
    """The newest `limit` commits of `branch`'s first-parent history, oldest first ([] for a
    branch without commits). Commits an operation made (rescale, rollback, fork) are included:
    charts mark them."""
    try:
        page = snapshot_log(
            application=application, rev=f"heads/{branch}", first_parent=True, limit=limit
        )
    except UnknownRevisionError:
        return []
    snapshots = page.snapshots
    if not snapshots:
        return []
    # The ref's newest moves cover these commits (a rollback adds one move, not many).
    moves = ReflogEntry.objects.filter(application=application, ref=f"heads/{branch}").order_by(
        "-seq"
    )[: limit * 2 + 20]
    committed: dict[str, datetime] = {}
    for new_id, at in moves.values_list("new_id", "at"):
        committed[new_id] = at  # newest first: the first move to an id is kept
    return [_point(s, committed.get(s.snapshot_id)) for s in reversed(snapshots)]
