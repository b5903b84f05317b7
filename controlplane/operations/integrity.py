"""Integrity first: an operation that goes back to a snapshot (rollback) verifies that the
snapshot restores exactly as committed — its manifest and every chunk of its state read back and
checked against their hashes — before it moves anything, and offers the newest intact snapshot
of the branch when it does not (``to: "newest-intact"`` picks it)."""

from __future__ import annotations

from controlplane.errors import OperationFailed, UnusableRequest
from snapshots_store import Repository, check_snapshot, newest_intact_on_branch

#: The `to` of a rollback that means "the newest snapshot of the branch that is intact".
NEWEST_INTACT = "newest-intact"


def newest_intact(repo: Repository, branch: str, *, field: str = "to") -> str:
    sid = newest_intact_on_branch(repo, branch)
    if sid is None:
        raise UnusableRequest(
            f"branch {branch!r} has no intact snapshot to go back to (run `epochal fsck` to "
            "see the damage); restore the store from a backup",
            fields={field: ["no intact snapshot on the branch"]},
            code="no_intact_snapshot",
        )
    return sid


def damage(repo: Repository, snapshot_id: str, branch: str) -> tuple[str, dict[str, object]] | None:
    """(message, detail) when `snapshot_id` cannot be restored; None when it is intact."""
    problems = check_snapshot(repo, snapshot_id)
    if not problems:
        return None
    intact = newest_intact_on_branch(repo, branch)
    offer = (
        f"roll back to the newest intact snapshot {intact} (or `to: {NEWEST_INTACT}`)"
        if intact is not None
        else "no snapshot of the branch is intact: restore the store from a backup"
    )
    message = f"snapshot {snapshot_id} is damaged: {problems[0].message}; {offer}"
    detail = {"problems": [p.to_dict() for p in problems], "newest_intact": intact}
    return message, detail


def require_intact(repo: Repository, snapshot_id: str, branch: str, *, field: str = "to") -> None:
    """Refuse the request (422, nothing recorded) when `snapshot_id` is damaged."""
    found = damage(repo, snapshot_id, branch)
    if found is not None:
        raise UnusableRequest(found[0], fields={field: ["damaged snapshot"]},
                              detail=found[1], code="damaged_snapshot")  # fmt: skip


def verify_before_moving(repo: Repository, snapshot_id: str, branch: str) -> None:
    """The same check inside the operation, right before it moves the branch (the store may
    have been damaged since the request): the operation fails with the reason."""
    found = damage(repo, snapshot_id, branch)
    if found is not None:
        raise OperationFailed(found[0], detail=found[1], code="damaged_snapshot")
