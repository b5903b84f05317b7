"""The reflog: every move of a ref, numbered 1, 2, 3 … without gaps.

Entry `n` lives inside the ref document written by move `n` and, create-only, at
``logs/refs/<name>/<n:012d>``. A writer persists its predecessor's entry *before* its own
compare-and-swap, so entries 1..n-1 are always in ``logs/`` once move `n` is visible, even
if the writer of move n-1 died right after its CAS. Readers read the ref first, then the
log keys, so they see a consistent, gap-free history.

gc prunes entries older than the retention window, always a prefix: it first raises the
mark ``logs/refs/<name>/pruned-before`` and then deletes the entries below it, so the
retained reflog is still gap-free from the mark on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from snapshots_store.backends.base import Backend
from snapshots_store.codec import canonical_json, parse_timestamp
from snapshots_store.errors import StoreError
from snapshots_store.objects import is_object_id

LOGS_PREFIX: Final = "logs/refs/"
PRUNED_MARK: Final = "pruned-before"
_SEQ_WIDTH: Final = 12


@dataclass(frozen=True)
class ReflogEntry:
    """One move of a ref: `old` -> `new` (None = absent/deleted) made by an operation."""

    seq: int
    old: str | None
    new: str | None
    operation_id: str | None
    reason: str
    at: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "old": self.old,
            "new": self.new,
            "operation_id": self.operation_id,
            "reason": self.reason,
            "at": self.at,
        }

    def to_bytes(self) -> bytes:
        return canonical_json(self.to_dict())

    @classmethod
    def from_dict(cls, doc: object, where: str) -> ReflogEntry:
        """Parse an entry; StoreError naming `where` when it is not one."""
        ok = (
            isinstance(doc, dict)
            and set(doc) == {"seq", "old", "new", "operation_id", "reason", "at"}
            and isinstance(doc["seq"], int)
            and not isinstance(doc["seq"], bool)
            and doc["seq"] >= 1
            and all(doc[k] is None or is_object_id(doc[k]) for k in ("old", "new"))
            and (doc["operation_id"] is None or isinstance(doc["operation_id"], str))
            and isinstance(doc["reason"], str)
            and isinstance(doc["at"], str)
        )
        if not ok:
            raise StoreError(f"reflog entry at {where} is malformed: {doc!r}; run fsck")
        assert isinstance(doc, dict)
        return cls(
            doc["seq"], doc["old"], doc["new"], doc["operation_id"], doc["reason"], doc["at"]
        )


def entry_key(ref_name: str, seq: int) -> str:
    return f"{LOGS_PREFIX}{ref_name}/{seq:0{_SEQ_WIDTH}d}"


def persist_entry(backend: Backend, ref_name: str, entry: ReflogEntry) -> None:
    """Write an entry create-only (identical bytes from any writer, so races are harmless)."""
    backend.put_if_absent(entry_key(ref_name, entry.seq), entry.to_bytes())


def logged_seqs(backend: Backend, ref_name: str) -> list[int]:
    """Sequence numbers persisted under ``logs/`` for one ref, ascending (not those of refs
    nested below it, nor the pruning mark)."""
    prefix = f"{LOGS_PREFIX}{ref_name}/"
    seqs = []
    for info in backend.list(prefix):
        leaf = info.key[len(prefix) :]
        if len(leaf) == _SEQ_WIDTH and leaf.isdigit():
            seqs.append(int(leaf))
    return sorted(seqs)


def read_entry(backend: Backend, ref_name: str, seq: int) -> ReflogEntry | None:
    key = entry_key(ref_name, seq)
    blob = backend.get(key)
    if blob is None:
        return None
    try:
        doc = json.loads(blob.data)
    except ValueError:
        raise StoreError(f"reflog entry {key} is not JSON; run fsck") from None
    entry = ReflogEntry.from_dict(doc, key)
    if entry.seq != seq:
        raise StoreError(f"reflog entry {key} carries seq {entry.seq}; run fsck")
    return entry


def read_logged(backend: Backend, ref_name: str, first_seq: int = 1) -> dict[int, ReflogEntry]:
    """Entries numbered >= `first_seq` persisted under ``logs/`` for one ref."""
    entries: dict[int, ReflogEntry] = {}
    for seq in logged_seqs(backend, ref_name):
        if seq >= first_seq:
            entry = read_entry(backend, ref_name, seq)
            if entry is not None:
                entries[seq] = entry
    return entries


def assemble(
    logged: dict[int, ReflogEntry], current: ReflogEntry | None, first_seq: int = 1
) -> tuple[list[ReflogEntry], list[int]]:
    """Entries first_seq..current.seq oldest first, and the sequence numbers that are missing."""
    if current is None:
        return [logged[s] for s in sorted(logged) if s >= first_seq], []
    merged = {s: e for s, e in logged.items() if first_seq <= s < current.seq}
    merged[current.seq] = current
    missing = [s for s in range(first_seq, current.seq + 1) if s not in merged]
    return [merged[s] for s in sorted(merged)], missing


def read_history(
    backend: Backend, ref_name: str, current: ReflogEntry | None, *, limit: int | None = None
) -> tuple[list[ReflogEntry], list[int]]:
    """The retained reflog (after pruning; only the latest `limit` if given), oldest first,
    and the sequence numbers missing from it. `current` is the entry in the ref document,
    which the caller must read *before* calling this."""
    first = pruned_before(backend, ref_name)
    if limit is not None and current is not None:
        first = max(first, current.seq - limit + 1)
    entries, missing = assemble(read_logged(backend, ref_name, first), current, first)
    if limit is not None:
        entries = entries[max(0, len(entries) - limit) :] if limit else []
    return entries, missing


# -- pruning ---------------------------------------------------------------------------------


def _mark_key(ref_name: str) -> str:
    return f"{LOGS_PREFIX}{ref_name}/{PRUNED_MARK}"


def pruned_before(backend: Backend, ref_name: str) -> int:
    """The lowest sequence number still kept (entries below it were pruned by gc); 1 if none."""
    blob = backend.get(_mark_key(ref_name))
    if blob is None:
        return 1
    try:
        value = json.loads(blob.data)["pruned_before"]
    except (ValueError, KeyError, TypeError):
        value = None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise StoreError(f"pruning mark {_mark_key(ref_name)} is malformed; run fsck")
    return value


def _raise_mark(backend: Backend, ref_name: str, value: int) -> None:
    """Move the pruning mark up to `value` (never down), by compare-and-swap."""
    key = _mark_key(ref_name)
    data = canonical_json({"pruned_before": value})
    while True:
        blob = backend.get(key)
        if blob is None:
            if backend.put_if_absent(key, data) is not None:
                return
            continue
        if pruned_before(backend, ref_name) >= value:
            return
        if backend.put_if_match(key, data, blob.version) is not None:
            return


def prune(
    backend: Backend, ref_name: str, current_seq: int, cutoff: datetime, *, dry_run: bool
) -> int:
    """Drop the oldest entries made before `cutoff`, as a prefix (never the current entry
    nor any entry after a kept one); returns how many were (or would be) dropped.

    The mark is raised before entries are deleted, so readers never see a hole; entries
    left below the mark by an interrupted run are deleted by the next one.
    """
    start = pruned_before(backend, ref_name)
    seqs = logged_seqs(backend, ref_name)
    upto = start
    for seq in seqs:
        if seq < start:
            continue
        if seq != upto or seq >= current_seq:
            break
        entry = read_entry(backend, ref_name, seq)
        try:
            expired = entry is not None and parse_timestamp(entry.at) < cutoff
        except ValueError:
            expired = False
        if not expired:
            break
        upto = seq + 1
    if not dry_run:
        if upto > start:
            _raise_mark(backend, ref_name, upto)
        for seq in seqs:
            if seq < upto:
                backend.delete(entry_key(ref_name, seq))
    return upto - start
