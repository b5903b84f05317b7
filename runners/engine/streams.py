"""What the log sources (Redis Streams, RabbitMQ Streams) share: where a job starts reading,
how much one epoch reads, and the error that stops a job whose records retention deleted.

A log source's partitions are streams and its offsets are positions in them; the offsets an
epoch read are recorded in the epoch's manifest like a file's, so a restart, rescale,
rollback or fork resumes exactly where its snapshot stopped. The broker's own consumer
offsets are never read or written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

POSITIONS = ("earliest", "latest", "offset", "timestamp")


class SourceDataLostError(RuntimeError):
    """Records a snapshot still has to read were deleted from the source (retention, trim,
    a deleted stream): the job stops instead of skipping them."""


@dataclass(frozen=True)
class StartingPosition:
    """Where a stream the job has not read yet starts: ``earliest`` (the oldest retained
    record), ``latest`` (only records published after the job first plans it; the position
    is committed by the job's next epoch), ``offset:<n>`` or ``timestamp:<ms>``."""

    kind: str
    value: str = ""

    @classmethod
    def parse(cls, spec: str) -> StartingPosition:
        kind, _, value = str(spec).partition(":")
        if kind not in POSITIONS:
            raise ValueError(
                f"start {spec!r}: expected earliest, latest, offset:<offset> or timestamp:<ms>"
            )
        if kind in ("earliest", "latest") and value:
            raise ValueError(f"start {spec!r}: {kind} takes no value")
        if kind == "timestamp" and not (value.isascii() and value.isdigit()):
            raise ValueError(f"start {spec!r}: timestamp:<ms> needs milliseconds since 1970")
        if kind == "offset" and not value:
            raise ValueError(f"start {spec!r}: offset:<offset> needs an offset")
        return cls(kind, value)


def check_bounds(
    streams: Sequence[str], max_records: int | None, max_bytes: int | None, per_split: int
) -> None:
    """Refuse a stream list or bounds a source cannot work with (ValueError names it)."""
    if not streams or any(not isinstance(s, str) or not s for s in streams):
        raise ValueError(f"streams must be a non-empty list of stream names, not {streams!r}")
    if len(set(streams)) != len(streams):
        raise ValueError(f"streams {list(streams)} names a stream twice")
    for name, value in (("max_records_per_epoch", max_records), ("max_bytes_per_epoch", max_bytes)):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be a positive integer or None, not {value!r}")
    if not isinstance(per_split, int) or per_split < 1:
        raise ValueError(f"records_per_split must be a positive integer, not {per_split!r}")


def share(total: int | None, partitions: int) -> int | None:
    """One partition's part of an epoch bound: the bound divided evenly (at least 1)."""
    return None if total is None else max(1, total // max(1, partitions))
