"""Refs: named pointers to snapshots (``heads/<branch>``, ``tags/<tag>``) moved by CAS.

Names are validated before any I/O, so no name can reach outside the store root. A ref
document is ``{"target": id-or-null, "seq": n, "entry": <reflog entry n>}``; deleting a ref
writes a tombstone (target null) so its reflog stays gap-free if the name is reused.
"""

from __future__ import annotations

import builtins
import json
from dataclasses import dataclass

from snapshots_store.backends.base import Backend
from snapshots_store.codec import canonical_json
from snapshots_store.errors import InvalidNameError, RefConflictError, StoreError
from snapshots_store.names import (
    REFS_PREFIX,
    check_branch_name,
    check_namespace,
    check_ref_name,
)
from snapshots_store.objects import check_object_id
from snapshots_store.reflog import ReflogEntry, persist_entry

__all__ = [
    "RefDocument",
    "RefStore",
    "RefValue",
    "check_branch_name",
    "check_namespace",
    "check_ref_name",
    "ref_key",
]


def ref_key(name: str) -> str:
    return REFS_PREFIX + check_ref_name(name)


@dataclass(frozen=True)
class RefValue:
    """Where a ref points and how many times it has moved (its latest reflog seq)."""

    target: str
    seq: int


@dataclass(frozen=True)
class RefDocument:
    """A stored ref document with the version token its next CAS must match."""

    name: str
    target: str | None
    seq: int
    entry: ReflogEntry
    raw: bytes
    version: str


def parse_ref_document(name: str, raw: bytes, version: str) -> RefDocument:
    where = ref_key(name)
    try:
        doc = json.loads(raw)
    except ValueError:
        raise StoreError(f"ref document {where} is not JSON; run fsck") from None
    if not (
        isinstance(doc, dict)
        and set(doc) == {"target", "seq", "entry"}
        and (doc["target"] is None or isinstance(doc["target"], str))
        and isinstance(doc["seq"], int)
    ):
        raise StoreError(f"ref document {where} is malformed: {doc!r}; run fsck")
    if doc["target"] is not None:
        check_object_id(doc["target"])
    entry = ReflogEntry.from_dict(doc["entry"], where)
    if entry.seq != doc["seq"] or entry.new != doc["target"]:
        raise StoreError(f"ref document {where} disagrees with its reflog entry; run fsck")
    return RefDocument(name, doc["target"], doc["seq"], entry, raw, version)


#: how often a CAS whose compare still holds is retried after losing the write race
_ATTEMPTS = 5


class RefStore:
    """Refs of one namespace on a backend (plumbing under `Repository`)."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def read_document(self, name: str) -> RefDocument | None:
        """The stored document (tombstones included), or None when never written."""
        name = check_ref_name(name)
        blob = self.backend.get(ref_key(name))
        return None if blob is None else parse_ref_document(name, blob.data, blob.version)

    def read(self, name: str) -> RefValue | None:
        doc = self.read_document(name)
        if doc is None or doc.target is None:
            return None
        return RefValue(doc.target, doc.seq)

    def cas(
        self,
        name: str,
        expected: str | None,
        new: str | None,
        *,
        operation_id: str | None,
        reason: str,
        at: str,
    ) -> RefDocument:
        """Move `name` from `expected` to `new` (None = absent) atomically, logging the move."""
        name = check_ref_name(name)
        for value in (expected, new):
            if value is not None:
                check_object_id(value)
        if not isinstance(reason, str):
            raise TypeError(f"the reason for moving {name} must be a string, not {reason!r}")
        current = self.read_document(name)
        for _ in range(_ATTEMPTS):
            actual = None if current is None else current.target
            if actual != expected:
                raise RefConflictError(name, expected, actual)
            if current is None:
                self._check_no_path_conflict(name)
            else:
                persist_entry(self.backend, name, current.entry)
            seq = 1 if current is None else current.seq + 1
            entry = ReflogEntry(seq, expected, new, operation_id, reason, at)
            raw = canonical_json({"target": new, "seq": seq, "entry": entry.to_dict()})
            key = ref_key(name)
            if current is None:
                version = self.backend.put_if_absent(key, raw)
            else:
                version = self.backend.put_if_match(key, raw, current.version)
            if version is None:
                again = self.read_document(name)
                if again is not None and again.raw == raw:
                    version = again.version  # our own write, acknowledged late (a retry)
                else:
                    # Lost a race. If the ref still (or again) points at `expected`, the
                    # compare part still holds: try once more from the new document.
                    current = again
                    continue
            persist_entry(self.backend, name, entry)
            return RefDocument(name, new, seq, entry, raw, version)
        raise RefConflictError(name, expected, None if current is None else current.target)

    def _check_no_path_conflict(self, name: str) -> None:
        """Refuse `a/b` while `a` exists and vice versa (as git does; files vs directories)."""
        kind, _, rest = name.partition("/")
        parts = rest.split("/")
        for i in range(1, len(parts)):
            other = f"{kind}/{'/'.join(parts[:i])}"
            if self.backend.stat(ref_key(other)) is not None:
                raise InvalidNameError(name, f"it conflicts with existing ref {other}")
        for info in self.backend.list(ref_key(name) + "/"):
            other = info.key[len(REFS_PREFIX) :]
            raise InvalidNameError(name, f"it conflicts with existing ref {other}")

    def list(self, prefix: str = "") -> dict[str, RefValue]:
        """Live refs whose full name starts with `prefix` (e.g. ``heads/``), sorted by name."""
        return {
            doc.name: RefValue(doc.target, doc.seq)
            for doc in self.list_documents(prefix)
            if doc.target is not None
        }

    def list_documents(self, prefix: str = "") -> builtins.list[RefDocument]:
        """Every ref document (tombstones included) under `prefix`, sorted by name."""
        if "\0" in prefix or ".." in prefix or prefix.startswith("/"):
            raise InvalidNameError(prefix, "a ref prefix is like 'heads/' or 'tags/rel'")
        if prefix.startswith(REFS_PREFIX):
            prefix = prefix[len(REFS_PREFIX) :]
        docs = []
        for info in self.backend.list(REFS_PREFIX + prefix):
            name = info.key[len(REFS_PREFIX) :]
            try:
                check_ref_name(name)
            except InvalidNameError:
                continue  # not a ref (foreign file); fsck reports it
            blob = self.backend.get(info.key)
            if blob is not None:
                docs.append(parse_ref_document(name, blob.data, blob.version))
        return sorted(docs, key=lambda d: d.name)
