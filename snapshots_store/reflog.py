"""The reflog: every move of a ref, numbered 1, 2, 3 … without gaps.

Entry `n` lives inside the ref document written by move `n` and, create-only, at
``logs/refs/<name>/<n:012d>``. A writer persists its predecessor's entry *before* its own
compare-and-swap, so entries 1..n-1 are always in ``logs/`` once move `n` is visible, even
if the writer of move n-1 died right after its CAS. Readers read the ref first, then the
log keys, so they see a consistent, gap-free history.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final

from snapshots_store.backends.base import Backend
from snapshots_store.codec import canonical_json
from snapshots_store.errors import StoreError
from snapshots_store.objects import is_object_id

LOGS_PREFIX: Final = "logs/refs/"
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


def read_logged(backend: Backend, ref_name: str, first_seq: int = 1) -> dict[int, ReflogEntry]:
    """Entries numbered >= `first_seq` persisted under ``logs/`` for one ref (not those of
    refs nested below it)."""
    prefix = f"{LOGS_PREFIX}{ref_name}/"
    entries: dict[int, ReflogEntry] = {}
    for info in backend.list(prefix):
        leaf = info.key[len(prefix) :]
        if len(leaf) != _SEQ_WIDTH or not leaf.isdigit():
            continue  # a nested ref's log (ref `a/b` below ref `a`)
        if int(leaf) < first_seq:
            continue
        blob = backend.get(info.key)
        if blob is None:
            continue
        try:
            doc = json.loads(blob.data)
        except ValueError:
            raise StoreError(f"reflog entry {info.key} is not JSON; run fsck") from None
        entry = ReflogEntry.from_dict(doc, info.key)
        if entry.seq != int(leaf):
            raise StoreError(f"reflog entry {info.key} carries seq {entry.seq}; run fsck")
        entries[entry.seq] = entry
    return entries


def assemble(
    logged: dict[int, ReflogEntry], current: ReflogEntry | None, first_seq: int = 1
) -> tuple[list[ReflogEntry], list[int]]:
    """Entries first_seq..current.seq oldest first, and the sequence numbers that are missing."""
    if current is None:
        return [logged[s] for s in sorted(logged)], []
    merged = {s: e for s, e in logged.items() if first_seq <= s < current.seq}
    merged[current.seq] = current
    missing = [s for s in range(first_seq, current.seq + 1) if s not in merged]
    return [merged[s] for s in sorted(merged)], missing
