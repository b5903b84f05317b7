"""Domain exceptions of the snapshot store.

Every message names the object, ref, revision or field at fault and says what to do next.
The control plane maps these classes to HTTP status codes in one place.
"""

from __future__ import annotations

FSCK_HINT = "run `python -m snapshots_store --store URL --namespace NS fsck`"


def _short(object_id: str | None) -> str:
    return "nothing" if object_id is None else object_id


class StoreError(Exception):
    """Base class of every error raised by `snapshots_store`."""


class ObjectNotFoundError(StoreError):
    """An object that should exist is not in the store."""

    def __init__(self, object_id: str, context: str = "") -> None:
        self.object_id = object_id
        self.context = context
        where = f" ({context})" if context else ""
        super().__init__(
            f"object {object_id}{where} is missing from the store; "
            f"if a ref or manifest points at it the store is damaged: {FSCK_HINT}"
        )


class CorruptObjectError(StoreError):
    """Stored bytes do not decode to the object they are named after; never returned."""

    def __init__(self, object_id: str, detail: str) -> None:
        self.object_id = object_id
        self.detail = detail
        super().__init__(
            f"object {object_id} is corrupt: {detail}; restore it from a replica "
            f"or rewrite it from its source, then {FSCK_HINT}"
        )


class MalformedManifestError(StoreError):
    """A manifest (bytes or constructor arguments) violates the format."""

    def __init__(self, field: str, detail: str, snapshot_id: str | None = None) -> None:
        self.field = field
        self.detail = detail
        self.snapshot_id = snapshot_id
        which = f"manifest {snapshot_id}" if snapshot_id else "manifest"
        super().__init__(
            f"{which}: field `{field}` {detail} (see docs/store-format.md, section Manifest)"
        )


class RefNotFoundError(StoreError):
    """The named ref does not exist (or was deleted)."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(
            f"ref {name} does not exist; list refs with "
            f"`python -m snapshots_store --store URL --namespace NS refs`"
        )


class RefConflictError(StoreError):
    """A compare-and-swap found a different current value than the caller expected."""

    def __init__(self, name: str, expected: str | None, actual: str | None) -> None:
        self.name = name
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"ref {name} was expected at {_short(expected)} but is at {_short(actual)}; "
            f"another writer moved it: re-read the ref and decide again"
        )


class BranchConflictError(RefConflictError):
    """The branch is not where an operation needs it; the message says what to do."""

    def __init__(self, name: str, expected: str | None, actual: str | None, advice: str) -> None:
        super().__init__(name, expected, actual)
        self.args = (advice,)


class ControlConflictError(RefConflictError):
    """The control document changed since the caller read it (its version token differs)."""

    def __init__(self, branch: str, expected: str | None, actual: str | None) -> None:
        super().__init__(f"control/{branch}", expected, actual)
        self.args = (
            f"control document of branch {branch} was expected at version "
            f"{_short(expected)} but is at {_short(actual)}; re-read it and apply the "
            f"change again",
        )


class InvalidNameError(StoreError):
    """A ref, branch, tag, namespace, object id or storage key is not acceptable."""

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        self.reason = reason
        super().__init__(f"invalid name {name!r}: {reason}")


class UnknownRevisionError(StoreError):
    """A revision string does not resolve to exactly one snapshot."""

    def __init__(self, rev: str, detail: str) -> None:
        self.rev = rev
        self.detail = detail
        super().__init__(
            f"unknown revision {rev!r}: {detail}; use a snapshot id, a unique id prefix "
            f"of at least 8 hex digits, heads/<branch>, tags/<tag> or a branch name"
        )


class InvalidRevisionError(UnknownRevisionError):
    """A text that is no revision at all (`snapshots_store.revisions`), refused before I/O."""

    def __init__(self, rev: str, detail: str) -> None:
        self.rev = rev
        self.detail = detail
        StoreError.__init__(
            self,
            f"not a revision {rev[:100]!r}: {detail}; a revision is a snapshot id, a unique id "
            "prefix of at least 8 hex digits, heads/<branch>, tags/<tag> or a branch name, "
            "followed by any ~N (N-th first parent) or ^N (N-th parent)",
        )


class StoreConfigError(StoreError):
    """The store URL, backend or server cannot give the guarantees the store needs."""


class StoreUnavailableError(StoreError):
    """The store's server kept failing (errors, throttling, resets, timeouts) for longer than
    the retry budget allows. Nothing half-written is visible: the caller may retry later."""

    def __init__(self, store: str, action: str, attempts: int, elapsed_s: float, last: str):
        self.store = store
        self.action = action
        self.attempts = attempts
        self.elapsed_s = elapsed_s
        super().__init__(
            f"store {store} unavailable: {action} failed {attempts} times in {elapsed_s:.1f} s "
            f"(last: {last}); check the store's health, then restart — committed snapshots "
            f"are intact"
        )


class StoreFullError(StoreUnavailableError):
    """The store's filesystem has no space (or quota) left for a write: nothing half-written
    stays (the temp file is removed) and committed snapshots are intact."""

    def __init__(self, store: str, key: str, detail: str) -> None:
        self.store = store
        self.action = f"write of {key}"
        self.attempts = 1
        self.elapsed_s = 0.0
        StoreError.__init__(
            self,
            f"store {store} full: writing {key} failed ({detail}); free space or grow the "
            f"volume, then restart — committed snapshots are intact",
        )
