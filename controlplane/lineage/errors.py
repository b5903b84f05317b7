"""Domain errors of the lineage index; the API layer maps them to HTTP status codes once."""

from __future__ import annotations


class LineageError(Exception):
    """Base class: a lineage request that cannot be answered as asked."""


class UnknownRevisionError(LineageError):
    """A snapshot id, branch or tag that the index does not know (for this application)."""

    def __init__(self, application: str, rev: str, hint: str = "") -> None:
        self.application = application
        self.rev = rev
        if not hint and ("~" in rev or "^" in rev):
            hint = (
                "a step may go back past the root or name a parent the snapshot lacks: "
                f"`epochal store --application {application} resolve '{rev}'` says where it "
                "stops; or the snapshot is not indexed yet (`manage.py reindex`)"
            )
        hint = hint or "it may not be indexed yet: run `manage.py reindex --application NAME`"
        super().__init__(
            f"application {application!r} has no snapshot, branch or tag {rev!r}; {hint}"
        )


class MissingParentError(LineageError):
    """A manifest was offered for indexing before one of its parents."""

    def __init__(self, application: str, snapshot_id: str, parent_id: str) -> None:
        self.snapshot_id = snapshot_id
        self.parent_id = parent_id
        super().__init__(
            f"cannot index snapshot {snapshot_id} of {application!r}: its parent {parent_id} is "
            "not indexed; index parents first or run `manage.py reindex`"
        )


class InvalidCursorError(LineageError):
    def __init__(self, cursor: str) -> None:
        self.cursor = cursor
        super().__init__(
            f"cursor {cursor!r} is not one this API handed out; start again without a cursor"
        )


class InvalidRefError(LineageError):
    def __init__(self, ref: str) -> None:
        self.ref = ref
        super().__init__(f"{ref!r} is not a ref name: use heads/<branch> or tags/<tag>")


class InvalidSnapshotError(LineageError):
    """A snapshot id that is not the content address of the manifest offered with it."""

    def __init__(self, snapshot_id: str, expected: str) -> None:
        self.snapshot_id = snapshot_id
        super().__init__(
            f"{snapshot_id!r} is not the id of this manifest (its content hashes to {expected}); "
            "index manifests as read from the store"
        )
