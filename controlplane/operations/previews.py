"""What an operation would do, shown before anyone confirms it.

Each preview validates with the operation kind's own `clean` (the same checks and words as a
real request), then describes the consequences: the key-group moves a rescale implies (Flink's
range allocation: task i owns ``ceil(i*M/p) .. floor(((i+1)*M-1)/p)``) and the commits a
rollback abandons.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from controlplane.jobs.models import Job
from controlplane.lineage.errors import UnknownRevisionError
from controlplane.lineage.selectors import SnapshotSummary, snapshot_log
from controlplane.operations.framework import Target
from controlplane.operations.kinds.rescale import lineage_max_parallelism
from controlplane.operations.registry import operation_spec
from runners.engine.keygroups import KeyGroupRange, key_group_ranges, operator_index

ROLLBACK_PREVIEW_LIMIT = 1000


@dataclass(frozen=True)
class KeyGroupMove:
    """Key groups first..last change owner from task `from_task` to task `to_task`."""

    first: int
    last: int
    from_task: int
    to_task: int
    bytes: int | None

    @property
    def count(self) -> int:
        return self.last - self.first + 1


@dataclass(frozen=True)
class RescalePreview:
    params: dict[str, Any]
    max_parallelism: int
    ranges_before: list[KeyGroupRange]
    ranges_after: list[KeyGroupRange]
    moves: list[KeyGroupMove]
    total_bytes: int | None

    @property
    def from_parallelism(self) -> int:
        return len(self.ranges_before)

    @property
    def to_parallelism(self) -> int:
        return len(self.ranges_after)

    @property
    def mode(self) -> str:
        return str(self.params["mode"])

    @property
    def moved_groups(self) -> int:
        return sum(m.count for m in self.moves)

    @property
    def moved_bytes(self) -> int | None:
        if any(m.bytes is None for m in self.moves):
            return None
        return sum(m.bytes or 0 for m in self.moves)


def key_group_moves(
    max_parallelism: int, before: int, after: int, sizes: list[int] | None = None
) -> list[KeyGroupMove]:
    """Contiguous runs of key groups whose owning task index changes from p=before to
    p=after, with their stored bytes when `sizes` (bytes per key group) is given."""
    moves: list[KeyGroupMove] = []
    run: list[int] | None = None  # [first, last, from, to]
    for group in range(max_parallelism):
        a = operator_index(group, before, max_parallelism)
        b = operator_index(group, after, max_parallelism)
        if a != b and run is not None and run[2:] == [a, b] and run[1] == group - 1:
            run[1] = group
            continue
        if run is not None:
            moves.append(_move(run, sizes))
            run = None
        if a != b:
            run = [group, group, a, b]
    if run is not None:
        moves.append(_move(run, sizes))
    return moves


def _move(run: list[int], sizes: list[int] | None) -> KeyGroupMove:
    first, last, a, b = run
    size = None if sizes is None else sum(sizes[first : last + 1])
    return KeyGroupMove(first, last, a, b, size)


def rescale_preview(
    *, job: Job, parallelism: Any, mode: str = "auto", sizes: list[int] | None = None
) -> RescalePreview:
    """What rescaling `job` to `parallelism` implies; InvalidRequest when it would be refused."""
    params = operation_spec("rescale").clean(
        {"parallelism": parallelism, "mode": mode}, Target(application=job.application, job=job)
    )
    m = lineage_max_parallelism(job)
    before, after = int(params["from_parallelism"]), int(params["parallelism"])
    if sizes is not None and len(sizes) != m:
        sizes = None
    return RescalePreview(
        params=params,
        max_parallelism=m,
        ranges_before=key_group_ranges(before, m),
        ranges_after=key_group_ranges(after, m),
        moves=key_group_moves(m, before, after, sizes),
        total_bytes=None if sizes is None else sum(sizes),
    )


@dataclass(frozen=True)
class RollbackPreview:
    params: dict[str, Any]
    branch: str
    target: SnapshotSummary | None
    abandoned: list[SnapshotSummary]
    """Commits after the target on the branch's first-parent history, newest first (as
    indexed; at most ROLLBACK_PREVIEW_LIMIT)."""
    complete: bool
    """False when the list stops at the limit or the target is not on the first-parent path."""

    @property
    def head(self) -> SnapshotSummary | None:
        return self.abandoned[0] if self.abandoned else None

    @property
    def oldest(self) -> SnapshotSummary | None:
        return self.abandoned[-1] if self.abandoned else None

    @property
    def abandoned_records(self) -> int:
        return sum(int(s.stats.get("records_in", 0) or 0) for s in self.abandoned)


def rollback_preview(*, job: Job, to: str) -> RollbackPreview:
    """What rolling `job` back to `to` abandons; InvalidRequest when it would be refused."""
    params = operation_spec("rollback").clean(
        {"to": to}, Target(application=job.application, job=job)
    )
    target_id = params["to"]
    abandoned: list[SnapshotSummary] = []
    target: SnapshotSummary | None = None
    try:
        page = snapshot_log(
            application=job.application,
            rev=f"heads/{job.branch}",
            first_parent=True,
            limit=ROLLBACK_PREVIEW_LIMIT,
        )
    except UnknownRevisionError:
        page = None
    if page is not None:
        for snapshot in page.snapshots:
            if snapshot.snapshot_id == target_id:
                target = snapshot
                break
            abandoned.append(snapshot)
    return RollbackPreview(
        params=params,
        branch=job.branch,
        target=target,
        abandoned=abandoned,
        complete=target is not None,
    )
