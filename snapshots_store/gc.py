"""Garbage collection by reachability.

Roots: every live ref (branches and tags) and every reflog entry (its old and new value)
newer than the retention window. Everything reachable from a root through parents, chunks
and outputs is kept. An unreachable object is removed only if it is older than the grace
period — objects of an in-flight commit (written, not yet committed by CAS) are young —
and objects written after gc started are never removed. `put_object` rewrites an existing
object older than an hour, so keep the grace period above that (default 24 h) whenever
writers may be running; grace 0 is only for a store nobody writes to. Leftover temp files
of killed writers are removed after the same grace period. gc refuses to delete anything
when a reachable manifest is missing or corrupt (it could not know what that manifest
protects). Finally it prunes reflog entries older than the retention window (see reflog.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

from snapshots_store.codec import format_timestamp, parse_timestamp
from snapshots_store.errors import StoreError
from snapshots_store.objects import OBJECTS_PREFIX, id_from_key
from snapshots_store.packs import ref_objects
from snapshots_store.reflog import (
    ReflogEntry,
    logged_seqs,
    prune,
    pruned_before,
    read_entry,
)
from snapshots_store.refs import RefDocument

if TYPE_CHECKING:
    from snapshots_store.repository import Repository

#: reflog entries younger than this keep what they name alive.
DEFAULT_RETENTION: Final = timedelta(days=7)
#: objects younger than this are never removed (they may belong to an in-flight commit).
DEFAULT_GRACE: Final = timedelta(hours=24)
#: reflog entries are scanned newest first until one is this much older than the cutoff,
#: which tolerates clock skew between writers.
CLOCK_SKEW: Final = timedelta(minutes=5)
#: S3 reports modification times in whole seconds; an object is "older than the grace
#: period" only when it is so by more than this.
MTIME_RESOLUTION: Final = timedelta(seconds=1)


@dataclass(frozen=True)
class GcItem:
    """One key that gc removed (or would remove, in a dry run)."""

    key: str
    object_id: str | None
    size: int
    mtime: datetime
    reason: str  # "unreachable" or "partial write"

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "object_id": self.object_id,
            "size": self.size,
            "mtime": format_timestamp(self.mtime),
            "reason": self.reason,
        }


@dataclass(frozen=True)
class GcReport:
    dry_run: bool
    started_at: datetime
    roots: int
    reflog_roots_gone: int
    reachable_objects: int
    kept_young: int
    removed: tuple[GcItem, ...]
    reflog_entries_pruned: int = 0

    @property
    def removed_bytes(self) -> int:
        return sum(item.size for item in self.removed)

    def to_dict(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "started_at": format_timestamp(self.started_at),
            "roots": self.roots,
            "reflog_roots_gone": self.reflog_roots_gone,
            "reachable_objects": self.reachable_objects,
            "kept_young": self.kept_young,
            "removed_bytes": self.removed_bytes,
            "removed": [item.to_dict() for item in self.removed],
            "reflog_entries_pruned": self.reflog_entries_pruned,
        }


def find_roots(
    repo: Repository, docs: list[RefDocument], cutoff: datetime
) -> tuple[set[str], set[str]]:
    """(live ref targets, snapshots named by reflog entries made at or after `cutoff`)."""
    live: set[str] = set()
    logged_roots: set[str] = set()
    for doc in docs:
        if doc.target is not None:
            live.add(doc.target)
        _add_entry(logged_roots, doc.entry, cutoff)
        first = pruned_before(repo.backend, doc.name)
        for seq in reversed(logged_seqs(repo.backend, doc.name)):  # newest first
            if seq < first:
                break
            entry = read_entry(repo.backend, doc.name, seq)
            if entry is None:
                continue
            try:
                if parse_timestamp(entry.at) < cutoff - CLOCK_SKEW:
                    break
            except ValueError:
                pass  # unreadable time: keep what it names, keep scanning
            _add_entry(logged_roots, entry, cutoff)
    return live, logged_roots - live


def _add_entry(roots: set[str], entry: ReflogEntry, cutoff: datetime) -> None:
    try:
        recent = parse_timestamp(entry.at) >= cutoff
    except ValueError:
        recent = True  # unreadable time: keep what it names
    if recent:
        roots.update(v for v in (entry.old, entry.new) if v is not None)


def mark(repo: Repository, live: set[str], logged: set[str]) -> tuple[set[str], set[str]]:
    """(ids of every object reachable from the roots, reflog roots already gone).

    A live ref target or a parent that cannot be read stops gc (StoreError). A snapshot
    named only by a recent reflog entry may be gone — collected by an earlier gc run with
    a shorter retention — and is skipped.
    """
    reachable: set[str] = set()
    gone: set[str] = set()
    for snapshot_id in logged:
        if not repo.objects.has(snapshot_id):
            gone.add(snapshot_id)
    queue = list(live | (logged - gone))
    while queue:
        snapshot_id = queue.pop()
        if snapshot_id in reachable:
            continue
        try:
            manifest = repo.read_manifest(snapshot_id)
        except StoreError as exc:
            raise StoreError(
                f"gc stopped before deleting anything: reachable snapshot {snapshot_id} "
                f"cannot be read ({exc})"
            ) from exc
        reachable.add(snapshot_id)
        for chunks in manifest.key_groups.values():
            reachable.update(ref_objects(chunks))
        reachable.update(manifest.outputs)
        queue.extend(p for p in manifest.parents if p not in reachable)
    return reachable, gone


def collect_garbage(
    repo: Repository,
    *,
    retention: timedelta = DEFAULT_RETENTION,
    grace: timedelta = DEFAULT_GRACE,
    dry_run: bool = False,
) -> GcReport:
    """Remove objects of `repo` unreachable from refs and recent reflog entries and older than
    `grace` (or only list them when `dry_run`)."""
    if retention < timedelta(0) or grace < timedelta(0):
        raise ValueError("retention and grace must not be negative")
    started = repo.now()
    docs = repo.refs.list_documents()
    live, logged = find_roots(repo, docs, started - retention)
    reachable, gone = mark(repo, live, logged)
    young_after = started - grace - MTIME_RESOLUTION
    removed: list[GcItem] = []
    kept_young = 0
    for info in repo.backend.list(OBJECTS_PREFIX):
        oid = id_from_key(info.key)
        if oid is None or oid in reachable:
            continue
        if info.mtime >= young_after:
            kept_young += 1
            continue
        removed.append(GcItem(info.key, oid, info.size, info.mtime, "unreachable"))
    for info in repo.backend.list_partial(""):
        if info.mtime < young_after:
            removed.append(GcItem(info.key, None, info.size, info.mtime, "partial write"))
    if not dry_run:
        deleted: list[GcItem] = []
        for item in removed:
            # Re-check just before deleting: a writer may have refreshed the object since
            # the listing (put_object rewrites an old object it re-uses).
            now = repo.backend.stat(item.key)
            if now is not None and now.mtime >= young_after:
                kept_young += 1
                continue
            repo.backend.delete(item.key)
            deleted.append(item)
        removed = deleted
    pruned = sum(
        prune(repo.backend, doc.name, doc.seq, started - retention, dry_run=dry_run) for doc in docs
    )
    return GcReport(
        dry_run=dry_run,
        started_at=started,
        roots=len(live) + len(logged) - len(gone),
        reflog_roots_gone=len(gone),
        reachable_objects=len(reachable),
        kept_young=kept_young,
        removed=tuple(sorted(removed, key=lambda item: item.key)),
        reflog_entries_pruned=pruned,
    )
