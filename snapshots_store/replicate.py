"""Replicate a namespace's history into another store: objects, refs, reflogs, control docs.

The copy is exact: every object reachable from a ref or a reflog entry keeps its id (ids are
content hashes), and refs and reflog entries are copied byte for byte, so the destination
continues the same history (same reflog sequence numbers) and an index built from the source
stays valid for the destination. Objects are written before the refs that name them, every
object is verified against its id on the way, and a re-run after a crash only copies what is
still missing — replication is idempotent.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from snapshots_store.backends.base import Backend
from snapshots_store.control import CONTROL_PREFIX
from snapshots_store.errors import StoreError
from snapshots_store.gc import find_roots, mark
from snapshots_store.objects import decode, object_key
from snapshots_store.reflog import LOGS_PREFIX
from snapshots_store.refs import ref_key
from snapshots_store.repository import Repository

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class ReplicationReport:
    objects_copied: int
    objects_present: int
    bytes_copied: int
    refs: int
    reflog_entries: int

    def to_dict(self) -> dict[str, int]:
        return {
            "objects_copied": self.objects_copied,
            "objects_present": self.objects_present,
            "bytes_copied": self.bytes_copied,
            "refs": self.refs,
            "reflog_entries": self.reflog_entries,
        }


def _copy_key(src: Backend, dst: Backend, key: str, *, what: str) -> bool:
    """Copy one key if the destination lacks it; True when bytes were written."""
    blob = src.get(key)
    if blob is None:
        return False
    existing = dst.get(key)
    if existing is not None:
        if existing.data != blob.data:
            raise StoreError(
                f"the destination already has {what} {key} with different content; "
                "replicate into an empty namespace (or one replicated from this source)"
            )
        return False
    if dst.put_if_absent(key, blob.data) is None:
        again = dst.get(key)
        if again is None or again.data != blob.data:
            raise StoreError(f"{what} {key} changed in the destination while it was copied")
        return False
    return True


def replicate(
    src: Repository, dst: Repository, *, progress: Progress | None = None
) -> ReplicationReport:
    """Copy everything `src`'s refs and reflogs reach into `dst`; see the module docstring."""
    report = progress or (lambda _done, _total: None)
    docs = src.refs.list_documents()
    live, logged = find_roots(src, docs, datetime(1970, 1, 1, tzinfo=UTC))
    reachable, _gone = mark(src, live, logged)
    total = len(reachable)
    copied = present = size = 0
    for done, oid in enumerate(sorted(reachable), start=1):
        key = object_key(oid)
        if dst.backend.stat(key) is not None:
            present += 1
        else:
            blob = src.backend.get(key)
            if blob is None:
                raise StoreError(f"object {oid} vanished from the source during replication")
            decode(oid, blob.data)  # verify against its id before it leaves the source
            if dst.backend.put_if_absent(key, blob.data) is not None:
                copied += 1
                size += len(blob.data)
            else:
                present += 1
        if done % 200 == 0 or done == total:
            report(done, total)
    entries = 0
    for doc in docs:
        for info in list(src.backend.list(f"{LOGS_PREFIX}{doc.name}/")):
            entries += _copy_key(src.backend, dst.backend, info.key, what="reflog entry")
    for info in list(src.backend.list(CONTROL_PREFIX)):
        _copy_key(src.backend, dst.backend, info.key, what="control document")
    for doc in docs:  # refs last: the destination never names an object it lacks
        _copy_key(src.backend, dst.backend, ref_key(doc.name), what="ref")
    return ReplicationReport(
        objects_copied=copied,
        objects_present=present,
        bytes_copied=size,
        refs=len(docs),
        reflog_entries=entries,
    )
