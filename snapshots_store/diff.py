"""What changed between two snapshots: key groups (with stored sizes) and source offsets."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from snapshots_store.manifest import Manifest

SizeOf = Callable[[str], int | None]


@dataclass(frozen=True)
class KeyGroupChange:
    """One key group's chunk list before and after; sizes are stored bytes (None = missing)."""

    key_group: int
    old_chunks: tuple[str, ...]
    new_chunks: tuple[str, ...]
    old_size: int | None
    new_size: int | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "key_group": self.key_group,
            "old_chunks": list(self.old_chunks),
            "new_chunks": list(self.new_chunks),
            "old_size": self.old_size,
            "new_size": self.new_size,
        }


@dataclass(frozen=True)
class OffsetChange:
    """End offset of one source partition before and after (None = not tracked there)."""

    source: str
    partition: str
    old: int | None
    new: int | None

    @property
    def advanced(self) -> int:
        """How many offsets the newer snapshot covers beyond the older (negative = back)."""
        return (self.new or 0) - (self.old or 0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "partition": self.partition,
            "old": self.old,
            "new": self.new,
            "advanced": self.advanced,
        }


@dataclass(frozen=True)
class SnapshotDiff:
    """Differences from snapshot `old` to snapshot `new`, each group sorted."""

    old: str
    new: str
    added: tuple[KeyGroupChange, ...]
    changed: tuple[KeyGroupChange, ...]
    removed: tuple[KeyGroupChange, ...]
    offsets: tuple[OffsetChange, ...]
    parallelism: tuple[int, int]
    max_parallelism: tuple[int, int]
    outputs_added: tuple[str, ...]
    outputs_removed: tuple[str, ...]

    @property
    def empty(self) -> bool:
        return not (self.added or self.changed or self.removed or self.offsets)

    def to_dict(self) -> dict[str, Any]:
        return {
            "old": self.old,
            "new": self.new,
            "added": [c.to_dict() for c in self.added],
            "changed": [c.to_dict() for c in self.changed],
            "removed": [c.to_dict() for c in self.removed],
            "offsets": [o.to_dict() for o in self.offsets],
            "parallelism": list(self.parallelism),
            "max_parallelism": list(self.max_parallelism),
            "outputs_added": list(self.outputs_added),
            "outputs_removed": list(self.outputs_removed),
        }


def _total(chunks: tuple[str, ...], size_of: SizeOf) -> int | None:
    total = 0
    for chunk in chunks:
        size = size_of(chunk)
        if size is None:
            return None
        total += size
    return total


def diff_manifests(
    old_id: str, old: Manifest, new_id: str, new: Manifest, size_of: SizeOf
) -> SnapshotDiff:
    """Compare two manifests; `size_of(object_id)` gives stored bytes (None if missing)."""
    added: list[KeyGroupChange] = []
    changed: list[KeyGroupChange] = []
    removed: list[KeyGroupChange] = []
    for group in sorted(set(old.key_groups) | set(new.key_groups)):
        before = tuple(old.key_groups.get(group, ()))
        after = tuple(new.key_groups.get(group, ()))
        if before == after:
            continue
        change = KeyGroupChange(
            group,
            before,
            after,
            _total(before, size_of) if before else 0,
            _total(after, size_of) if after else 0,
        )
        (added if not before else removed if not after else changed).append(change)
    offsets: list[OffsetChange] = []
    for source in sorted(set(old.offsets) | set(new.offsets)):
        before_parts = old.offsets.get(source, {})
        after_parts = new.offsets.get(source, {})
        for partition in sorted(set(before_parts) | set(after_parts), key=_partition_key):
            a, b = before_parts.get(partition), after_parts.get(partition)
            if a != b:
                offsets.append(OffsetChange(source, partition, a, b))
    old_outputs, new_outputs = set(old.outputs), set(new.outputs)
    return SnapshotDiff(
        old=old_id,
        new=new_id,
        added=tuple(added),
        changed=tuple(changed),
        removed=tuple(removed),
        offsets=tuple(offsets),
        parallelism=(old.parallelism, new.parallelism),
        max_parallelism=(old.max_parallelism, new.max_parallelism),
        outputs_added=tuple(sorted(new_outputs - old_outputs)),
        outputs_removed=tuple(sorted(old_outputs - new_outputs)),
    )


def _partition_key(partition: str) -> tuple[int, int | str]:
    return (0, int(partition)) if partition.isdigit() else (1, partition)
