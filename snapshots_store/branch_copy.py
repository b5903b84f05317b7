"""Copy one branch's history into another store: a maintenance function that takes
repositories, as `gc`, `fsck` and `replicate` do.

Unlike `replicate` (every ref and reflog of a namespace, byte for byte), `copy_branch` copies
what one branch head reaches — every ancestor's manifest and their chunks and outputs — and
creates or fast-forwards the same branch in the destination by compare-and-swap to the same
snapshot id (ids are content hashes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from snapshots_store.errors import (
    BranchConflictError,
    ObjectNotFoundError,
    RefNotFoundError,
    StoreError,
)
from snapshots_store.gc import mark
from snapshots_store.objects import decode, object_key
from snapshots_store.packs import ref_objects
from snapshots_store.repository import Repository

Progress = Callable[[int, int], None]

#: like `put_object`: an existing object older than this is rewritten (same bytes) so that
#: gc's grace period protects it until the ref that needs it is moved
_REFRESH_AFTER: Final = timedelta(hours=1)


@dataclass(frozen=True)
class CopyResult:
    """What `copy_branch` did. Bytes are stored (compressed) object sizes."""

    branch: str
    snapshot_id: str
    manifests: int
    objects_copied: int
    bytes_copied: int
    objects_skipped: int
    bytes_skipped: int
    previous_target: str | None
    ref_moved: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _data_objects(repo: Repository, snapshot_id: str) -> list[str]:
    """A snapshot's key-group chunk objects, then its outputs."""
    m = repo.read_manifest(snapshot_id)
    return ref_objects(c for chain in m.key_groups.values() for c in chain) + list(m.outputs)


def reachable_objects(repo: Repository, snapshot_id: str) -> tuple[list[str], list[str]]:
    """(manifests, data objects) reachable from a snapshot: every ancestor's manifest, parents
    before children, and their key-group chunks and outputs (each once, in first-use order:
    the order a copy writes them in)."""
    manifests = [sid for sid, _ in repo.log(snapshot_id)]
    manifests.reverse()
    seen: set[str] = set()
    data: list[str] = []
    for sid in manifests:
        for oid in _data_objects(repo, sid):
            if oid not in seen:
                seen.add(oid)
                data.append(oid)
    return manifests, data


def copy_branch(
    src: Repository,
    dst: Repository,
    branch: str,
    *,
    progress: Progress | None = None,
    operation_id: str | None = None,
    reason: str | None = None,
    verify_existing: bool = False,
    force: bool = False,
) -> CopyResult:
    """Copy every object reachable from `branch`'s head in `src` to `dst`, then create or move
    ``heads/<branch>`` in `dst` by CAS to the same snapshot id.

    Objects `dst` already has are skipped (read and hash-checked too with
    `verify_existing`); copied objects are hash-checked on the way (the stored bytes are
    copied as they are). A manifest is written only after its parents and all its objects,
    so a crash leaves `dst` consistent, and re-running finishes the job. The branch in `dst`
    may be absent, at the same snapshot, or at an ancestor of it (fast-forward); anything
    else is refused (`BranchConflictError`) unless `force` (the reflog keeps the old
    target). `progress(done, total)` is called after every object.
    """
    head_ref = src.read_ref(f"heads/{branch}")
    if head_ref is None:
        raise RefNotFoundError(f"heads/{branch}")
    head = head_ref.target
    manifests, data = reachable_objects(src, head)
    copier = _Copier(src, dst, _protected_in(dst, branch), verify_existing,
                     len(manifests) + len(data), progress)  # fmt: skip
    position = {oid: i for i, oid in enumerate(data)}
    copied_until = 0
    for sid in manifests:
        last = max((position[oid] for oid in _data_objects(src, sid)), default=-1)
        while copied_until <= last:
            copier.copy(data[copied_until], f"chunk or output of snapshot {sid}")
            copied_until += 1
        copier.copy(sid, f"manifest of branch {branch}")
    previous, moved = _move_branch(src, dst, branch, head, operation_id, reason, force)
    return CopyResult(
        branch=branch,
        snapshot_id=head,
        manifests=len(manifests),
        objects_copied=copier.counts["copied"],
        bytes_copied=copier.counts["bytes_copied"],
        objects_skipped=copier.counts["skipped"],
        bytes_skipped=copier.counts["bytes_skipped"],
        previous_target=previous,
        ref_moved=moved,
    )


def _move_branch(src: Repository, dst: Repository, branch: str, head: str,
                 operation_id: str | None, reason: str | None,
                 force: bool) -> tuple[str | None, bool]:  # fmt: skip
    """Point the destination's branch at `head`: (its previous target, whether it moved)."""
    name = f"heads/{branch}"
    current = dst.read_ref(name)
    previous = None if current is None else current.target
    if previous == head:
        return previous, False
    if previous is not None and not force and not dst.is_ancestor(previous, head):
        raise BranchConflictError(
            name,
            previous,
            head,
            f"branch {branch!r} in the destination store is at {previous}, which is not in "
            f"the history of {head} being copied: the destination has commits the source "
            "lacks. Copy to another branch name, move or delete the destination branch, "
            "or pass force=True (its reflog keeps the old target)",
        )
    dst.cas_ref(name, previous, head, operation_id=operation_id,
                reason=reason or f"copy of {branch} from {src.backend.url}")  # fmt: skip
    return previous, True


def _protected_in(dst: Repository, branch: str) -> set[str]:
    """Objects reachable from the destination branch's current head (gc keeps them): gc's
    own walk from that head."""
    current = dst.read_ref(f"heads/{branch}")
    if current is None:
        return set()
    try:
        reachable, _ = mark(dst, {current.target}, set())
    except StoreError:
        return set()  # a damaged destination: refresh everything we copy
    return reachable


class _Copier:
    """Copies objects one by one, counting what it copied and skipped."""

    def __init__(self, src: Repository, dst: Repository, protected: set[str],
                 verify_existing: bool, total: int, progress: Progress | None) -> None:  # fmt: skip
        self.src, self.dst, self.protected = src, dst, protected
        self.verify_existing, self.total, self.progress = verify_existing, total, progress
        self.counts = {"copied": 0, "bytes_copied": 0, "skipped": 0, "bytes_skipped": 0}
        self.done = 0

    def copy(self, oid: str, context: str) -> None:
        copied, size = self._copy_object(oid, context)
        key = "copied" if copied else "skipped"
        self.counts[key] += 1
        self.counts[f"bytes_{key}"] += size
        self.done += 1
        if self.progress is not None:
            self.progress(self.done, self.total)

    def _copy_object(self, oid: str, context: str) -> tuple[bool, int]:
        """(copied?, stored size). Skips an object `dst` has unless it is old and
        unprotected."""
        key = object_key(oid)
        info = self.dst.backend.stat(key)
        if info is not None:
            fresh = datetime.now(UTC) - info.mtime < _REFRESH_AFTER
            if oid in self.protected or fresh:
                if self.verify_existing:
                    self.dst.get_object(oid)  # CorruptObjectError names it: repair, re-run
                return False, info.size
        blob = self.src.backend.get(key)
        if blob is None:
            raise ObjectNotFoundError(oid, f"{context}, in the source store {self.src.backend.url}")
        decode(oid, blob.data)  # verifies kind header, length and content hash
        self.dst.backend.put(key, blob.data)
        return True, len(blob.data)


__all__ = ["CopyResult", "copy_branch", "reachable_objects"]
